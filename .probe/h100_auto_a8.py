"""On an H100: "auto" takes SwiGLU-256's FP8-activation products to Mosaic GPU now that the
H100's table holds the entries measured there. The SwiGLU-256 layer forward, fp8 weights with FP8
activations under "auto" and "mosaic_gpu", bf16 under "auto", one process, medians of 3
alternating rounds, ms; outputs compared. Usage: python .probe/h100_auto_a8.py OUT.json"""
import json, sys, time
import jax
import numpy as np
import moe_pallas
from moe_pallas import backends
from benchmarks import cases as C, impls, run as R

picked = []
orig = backends.select
backends.select = lambda policy, problem: picked.append((policy, problem.kernel, problem.fp8_activations, (b := orig(policy, problem)).name)) or b
print(jax.devices()[0].device_kind, flush=True)
W = C.WORKLOADS["swiglu256"]
params = C.make_params(W)
stored = moe_pallas.quantize_experts(params, "fp8", fp8_activations=True)
res = []
for T in (2048, 8192):
    case = C.Case("decode", W, T, "fwd")
    inputs = R._inputs(case, params)
    picked.clear()
    preps = {"bf16 auto": impls._ours("auto")(case, inputs),
             "fp8_a8 auto": impls._ours("auto")(case, {**inputs, "params": stored}),
             "fp8_a8 mgpu": impls._ours("mosaic_gpu")(case, {**inputs, "params": stored})}
    outs = {k: np.asarray(p.wait(p.call()), np.float32) for k, p in preps.items()}
    times = {k: [] for k in preps}
    for _ in range(3):
        for k, p in preps.items():
            times[k].append(R.measure(p, 0.2)[0] * 1e3)
    a, b = outs["fp8_a8 auto"].astype(np.float64), outs["fp8_a8 mgpu"].astype(np.float64)
    row = {"case": case.name, **{k: round(sorted(v)[1], 4) for k, v in times.items()},
           "auto_vs_mgpu": float(np.linalg.norm(a - b) / np.linalg.norm(b)),
           "picked": sorted({str(p) for p in picked})}
    print(json.dumps(row), flush=True)
    res.append(row)
    json.dump(res, open(sys.argv[1], "w"), indent=1)
