"""fp8 at 32-64 rows per expert: the table's tiles against 16- and 32-row tiles (mma.sync, the
weights decoded in registers) forced through tuning.lookup."""
import json, sys
import jax, numpy as np
import moe_pallas
from moe_pallas import tuning
from moe_pallas.kernels import gmm_quant as gq
from benchmarks import cases as C, impls, run as R

real_lookup = tuning.lookup
def forced(cfg_by_kernel):
    def lookup(backend, kernel, *, dtype, k, n, rows, **kw):
        if ("e4m3" in str(dtype) or "e2m1" in str(dtype)) and kernel in cfg_by_kernel:
            c = cfg_by_kernel[kernel]
            if c == "tiny":
                return real_lookup(backend, kernel, dtype=dtype, k=k, n=n, rows="tiny", **kw)
            return {k: v for k, v in c.items() if k != "row_dot"}
        return real_lookup(backend, kernel, dtype=dtype, k=k, n=n, rows=rows, **kw)
    return lookup

def cfg(bm, bn, bk, w, s, mn=16):
    return {"block_m": bm, "block_n": bn, "block_k": bk, "group_m": 8, "num_warps": w, "num_stages": s, "min_block_m": mn, "tail_m": 0}

VARIANTS = {
    "table": None,
    "b64m16": {"gmm_glu": cfg(64, 64, 64, 4, 4), "gmm": cfg(64, 128, 64, 4, 4)},
    "b128": {"gmm_glu": cfg(128, 64, 64, 8, 4), "gmm": cfg(128, 128, 64, 8, 4)},
    "b128w4": {"gmm_glu": cfg(128, 64, 64, 4, 3), "gmm": cfg(128, 64, 128, 4, 3)},
    "b128k128": {"gmm_glu": cfg(128, 64, 128, 8, 3), "gmm": cfg(128, 128, 128, 8, 3)},
    "rd16": {"gmm_glu": cfg(64, 64, 128, 4, 3), "gmm": cfg(64, 64, 128, 4, 3), "row_dot": 16},
}

def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))

res = []
for name in ("swiglu256", "gptoss"):
    params = C.make_params(C.WORKLOADS[name])
    qps = {f: jax.jit(lambda p, f=f: moe_pallas.quantize_experts(p, f))(params) for f in ("fp8", "mxfp4")}
    for T in (1024, 2048):
        case = C.Case("decode", C.WORKLOADS[name], T, "fwd")
        inputs = R._inputs(case, params)
        preps = {"bf16": impls._ours("auto")(case, inputs)}
        for f, v, c in [("fp8", v, c) for v, c in VARIANTS.items()] + [("mxfp4", v, VARIANTS[v]) for v in ("table", "b64m16", "b128") if T == 2048]:
            qp = qps[f]
            v = v if f == "fp8" else "mx_" + v
            tuning.lookup = real_lookup if c is None else forced(c)
            gq.ROW_DOT = (c or {}).get("row_dot", 0)
            try:
                preps[v] = impls._ours("auto")(case, {**inputs, "params": qp})
            except Exception as e:
                print(v, "failed", repr(e)[:300], flush=True)
            tuning.lookup = real_lookup
            gq.ROW_DOT = 0
        outs = {k: np.asarray(p.wait(p.call())) for k, p in preps.items()}
        times = {k: [] for k in preps}
        for _ in range(3):
            for k, p in preps.items():
                times[k].append(R.measure(p, 0.2)[0] * 1e3)
        ms = {k: sorted(v)[1] for k, v in times.items()}
        row = {"case": case.name, "ms": ms, "rel_vs_table": {k: rel(outs[k], outs["mx_table" if k.startswith("mx_") else "table"]) for k in preps if k != "bf16"}}
        print(json.dumps(row), flush=True); res.append(row)
        del preps, outs
    del params, qps, qp
json.dump(res, open(sys.argv[1], "w"), indent=1)
