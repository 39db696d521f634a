"""Quantised weights at the smallest grids (T = 1, 4, 16): spread_block_n narrowing to 16 columns
for the N-major stored formats (whose tile rows are K-contiguous at any block_n) against the
bf16 floor of 64 (32 for gpt-oss's GLU), the layer side by side, medians of 3 alternating rounds.
The floor exists for bf16's [K, N] rows (f7b753c); at T = 1 fp8 ran slower than bf16 (0.117 vs
0.096 ms, gpt-oss, 6e93ec3) with 4 experts x 45 column tiles. Usage: python .probe/narrow_ab.py OUT.json"""
import json, sys, time
import numpy as np
import moe_pallas
from moe_pallas.backends import pallas_triton as pt
from benchmarks import cases as C, impls, run as R

FLOOR = pt.min_block_n
res = []
for wl in ("gptoss", "swiglu256"):
    params = C.make_params(C.WORKLOADS[wl])
    stored = {f: moe_pallas.quantize_experts(params, f) for f in ("fp8", "fp8_block", "mxfp4")}
    for T in (1, 4, 16):
        case = C.Case("decode", C.WORKLOADS[wl], T, "fwd")
        inputs = R._inputs(case, params)
        t0 = time.time()
        preps = {"bf16": impls._ours("auto")(case, inputs)}
        for f, q in stored.items():
            pt.min_block_n = FLOOR
            preps[f] = impls._ours("auto")(case, {**inputs, "params": q})
            pt.min_block_n = lambda kernel, activation=None: 16
            preps[f + "_n16"] = impls._ours("auto")(case, {**inputs, "params": q})
        pt.min_block_n = FLOOR
        outs = {k: np.asarray(p.wait(p.call()), np.float32) for k, p in preps.items()}
        times = {k: [] for k in preps}
        for _ in range(3):
            for k, p in preps.items():
                times[k].append(R.measure(p, 0.2)[0] * 1e3)
        row = {"case": case.name, **{k: round(sorted(v)[1], 4) for k, v in times.items()},
               "same_bits": {f: bool(np.array_equal(outs[f], outs[f + "_n16"])) for f in stored},
               "s": round(time.time() - t0, 1)}
        print(json.dumps(row), flush=True); res.append(row)
        del preps, outs
    del params, stored
json.dump(res, open(sys.argv[1], "w"), indent=1)
