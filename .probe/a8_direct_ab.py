"""FP8 activations' weight tiles straight from the pipelined buffer to wgmma (unmasked fp8
loads: block_n divides N, the K tail its own step) against the byte tiles staged through
registers (the kernel before, `gmm_quant` at its parent commit, loaded from git), the layer in
one process per workload, medians of 3 alternating rounds, ms; outputs compared (the same
products: within float32 summation order). Cases at 64 rows per expert and the largest T.
Usage: python .probe/a8_direct_ab.py gptoss|swiglu256 OUT.json [--small]
(.probe/gmm_quant_bytes.py: `git show <parent>:moe_pallas/kernels/gmm_quant.py`)"""
import importlib.util, json, os, sys, time
import numpy as np
import moe_pallas
from moe_pallas.backends import pallas_triton as pt
from moe_pallas.kernels.config import BlockConfig
from benchmarks import cases as C, impls, run as R

path = os.path.join(os.path.dirname(__file__), "gmm_quant_bytes.py")
spec = importlib.util.spec_from_file_location("gmm_quant_bytes", path)
old = importlib.util.module_from_spec(spec)
spec.loader.exec_module(old)


# Tiles by programs an SM (offline SASS, as loaded): 64 x 64 x 128 at 4 warps 3-4, 128 x 64 at 8
# warps 2, against the table's 64 x 128 (2) and 128 x 128 (1).
TILES = {
    "t64x64": BlockConfig(64, 64, 128, 8, 4, 3, min_block_m=16),
    "t128x64": BlockConfig(128, 64, 128, 8, 8, 3, min_block_m=64),
}


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


wl, out_path = sys.argv[1], sys.argv[2]
small = "--small" in sys.argv
BACKEND = "pallas_triton" if small else "auto"  # (off a GPU: interpret mode)
W = (C.SMALL_WORKLOADS if small else C.WORKLOADS)[wl]
params = C.make_params(W)
stored = {}
for f in ("fp8", "fp8_block"):
    stored[f + "_a8"] = moe_pallas.use_fp8_activations(moe_pallas.quantize_experts(params, f))
TOKENS = (64,) if small else {"gptoss": (2048, 4096, 16384), "swiglu256": (2048, 8192)}[wl]
res = []
for T in TOKENS:
    case = C.Case("decode", W, T, "fwd")
    inputs = R._inputs(case, params)
    t0 = time.time()
    preps = {"bf16": impls._ours(BACKEND)(case, inputs)}
    for fmt in stored:
        preps[fmt] = impls._ours(BACKEND)(case, {**inputs, "params": stored[fmt]})
        saved, pt._gmm_quant = pt._gmm_quant, old.gmm_quant
        try:
            preps[fmt + "|bytes"] = impls._ours(BACKEND)(case, {**inputs, "params": stored[fmt]})
        finally:
            pt._gmm_quant = saved
        for name, tile in TILES.items():  # the forward's fp8 calls on one tile (occupancy)
            config = pt.config
            pt.config = lambda kernel, dtype, *a, tile=tile, **kw: (
                tile if kernel in ("gmm", "gmm_glu") and str(dtype) == "float8_e4m3fn"
                else config(kernel, dtype, *a, **kw))
            try:
                preps[fmt + "|" + name] = impls._ours(BACKEND)(case, {**inputs, "params": stored[fmt]})
            finally:
                pt.config = config
    outs = {k: np.asarray(p.wait(p.call()), np.float32) for k, p in preps.items()}
    times = {k: [] for k in preps}
    for _ in range(3):
        for k, p in preps.items():
            times[k].append(R.measure(p, 0.2)[0] * 1e3)
    row = {"case": case.name, **{k: round(sorted(v)[1], 4) for k, v in times.items()},
           "vs_bytes": {k: rel(outs[k], outs[k + "|bytes"]) for k in stored},
           "vs_tiles": {k: rel(outs[k], outs[k.split("|")[0]]) for k in outs if "|t" in k},
           "s": round(time.time() - t0, 1)}
    print(json.dumps(row), flush=True)
    res.append(row)
    json.dump(res, open(out_path, "w"), indent=1)
    del preps, outs
