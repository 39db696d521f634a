"""mxfp4: one bf16x2 multiply by 2^(s - 1) per pair (QuantizedWeight.small_scales, the product
path where every scale code is <= 128) against two (small_scales=False), the layer side by side
(medians of 3 alternating rounds), both workloads, decode T = 16..256 and T = 2048.
Usage: python .probe/mx_onemul_ab.py OUT.json"""
import dataclasses, json, sys, time
import jax, numpy as np
import moe_pallas
from moe_pallas import quant
from benchmarks import cases as C, impls, run as R


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


res = []
for wl in ("gptoss", "swiglu256"):
    params = C.make_params(C.WORKLOADS[wl])
    one = moe_pallas.quantize_experts(params, "mxfp4")
    flags = [v.small_scales for v in one.values() if quant.is_quantized(v)]
    print(wl, "small_scales", flags, flush=True)
    two = {k: dataclasses.replace(v, small_scales=False) if quant.is_quantized(v) else v
           for k, v in one.items()}
    for T in (16, 64, 256, 2048):
        case = C.Case("decode", C.WORKLOADS[wl], T, "fwd")
        inputs = R._inputs(case, params)
        t0 = time.time()
        preps = {"bf16": impls._ours("auto")(case, inputs),
                 "two": impls._ours("auto")(case, {**inputs, "params": two}),
                 "one": impls._ours("auto")(case, {**inputs, "params": one})}
        outs = {k: np.asarray(p.wait(p.call()), np.float32) for k, p in preps.items()}
        times = {k: [] for k in preps}
        for _ in range(3):
            for k, p in preps.items():
                times[k].append(R.measure(p, 0.2)[0] * 1e3)
        row = {"case": case.name, "flags": flags,
               **{k: round(sorted(v)[1], 4) for k, v in times.items()},
               "one_equals_two": bool(np.array_equal(outs["one"], outs["two"])),
               "one_vs_bf16": rel(outs["one"], outs["bf16"]), "s": round(time.time() - t0, 1)}
        print(json.dumps(row), flush=True); res.append(row)
        del preps, outs
    del params, one, two
json.dump(res, open(sys.argv[1], "w"), indent=1)
