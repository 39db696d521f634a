"""fp8 gmm_quant with the operands swapped (acc^T = w16 @ x^T: the converted weights are
wgmma's register A operand) against the current order, on the layer's calls (autotune_gmm)."""
import functools, json, os, sys, time
import jax
from benchmarks import autotune_gmm as A
from benchmarks.bench_gmm import time_op
from moe_pallas.kernels import gmm_quant as GQ
C = A.C
PLAN = {
    "tiny": {"gmm_glu": [(C(16, 64, 128, 8, 4, 3), (0, 1)), (C(16, 32, 256, 8, 4, 4), (0, 1))]},
    "small": {
        "gmm": [(C(128, 128, 64, 8, 8, 4, min_block_m=64), (0, 1)), (C(128, 256, 64, 8, 8, 4, min_block_m=16), (1,)), (C(128, 128, 64, 8, 8, 3), (1,))],
        "gmm_glu": [(C(64, 64, 64, 8, 4, 4), (0, 1)), (C(128, 128, 64, 8, 8, 4, min_block_m=64), (1,)), (C(128, 64, 64, 8, 8, 4), (1,))],
    },
    "large": {
        "gmm": [(C(128, 128, 64, 8, 8, 4, min_block_m=64), (0, 1)), (C(128, 256, 64, 8, 8, 4, min_block_m=64), (1,))],
        "gmm_glu": [(C(128, 64, 64, 8, 8, 4, min_block_m=64), (0, 1)), (C(128, 128, 64, 8, 8, 3, min_block_m=16), (1,))],
    },
}
orig = GQ.gmm_quant
out = []
for cls, kernels in PLAN.items():
    probs = {}
    for w in ("gptoss", "swiglu256"):
        t = A.TOKENS[cls]; t = t[w] if isinstance(t, dict) else t
        probs[w] = A._problem(w, t, weights="fp8")
    for kernel, cands in kernels.items():
        for cfg, swaps in cands:
            for sw in swaps:
                A.gmm_quant = functools.partial(orig, swap=bool(sw))
                try:
                    ms = {w: sum(time_op(op, c, *a, target_s=0.05) * 1e3 for op, c, a in A._calls(kernel, cfg, p)) for w, p in probs.items()}
                except Exception as e:
                    ms = {"error": str(e)[:200]}
                rec = dict(cls=cls, kernel=kernel, swap=sw, cfg=[cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_warps, cfg.num_stages, cfg.min_block_m], ms=ms)
                print(json.dumps(rec), flush=True); out.append(rec)
    del probs
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "swap.json"), "w"), indent=1)
