"""Probe: mxfp4 stored as 32-bit words of 8 codes (`quant.MX_WORD_BITS`: 15 instructions per 8
values to decode, against 24 a code a nibble) and the e8m0 scales loaded a K step ahead, each
on and off, against bf16 weights: the layer at decode sizes and at 64 rows per expert, both
workloads, one process, alternating rounds; outputs against the bf16 layer on the dequantised
weights.  python -m benchmarks.probe_mx_words OUT.json [--small]"""

import json
import sys

import jax
import numpy as np

import moe_pallas
from benchmarks import cases as C
from benchmarks import impls
from benchmarks import run as R
from moe_pallas import quant
from moe_pallas.kernels import gmm_quant as gq


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


SMALL = "--small" in sys.argv
WORKLOADS = C.WORKLOADS
if SMALL:  # K a multiple of 64 (mxfp4)
    WORKLOADS = {
        "gptoss": C.Workload("gptoss", 64, 64, 8, 2, "gptoss", True, "topk_softmax"),
        "swiglu256": C.Workload("swiglu256", 128, 64, 16, 4, "swiglu", False, "softmax_topk"),
    }
VARIANTS = {
    "nib": (False, False),
    "nib+pf": (False, True),
    "words": (True, False),
    "words+pf": (True, True),
}
results = []
for wl in ("gptoss", "swiglu256"):
    params = C.make_params(WORKLOADS[wl])
    qps = {}
    for words in (False, True):
        quant.MX_WORDS = words
        qps[words] = jax.jit(lambda p: moe_pallas.quantize_experts(p, "mxfp4"))(params)
    dense = moe_pallas.dequantize_experts(qps[True])
    for tokens in (1, 16) if SMALL else (1, 16, 64, 256, 2048):
        case = C.Case("decode", WORKLOADS[wl], tokens, "fwd")
        inputs = R._inputs(case, params)
        preps = {"bf16": impls._ours("auto")(case, inputs)}
        outs = {}
        for name, (words, pf) in VARIANTS.items():
            quant.MX_WORDS, gq.MX_PREFETCH = words, pf
            preps[name] = impls._ours("auto")(case, {**inputs, "params": qps[words]})
            outs[name] = np.asarray(preps[name].wait(preps[name].call()))
        quant.MX_WORDS = True
        ref_prep = impls._ours("auto")(case, {**inputs, "params": dense})
        ref = ref_prep.wait(ref_prep.call())
        errs = {m: rel(o, ref) for m, o in outs.items()}
        errs["all_bitwise_equal"] = all(np.array_equal(o, outs["nib"]) for o in outs.values())
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
    del params, qps, dense
with open(sys.argv[1], "w") as f:
    json.dump(results, f, indent=1)
