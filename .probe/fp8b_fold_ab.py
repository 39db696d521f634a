"""fp8_block: the block scale folded into the float16 weights on >= 64-row tiles (36a749a) against
each K step's partial dot scaled in float32 (FOLD_MIN_ROWS = huge), side by side, medians of 3
alternating rounds; bf16 and per-channel fp8 for reference. Usage: python .probe/fp8b_fold_ab.py OUT.json"""
import json, sys, time
import jax, numpy as np
import moe_pallas
from moe_pallas.kernels import gmm_quant as gq
from benchmarks import cases as C, impls, run as R

OFF = 2**30
def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))

res = []
for wl in ("swiglu256", "gptoss"):
    params = C.make_params(C.WORKLOADS[wl])
    qb = jax.jit(lambda p: moe_pallas.quantize_experts(p, "fp8_block"))(params)
    q8 = jax.jit(lambda p: moe_pallas.quantize_experts(p, "fp8"))(params)
    for T in ((256, 2048, 4096, 8192) if wl == "swiglu256" else (256, 2048, 4096, 16384)):
        case = C.Case("decode", C.WORKLOADS[wl], T, "fwd")
        inputs = R._inputs(case, params)
        t0 = time.time()
        preps = {"bf16": impls._ours("auto")(case, inputs),
                 "fp8": impls._ours("auto")(case, {**inputs, "params": q8})}
        gq.FOLD_MIN_ROWS = OFF
        preps["blk_off"] = impls._ours("auto")(case, {**inputs, "params": qb})
        gq.FOLD_MIN_ROWS = 64
        preps["blk_fold"] = impls._ours("auto")(case, {**inputs, "params": qb})
        outs = {k: np.asarray(p.wait(p.call()), np.float32) for k, p in preps.items()}
        times = {k: [] for k in preps}
        for _ in range(3):
            for k, p in preps.items():
                times[k].append(R.measure(p, 0.2)[0] * 1e3)
        row = {"case": case.name, **{k: round(sorted(v)[1], 4) for k, v in times.items()},
               "fold_vs_off": rel(outs["blk_fold"], outs["blk_off"]),
               "off_vs_bf16": rel(outs["blk_off"], outs["bf16"]),
               "fold_vs_bf16": rel(outs["blk_fold"], outs["bf16"]), "s": round(time.time() - t0, 1)}
        print(json.dumps(row), flush=True); res.append(row)
        del preps, outs
    del params, qb, q8
json.dump(res, open(sys.argv[1], "w"), indent=1)
