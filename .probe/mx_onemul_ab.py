"""mxfp4: one bf16x2 multiply by 2^(s - 1) per pair instead of two (2^(min(s,128)-1), 2^(max(s,128)-128)),
valid when every scale code is <= 128 (|w| < 16 per 32-value block): is the saving (64 of 512 K-loop
instructions on the 16 x 128 x 128 GLU tile, offline SASS) worth a static max-scale field on
QuantizedWeight? Times the layer both ways side by side (medians of 3 alternating rounds).
Usage: python .probe/mx_onemul_ab.py OUT.json"""
import json, sys, time
import jax, numpy as np
import moe_pallas
from moe_pallas.kernels import gmm_quant as gq
from benchmarks import cases as C, impls, run as R

TWO = dict(gq.E2M1_PTX)
ONE = {q: p.replace("mul.rn.bf16x2 t, t, $2;\nmul.rn.bf16x2 $0, t, $3;", "mul.rn.bf16x2 $0, t, $2;")
       for q, p in TWO.items()}
assert all(ONE[q] != TWO[q] for q in TWO)

def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))

res = []
for wl in ("gptoss", "swiglu256"):
    params = C.make_params(C.WORKLOADS[wl])
    qp = jax.jit(lambda p: moe_pallas.quantize_experts(p, "mxfp4"))(params)
    top = max(int(np.asarray(v.scales).max()) for v in qp.values() if hasattr(v, "scales"))
    print(wl, "largest scale code", top, flush=True)
    for T in (16, 64, 256, 2048):
        case = C.Case("decode", C.WORKLOADS[wl], T, "fwd")
        inputs = R._inputs(case, params)
        t0 = time.time()
        preps = {"bf16": impls._ours("auto")(case, inputs)}
        for name, table in (("two", TWO), ("one", ONE)):
            gq.E2M1_PTX.clear(); gq.E2M1_PTX.update(table)
            preps[name] = impls._ours("auto")(case, {**inputs, "params": qp})
        gq.E2M1_PTX.clear(); gq.E2M1_PTX.update(TWO)
        outs = {k: np.asarray(p.wait(p.call()), np.float32) for k, p in preps.items()}
        times = {k: [] for k in preps}
        for _ in range(3):
            for k, p in preps.items():
                times[k].append(R.measure(p, 0.2)[0] * 1e3)
        row = {"case": case.name, "max_code": top, **{k: round(sorted(v)[1], 4) for k, v in times.items()},
               "one_vs_two": rel(outs["one"], outs["two"]), "s": round(time.time() - t0, 1)}
        print(json.dumps(row), flush=True); res.append(row)
        del preps, outs
    del params, qp
json.dump(res, open(sys.argv[1], "w"), indent=1)
