"""The byte-pair view with x's columns reordered (two half-depth dots) against unpaired reads
(E = 128 SwiGLU, gate_up 2^31 bytes), and SwiGLU-256 / gpt-oss fp8 and fp8_block at decode sizes."""
import json, sys
import jax, numpy as np
import moe_pallas
from benchmarks import cases as C, impls, run as R
from moe_pallas.kernels import gmm_quant as gq

def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))

def timed(preps):
    outs = {k: np.asarray(p.wait(p.call())) for k, p in preps.items()}
    times = {k: [] for k in preps}
    for _ in range(3):
        for k, p in preps.items():
            times[k].append(R.measure(p, 0.2)[0] * 1e3)
    return {k: sorted(v)[1] for k, v in times.items()}, outs

res = []
wl = C.Workload("swiglu128", 4096, 2048, 128, 8, "swiglu", False, "softmax_topk")
params = C.make_params(wl)
qp = jax.jit(lambda p: moe_pallas.quantize_experts(p, "fp8"))(params)
for T in (16, 64, 256):
    case = C.Case("decode", wl, T, "fwd")
    inputs = R._inputs(case, params)
    preps = {"bf16": impls._ours("auto")(case, inputs)}
    for paired in (False, True):
        gq.PAIRED_MIN_ELEMENTS = 0 if paired else 2**31 + 1
        preps[f"fp8_{'paired' if paired else 'unpaired'}"] = impls._ours("auto")(case, {**inputs, "params": qp})
    ms, outs = timed(preps)
    row = {"case": "E128/" + case.name, "ms": ms, "paired_vs_unpaired_rel": rel(outs["fp8_paired"], outs["fp8_unpaired"])}
    print(json.dumps(row), flush=True); res.append(row)
gq.PAIRED_MIN_ELEMENTS = 2**31 + 1
del params, qp, preps
for name in ("swiglu256", "gptoss"):
    params = C.make_params(C.WORKLOADS[name])
    qp = {f: jax.jit(lambda p, f=f: moe_pallas.quantize_experts(p, f))(params) for f in ("fp8", "fp8_block")}
    dense = moe_pallas.dequantize_experts(qp["fp8"])
    for T in (1, 16, 64, 256, 2048):
        case = C.Case("decode", C.WORKLOADS[name], T, "fwd")
        inputs = R._inputs(case, params)
        preps = {"bf16": impls._ours("auto")(case, inputs),
                 **{f: impls._ours("auto")(case, {**inputs, "params": qp[f]}) for f in qp}}
        ms, outs = timed(preps)
        ref = impls._ours("auto")(case, {**inputs, "params": dense})
        err = rel(outs["fp8"], np.asarray(ref.wait(ref.call())))
        row = {"case": case.name, "ms": ms, "fp8_vs_dense_rel": err}
        print(json.dumps(row), flush=True); res.append(row)
        del preps, ref
    del params, qp, dense
json.dump(res, open(sys.argv[1], "w"), indent=1)
