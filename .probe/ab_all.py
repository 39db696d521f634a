"""Every pending A/B of #33 in one process per workload, the layer side by side with bf16 (medians
of 3 alternating rounds per case), variants as patches applied while a variant compiles:
  wfirst    the table's configs with BlockConfig.weights_first (64+-row paths as accᵀ = w · xᵀ; 9e16204)
  fold_off  fp8_block's block scale on the float32 partial dot instead of folded (36a749a)
  two_mul   mxfp4 with two scale multiplies a pair instead of one (small_scales=False; b7a3216)
  n16       quantised calls narrowed to 16-column tiles at small grids (probe f6062d2)
  bytes     fp8 decode-sized tiles on bytes instead of byte pairs (PAIRED_MAX_ROWS = 0; 39e7e12)
  instep    mxfp4's 16/32-row tiles loading their scales in the step, the decode then in the dot
            operand's registers (MX_SCALES_AHEAD_MAX_ROWS = 0)
  fp8_a8, fp8_block_a8   the weights with fp8_activations (3ac8043): 1 x 128 e4m3 activations,
            fp8 wgmma on 64+-row tiles, float16 dots of the paired view at decode sizes (its
            vs_product: against the same format's bf16-activation output, the quantisation)
Usage: python .probe/ab_all.py gptoss|swiglu256 OUT.json  (a few minutes each)"""
import dataclasses, json, sys, time
import numpy as np
import moe_pallas
from moe_pallas import quant
from moe_pallas.backends import pallas_triton as pt
from moe_pallas.kernels import gmm_quant as gq
from benchmarks import cases as C, impls, run as R

CONFIG = pt.config
PATCHES = {  # name -> (object, attribute, value while compiling)
    "wfirst": (pt, "config", lambda *a, **kw: dataclasses.replace(CONFIG(*a, **kw), weights_first=True)),
    "fold_off": (gq, "FOLD_MIN_ROWS", 2**30),
    "n16": (pt, "min_block_n", lambda kernel, activation=None: 16),
    "bytes": (gq, "PAIRED_MAX_ROWS", 0),
    "instep": (gq, "MX_SCALES_AHEAD_MAX_ROWS", 0),
}
PLAN = {
    "decode1": ["fp8", "fp8|n16", "fp8|bytes", "fp8_block", "fp8_block|n16", "mxfp4", "mxfp4|n16",
                "mxfp4|two_mul"],
    "decode": ["fp8", "fp8|bytes", "fp8_block", "fp8_block|bytes", "mxfp4", "mxfp4|two_mul",
               "mxfp4|instep", "fp8_a8", "fp8_block_a8"],
    "rows64": ["fp8", "fp8|wfirst", "fp8_block", "fp8_block|fold_off", "fp8_block|wfirst", "mxfp4", "mxfp4|wfirst",
               "mxfp4|two_mul", "fp8_a8", "fp8_block_a8"],
}
TOKENS = {"gptoss": {1: "decode1", 16: "decode", 256: "decode", 2048: "rows64", 16384: "rows64"},
          "swiglu256": {1: "decode1", 64: "decode", 256: "decode", 2048: "rows64", 8192: "rows64"}}


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


wl, out_path = sys.argv[1], sys.argv[2]
params = C.make_params(C.WORKLOADS[wl])
stored = {f: moe_pallas.quantize_experts(params, f) for f in ("fp8", "fp8_block", "mxfp4")}
print(wl, "mxfp4 small_scales", [v.small_scales for v in stored["mxfp4"].values()
                                 if quant.is_quantized(v)], flush=True)
stored |= {f + "_a8": moe_pallas.use_fp8_activations(stored[f]) for f in ("fp8", "fp8_block")}
two_mul = {k: dataclasses.replace(v, small_scales=False) if quant.is_quantized(v) else v
           for k, v in stored["mxfp4"].items()}
res = []
for T, plan in TOKENS[wl].items():
    case = C.Case("decode", C.WORKLOADS[wl], T, "fwd")
    inputs = R._inputs(case, params)
    t0 = time.time()
    preps = {"bf16": impls._ours("auto")(case, inputs)}
    for variant in PLAN[plan]:
        fmt, _, patch = variant.partition("|")
        q = two_mul if patch == "two_mul" else stored[fmt]
        target = PATCHES.get(patch)
        if target:
            saved = getattr(target[0], target[1])
            setattr(target[0], target[1], target[2])
        try:
            preps[variant] = impls._ours("auto")(case, {**inputs, "params": q})
        finally:
            if target:
                setattr(target[0], target[1], saved)
    outs = {k: np.asarray(p.wait(p.call()), np.float32) for k, p in preps.items()}
    times = {k: [] for k in preps}
    for _ in range(3):
        for k, p in preps.items():
            times[k].append(R.measure(p, 0.2)[0] * 1e3)
    row = {"case": case.name, **{k: round(sorted(v)[1], 4) for k, v in times.items()},
           "vs_product": {k: rel(outs[k], outs[k.split("|")[0].removesuffix("_a8")])
                          for k in preps if "|" in k or k.endswith("_a8")},
           "s": round(time.time() - t0, 1)}
    print(json.dumps(row), flush=True)
    res.append(row)
    json.dump(res, open(out_path, "w"), indent=1)
    del preps, outs
