"""fp8_block's layer with weights_first off for every fp8 value: four calls bitwise equal? (gpt-oss
and SwiGLU-256 at T = 2048, "auto"), against our bf16 layer on the decoded weights, timed beside it.
Usage: python .probe/det_check.py OUT.json"""
import json, sys
import jax.numpy as jnp, numpy as np
import moe_pallas
from benchmarks import cases as C, impls, run as R

res = []
for wl in ("gptoss", "swiglu256"):
    W = C.WORKLOADS[wl]
    params = C.make_params(W)
    for fmt in ("fp8_block", "fp8"):
        qp = moe_pallas.quantize_experts(params, fmt)
        dq = moe_pallas.dequantize_experts(qp, jnp.bfloat16)
        case = C.Case("decode", W, 2048, "fwd")
        inputs = R._inputs(case, params)
        ref = impls._ours("auto")(case, {**inputs, "params": dq})
        r = np.asarray(ref.wait(ref.call()), np.float32)
        p = impls._ours("auto")(case, {**inputs, "params": qp})
        outs = [np.asarray(p.wait(p.call()), np.float32) for _ in range(4)]
        row = {"layer": wl, "fmt": fmt, "bitwise_equal": all(np.array_equal(o, outs[0]) for o in outs),
               "err": float(np.linalg.norm(outs[0] - r) / np.linalg.norm(r)),
               "ms_bf16": R.measure(ref, 0.15)[0] * 1e3, "ms": R.measure(p, 0.15)[0] * 1e3}
        print(json.dumps(row), flush=True)
        res.append(row)
        json.dump(res, open(sys.argv[1], "w"), indent=1)
