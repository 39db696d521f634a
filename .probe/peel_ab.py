"""fp8 weights' K tail peeled (gpt-oss's K = 2880 is 11.25 steps of the tiny entries' 256: the
masked last step does a full step's work for a quarter of its values) against the masked last
step: `.probe/gmm_quant_peeled.py` (the main loop unmasked, the tail's tiles loaded before it and
multiplied after it, where the tail is a power of two of at least 32 values) patched into the
pallas_triton backend, the layer in one process, fp8 and fp8_block weights, decode sizes,
medians of 3 alternating rounds, ms; outputs compared (the same products in the same order).
Usage: python .probe/peel_ab.py gptoss|swiglu256 OUT.json [--small]"""
import importlib.util, json, os, sys, time
import numpy as np
import moe_pallas
from moe_pallas.backends import pallas_triton as pt
from benchmarks import cases as C, impls, run as R

spec = importlib.util.spec_from_file_location(
    "gmm_quant_peeled", os.path.join(os.path.dirname(__file__), "gmm_quant_peeled.py"))
peeled = importlib.util.module_from_spec(spec)
spec.loader.exec_module(peeled)


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


wl, out_path = sys.argv[1], sys.argv[2]
small = "--small" in sys.argv
BACKEND = "pallas_triton" if small else "auto"  # (off a GPU: interpret mode)
W = (C.SMALL_WORKLOADS if small else C.WORKLOADS)[wl]
params = C.make_params(W)
stored = {f: moe_pallas.quantize_experts(params, f) for f in ("fp8", "fp8_block")}
res = []
for T in ((16,) if small else (1, 16, 64, 256, 2048)):
    case = C.Case("decode", W, T, "fwd")
    inputs = R._inputs(case, params)
    t0 = time.time()
    preps = {"bf16": impls._ours(BACKEND)(case, inputs)}
    for fmt in stored:
        preps[fmt] = impls._ours(BACKEND)(case, {**inputs, "params": stored[fmt]})
        saved, pt._gmm_quant = pt._gmm_quant, peeled.gmm_quant
        try:
            preps[fmt + "|peeled"] = impls._ours(BACKEND)(case, {**inputs, "params": stored[fmt]})
        finally:
            pt._gmm_quant = saved
    outs = {k: np.asarray(p.wait(p.call()), np.float32) for k, p in preps.items()}
    times = {k: [] for k in preps}
    for _ in range(3):
        for k, p in preps.items():
            times[k].append(R.measure(p, 0.2)[0] * 1e3)
    row = {"case": case.name, **{k: round(sorted(v)[1], 4) for k, v in times.items()},
           "vs_masked": {k: rel(outs[k + "|peeled"], outs[k]) for k in stored},
           "s": round(time.time() - t0, 1)}
    print(json.dumps(row), flush=True)
    res.append(row)
    json.dump(res, open(out_path, "w"), indent=1)
    del preps, outs
