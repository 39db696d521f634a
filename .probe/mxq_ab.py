"""mxfp4 decoded in quarters (gmm_quant.MX_QUARTERS) against the byte-tile decode, bf16 beside,
the layer at decode sizes, one process, medians of 3 alternating rounds."""
import json, sys
import jax, numpy as np
import moe_pallas
from benchmarks import cases as C, impls, run as R
from moe_pallas.kernels import gmm_quant as gq

def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))

out = []
for wl, Ts in (("gptoss", (16, 64, 256)), ("swiglu256", (16, 64))):
    params = C.make_params(C.WORKLOADS[wl])
    qp = jax.jit(lambda p: moe_pallas.quantize_experts(p, "mxfp4"))(params)
    dense = moe_pallas.dequantize_experts(qp)
    for T in Ts:
        case = C.Case("decode", C.WORKLOADS[wl], T, "fwd")
        inputs = R._inputs(case, params)
        preps = {"bf16": impls._ours("auto")(case, inputs)}
        for q in (False, True):
            gq.MX_QUARTERS = q
            preps["mx_quarters" if q else "mx_bytes"] = impls._ours("auto")(case, {**inputs, "params": qp})
        gq.MX_QUARTERS = False
        ref = impls._ours("auto")(case, {**inputs, "params": dense})
        outs = {k: np.asarray(p.wait(p.call())) for k, p in preps.items()}
        want = np.asarray(ref.wait(ref.call()))
        times = {k: [] for k in preps}
        for _ in range(3):
            for k, p in preps.items():
                times[k].append(R.measure(p, 0.2)[0] * 1e3)
        row = {"case": case.name, "ms": {k: sorted(v)[1] for k, v in times.items()},
               "rel_vs_dense": {k: rel(outs[k], want) for k in ("mx_bytes", "mx_quarters")},
               "quarters_vs_bytes_equal": bool(np.array_equal(outs["mx_quarters"], outs["mx_bytes"]))}
        print(json.dumps(row), flush=True)
        out.append(row)
        del preps, ref
    del params, qp, dense
json.dump(out, open(sys.argv[1], "w"), indent=1)
