"""fp8_block scales a step ahead (on/off) against fp8 and bf16 at decode sizes; and the SwiGLU
fp8 gate_up byte-pair view's cost (E = 128: 2^31 bytes, read unpaired or forced paired)."""
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

small = "--small" in sys.argv
W = C.WORKLOADS
if small:
    W = {"gptoss": C.Workload("gptoss", 256, 128, 8, 2, "gptoss", True, "topk_softmax"),
         "swiglu256": C.Workload("swiglu256", 256, 128, 16, 4, "swiglu", False, "softmax_topk")}
res = []
for wl in ("gptoss", "swiglu256"):
    params = C.make_params(W[wl])
    qp = {f: jax.jit(lambda p, f=f: moe_pallas.quantize_experts(p, f))(params) for f in ("fp8", "fp8_block")}
    for T in (16,) if small else (16, 64, 256):
        case = C.Case("decode", W[wl], T, "fwd")
        inputs = R._inputs(case, params)
        preps = {"bf16": impls._ours("auto")(case, inputs),
                 "fp8": impls._ours("auto")(case, {**inputs, "params": qp["fp8"]})}
        for on in (True, False):
            gq.FP8B_AHEAD = on
            preps[f"fp8_block_{'ahead' if on else 'instep'}"] = impls._ours("auto")(case, {**inputs, "params": qp["fp8_block"]})
        ms, outs = timed(preps)
        row = {"case": case.name, "ms": ms, "ahead_eq_instep": bool(np.array_equal(outs["fp8_block_ahead"], outs["fp8_block_instep"]))}
        print(json.dumps(row), flush=True); res.append(row)
        del preps
    del params, qp
gq.FP8B_AHEAD = True
wl = C.Workload("swiglu128", 4096, 2048, 128, 8, "swiglu", False, "softmax_topk") if not small else W["swiglu256"]
params = C.make_params(wl)
qp = jax.jit(lambda p: moe_pallas.quantize_experts(p, "fp8"))(params)
for T in (16,) if small else (16, 64, 256):
    case = C.Case("decode", wl, T, "fwd")
    inputs = R._inputs(case, params)
    preps = {"bf16": impls._ours("auto")(case, inputs)}
    for paired in (False, True):
        gq.PAIRED_MIN_ELEMENTS = 0 if paired else 2**31 + 1
        preps[f"fp8_{'paired' if paired else 'unpaired'}"] = impls._ours("auto")(case, {**inputs, "params": qp})
    ms, outs = timed(preps)
    row = {"case": "E128/" + case.name, "ms": ms, "paired_eq": bool(np.array_equal(outs["fp8_paired"], outs["fp8_unpaired"]))}
    print(json.dumps(row), flush=True); res.append(row)
json.dump(res, open(sys.argv[1], "w"), indent=1)
