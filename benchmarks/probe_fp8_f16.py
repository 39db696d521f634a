"""Probe: fp8 weights multiplied in float16 (hardware e4m3x2 -> f16x2, lhs rows scaled by a power
of two) against the bf16 bit decode, and against bf16 weights: the layer at decode sizes and at 64
rows per expert, both workloads, one process, alternating rounds; outputs checked against the bf16
layer on the dequantised weights.  python -m benchmarks.probe_fp8_f16 OUT.json"""

import json
import sys

import jax
import numpy as np

import moe_pallas
from benchmarks import cases as C
from benchmarks import impls
from benchmarks import run as R
from moe_pallas.kernels import gmm_quant as gq


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


SMALL = "--small" in sys.argv
WORKLOADS = C.SMALL_WORKLOADS if SMALL else C.WORKLOADS
results = []
for wl in ("gptoss", "swiglu256"):
    params = C.make_params(WORKLOADS[wl])
    qp = {
        f: jax.jit(lambda p, f=f: moe_pallas.quantize_experts(p, f))(params)
        for f in ("fp8", "fp8_block")
    }
    dense = {f: moe_pallas.dequantize_experts(q) for f, q in qp.items()}
    for tokens in (1, 16) if SMALL else (1, 16, 64, 256, 2048):
        case = C.Case("decode", WORKLOADS[wl], tokens, "fwd")
        inputs = R._inputs(case, params)
        preps = {"bf16": impls._ours("auto")(case, inputs)}
        for f in ("fp8", "fp8_block"):
            for mode in ("f16", "bf16"):
                gq.FP8_COMPUTE = mode
                preps[f"{f}_{mode}"] = impls._ours("auto")(case, {**inputs, "params": qp[f]})
        errs = {}
        for f in ("fp8", "fp8_block"):
            ref_prep = impls._ours("auto")(case, {**inputs, "params": dense[f]})
            ref = ref_prep.wait(ref_prep.call())
            for mode in ("f16", "bf16"):
                p = preps[f"{f}_{mode}"]
                errs[f"{f}_{mode}"] = rel(p.wait(p.call()), ref)
            del ref_prep
        times = {k: [] for k in preps}
        for _ in range(3):
            for k, p in preps.items():
                times[k].append(R.measure(p, 0.2)[0] * 1e3)
        row = {
            "case": case.name,
            "ms": {k: sorted(v)[1] for k, v in times.items()},
            "rel_err": errs,
        }
        results.append(row)
        print(json.dumps(row), flush=True)
        del preps
    del params, qp, dense
with open(sys.argv[1], "w") as f:
    json.dump(results, f, indent=1)
