"""gpt-oss mxfp4 at decode sizes: byte decode (table tiles) against quarters at the table's
16 x 64 x 256 GLU tile and at 16 x 64 x 128 / 16 x 128 x 128 (forced through tuning.lookup)."""
import json, sys
import jax, numpy as np
import moe_pallas
from moe_pallas import tuning
from benchmarks import cases as C, impls, run as R
from moe_pallas.kernels import gmm_quant as gq

real = tuning.lookup
def forced(glu):
    def lookup(backend, kernel, *, dtype, k, n, rows, **kw):
        if "e2m1" in str(dtype) and kernel == "gmm_glu" and rows == "tiny":
            return dict(glu)
        return real(backend, kernel, dtype=dtype, k=k, n=n, rows=rows, **kw)
    return lookup
def cfg(bn, bk, s):
    return {"block_m": 16, "block_n": bn, "block_k": bk, "group_m": 8, "num_warps": 4, "num_stages": s, "min_block_m": None, "tail_m": 0}
V = {"bytes": (False, None), "q_table": (True, None), "q_64x128": (True, cfg(64, 128, 4)), "q_128x128": (True, cfg(128, 128, 4)), "q_64x256s4": (True, cfg(64, 256, 4))}
out = []
params = C.make_params(C.WORKLOADS["gptoss"])
qp = jax.jit(lambda p: moe_pallas.quantize_experts(p, "mxfp4"))(params)
for T in (16, 64, 256):
    case = C.Case("decode", C.WORKLOADS["gptoss"], T, "fwd")
    inputs = R._inputs(case, params)
    preps = {}
    for name, (q, c) in V.items():
        gq.MX_QUARTERS = q
        tuning.lookup = real if c is None else forced(c)
        preps[name] = impls._ours("auto")(case, {**inputs, "params": qp})
        gq.MX_QUARTERS = False; tuning.lookup = real
    outs = {k: np.asarray(p.wait(p.call())) for k, p in preps.items()}
    times = {k: [] for k in preps}
    for _ in range(3):
        for k, p in preps.items():
            times[k].append(R.measure(p, 0.2)[0] * 1e3)
    row = {"case": case.name, "ms": {k: sorted(v)[1] for k, v in times.items()},
           "equal_to_bytes": {k: bool(np.array_equal(outs[k], outs["bytes"])) for k in preps}}
    print(json.dumps(row), flush=True); out.append(row)
json.dump(out, open(sys.argv[1], "w"), indent=1)
