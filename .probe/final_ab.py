"""bf16 / fp8 / fp8_block / mxfp4 layer at decode sizes and 64 rows per expert, both workloads,
one process, medians of 3 alternating rounds; each format against the bf16 layer on its
dequantised weights."""
import json, sys
import jax, numpy as np
import moe_pallas
from benchmarks import cases as C, impls, run as R

def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))

out = []
for wl in ("gptoss", "swiglu256"):
    params = C.make_params(C.WORKLOADS[wl])
    fmts = ("fp8", "fp8_block", "mxfp4")
    qp = {f: jax.jit(lambda p, f=f: moe_pallas.quantize_experts(p, f))(params) for f in fmts}
    for T in (1, 16, 64, 256, 2048):
        case = C.Case("decode", C.WORKLOADS[wl], T, "fwd")
        inputs = R._inputs(case, params)
        preps = {"bf16": impls._ours("auto")(case, inputs),
                 **{f: impls._ours("auto")(case, {**inputs, "params": qp[f]}) for f in fmts}}
        outs = {k: np.asarray(p.wait(p.call())) for k, p in preps.items()}
        errs = {}
        for f in fmts:
            ref = impls._ours("auto")(case, {**inputs, "params": moe_pallas.dequantize_experts(qp[f])})
            errs[f] = rel(outs[f], np.asarray(ref.wait(ref.call())))
            del ref
        times = {k: [] for k in preps}
        for _ in range(3):
            for k, p in preps.items():
                times[k].append(R.measure(p, 0.2)[0] * 1e3)
        ms = {k: sorted(v)[1] for k, v in times.items()}
        row = {"case": case.name, "ms": ms, "speedup": {f: ms["bf16"] / ms[f] for f in fmts}, "rel_err_vs_dequantised": errs}
        print(json.dumps(row), flush=True)
        out.append(row)
        del preps
    del params, qp
json.dump(out, open(sys.argv[1], "w"), indent=1)
