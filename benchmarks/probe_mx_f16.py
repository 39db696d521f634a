"""Probe: mxfp4 weights decoded to float16 by bit placement (2.25 instructions a value, no
multiply, lhs rows scaled by a power of two as fp8's) against the committed bf16 decode (3 a value,
a bf16x2 multiply), and against bf16 weights: the layer at decode sizes and at 64 rows per expert,
both workloads, one process, alternating rounds; outputs against the bf16 layer on the dequantised
weights.  python -m benchmarks.probe_mx_f16 OUT.json [--small]"""

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
WORKLOADS = C.WORKLOADS
if SMALL:  # K a multiple of 64 (mxfp4)
    WORKLOADS = {
        "gptoss": C.Workload("gptoss", 64, 64, 8, 2, "gptoss", True, "topk_softmax"),
        "swiglu256": C.Workload("swiglu256", 128, 64, 16, 4, "swiglu", False, "softmax_topk"),
    }
results = []
for wl in ("gptoss", "swiglu256"):
    params = C.make_params(WORKLOADS[wl])
    qp = jax.jit(lambda p: moe_pallas.quantize_experts(p, "mxfp4"))(params)
    dense = moe_pallas.dequantize_experts(qp)
    for tokens in (1, 16) if SMALL else (1, 16, 64, 256, 2048):
        case = C.Case("decode", WORKLOADS[wl], tokens, "fwd")
        inputs = R._inputs(case, params)
        preps = {"bf16": impls._ours("auto")(case, inputs)}
        for mode in ("f16", "bf16"):
            gq.MX_COMPUTE = mode
            preps[f"mxfp4_{mode}"] = impls._ours("auto")(case, {**inputs, "params": qp})
        ref_prep = impls._ours("auto")(case, {**inputs, "params": dense})
        ref = ref_prep.wait(ref_prep.call())
        outs = {
            m: np.asarray(preps[f"mxfp4_{m}"].wait(preps[f"mxfp4_{m}"].call()))
            for m in ("f16", "bf16")
        }
        errs = {m: rel(o, ref) for m, o in outs.items()}
        errs["bitwise_equal"] = bool(np.array_equal(outs["f16"], outs["bf16"]))
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

# fp8_block at gpt-oss decode: the K = 2880 tiles run at wider N against K capped alone.
fp8b = []
wl = "gptoss"
params = C.make_params(WORKLOADS[wl])
qp = {
    f: jax.jit(lambda p, f=f: moe_pallas.quantize_experts(p, f))(params)
    for f in ("fp8", "fp8_block")
}
for tokens in (1, 16) if SMALL else (16, 64, 256):
    case = C.Case("decode", WORKLOADS[wl], tokens, "fwd")
    inputs = R._inputs(case, params)
    preps = {"bf16": impls._ours("auto")(case, inputs)}
    preps["fp8"] = impls._ours("auto")(case, {**inputs, "params": qp["fp8"]})
    for wide in (True, False):
        gq.FP8B_WIDE = wide
        preps[f"fp8_block_{'wide' if wide else 'capped'}"] = impls._ours("auto")(
            case, {**inputs, "params": qp["fp8_block"]}
        )
    outs = {k: np.asarray(p.wait(p.call())) for k, p in preps.items()}
    times = {k: [] for k in preps}
    for _ in range(3):
        for k, p in preps.items():
            times[k].append(R.measure(p, 0.2)[0] * 1e3)
    row = {
        "case": case.name,
        "ms": {k: sorted(v)[1] for k, v in times.items()},
        "wide_vs_capped_rel": rel(outs["fp8_block_wide"], outs["fp8_block_capped"]),
    }
    fp8b.append(row)
    print(json.dumps(row), flush=True)
    del preps
with open(sys.argv[1].replace(".json", "_fp8b.json"), "w") as f:
    json.dump(fp8b, f, indent=1)
