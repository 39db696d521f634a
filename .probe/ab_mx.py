"""bf16 vs mxfp4 layer at decode sizes, both workloads, one process (PYTHONPATH picks the code)."""
import json, sys
import jax, numpy as np
import moe_pallas
from benchmarks import cases as C, impls, run as R

out = []
for wl in ("gptoss", "swiglu256"):
    params = C.make_params(C.WORKLOADS[wl])
    qp = jax.jit(lambda p: moe_pallas.quantize_experts(p, "mxfp4"))(params)
    for T in (16, 64, 256, 2048):
        case = C.Case("decode", C.WORKLOADS[wl], T, "fwd")
        inputs = R._inputs(case, params)
        preps = {"bf16": impls._ours("auto")(case, inputs),
                 "mxfp4": impls._ours("auto")(case, {**inputs, "params": qp})}
        for p in preps.values():
            p.wait(p.call())
        times = {k: [] for k in preps}
        for _ in range(3):
            for k, p in preps.items():
                times[k].append(R.measure(p, 0.2)[0] * 1e3)
        row = {"case": case.name, **{k: sorted(v)[1] for k, v in times.items()}}
        row["speedup"] = row["bf16"] / row["mxfp4"]
        print(json.dumps(row), flush=True)
        out.append(row)
        del preps
    del params, qp
json.dump(out, open(sys.argv[1], "w"), indent=1)
