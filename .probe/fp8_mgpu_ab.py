"""FP8-activation products on Mosaic GPU (`kernels.gmm_fp8_mgpu`, implementation="mosaic_gpu")
against Triton's (`kernels.gmm_quant` with lhs_scales, "pallas_triton") and our bf16 layer ("auto"),
the SwiGLU-256 layer forward in one process, medians of 3 alternating rounds, ms; outputs
compared (the same quantised products: within float32 summation order and bf16 rounding). Also
the ring one slot shorter (GLU 2, plain 3). T = 2048 / 4096 / 8192 (64 / 128 / 256 rows per
expert). Usage: python .probe/fp8_mgpu_ab.py OUT.json [--small] [--tokens T,T,...]"""
import dataclasses, json, sys, time
import numpy as np
import moe_pallas
from moe_pallas.kernels import gmm_fp8_mgpu as K
from benchmarks import cases as C, impls, run as R


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


out_path = sys.argv[1]
small = "--small" in sys.argv
W = (C.SMALL_WORKLOADS if small else C.WORKLOADS)["swiglu256"]
if small:  # K and N multiples of 128
    W = dataclasses.replace(W, hidden=256, inter=128)
params = C.make_params(W)
stored = {f: moe_pallas.quantize_experts(params, f, fp8_activations=True) for f in ("fp8", "fp8_block")}
TOKENS = (64,) if small else (2048, 4096, 8192)
if "--tokens" in sys.argv:
    TOKENS = tuple(int(t) for t in sys.argv[sys.argv.index("--tokens") + 1].split(","))
default = K.default_config
shorter = lambda act: dataclasses.replace(default(act), num_stages=default(act).num_stages - 1)
res = []
for T in TOKENS:
    case = C.Case("decode", W, T, "fwd")
    inputs = R._inputs(case, params)
    t0 = time.time()
    preps = {"bf16": impls._ours("pallas_triton" if small else "auto")(case, inputs)}
    for fmt, p in stored.items():
        preps[f"{fmt}_a8 triton"] = impls._ours("pallas_triton")(case, {**inputs, "params": p})
        try:
            preps[f"{fmt}_a8 mgpu"] = impls._ours("mosaic_gpu")(case, {**inputs, "params": p})
            K.default_config = shorter
            preps[f"{fmt}_a8 mgpu-1"] = impls._ours("mosaic_gpu")(case, {**inputs, "params": p})
        except Exception as err:
            print(fmt, type(err).__name__, str(err)[:400], flush=True)
        finally:
            K.default_config = default
    outs = {}
    for k, p in list(preps.items()):
        try:
            outs[k] = np.asarray(p.wait(p.call()), np.float32)
        except Exception as err:
            print(k, type(err).__name__, str(err)[:400], flush=True)
            del preps[k]
    times = {k: [] for k in preps}
    for _ in range(3):
        for k, p in preps.items():
            times[k].append(R.measure(p, 0.2)[0] * 1e3)
    row = {"case": case.name, **{k: round(sorted(v)[1], 4) for k, v in times.items()},
           "vs_triton": {k: rel(outs[k], outs[k.split()[0] + " triton"]) for k in outs if "mgpu" in k},
           "s": round(time.time() - t0, 1)}
    print(json.dumps(row), flush=True)
    res.append(row)
    json.dump(res, open(out_path, "w"), indent=1)
    del preps, outs
