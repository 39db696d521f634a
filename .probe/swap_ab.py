"""fp8 (per channel) and mxfp4 on 64- and 128-row tiles: accᵀ = w · xᵀ (fp8 on the byte-pair view;
the decoded weights wgmma's register operand, x its pipelined shared-memory operand: no
shared-memory round trip of the decoded tile, a wgmma group left in flight across the next
decode; .probe/gmm_quant_swap.py) against the product's x · w (decoded tile staged in shared
memory, wgmma waited every step). The layer side by side, medians of 3 alternating rounds,
beside bf16. Offline SASS (K loop, instructions a thread): fp8 64 x 128 x 64 149 -> 142 (no STS),
128 x 128 x 64 at 8 warps 119 -> 111; mxfp4 64 x 128 x 64 290 -> 259 (BAR.SYNC 12 -> 5, STS.128
8 -> 0), 128 x 128 x 64 at 8 warps 204 -> 182 (9 -> 2, 4 -> 0).
Usage: python .probe/swap_ab.py OUT.json"""
import importlib.util, json, sys, time
import numpy as np
import moe_pallas
from moe_pallas.backends import pallas_triton as pt
from benchmarks import cases as C, impls, run as R

spec = importlib.util.spec_from_file_location("gq_swap", ".probe/gmm_quant_swap.py")
swap = importlib.util.module_from_spec(spec)
spec.loader.exec_module(swap)
PRODUCT = pt._gmm_quant


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


res = []
for wl, tokens in (("gptoss", (2048, 4096, 16384)), ("swiglu256", (2048, 4096, 8192))):
    params = C.make_params(C.WORKLOADS[wl])
    stored = {f: moe_pallas.quantize_experts(params, f) for f in ("fp8", "mxfp4")}
    for T in tokens:
        case = C.Case("decode", C.WORKLOADS[wl], T, "fwd")
        inputs = R._inputs(case, params)
        t0 = time.time()
        preps = {"bf16": impls._ours("auto")(case, inputs)}
        for f, q in stored.items():
            preps[f] = impls._ours("auto")(case, {**inputs, "params": q})
            pt._gmm_quant = swap.gmm_quant
            preps[f + "_swap"] = impls._ours("auto")(case, {**inputs, "params": q})
            pt._gmm_quant = PRODUCT
        outs = {k: np.asarray(p.wait(p.call()), np.float32) for k, p in preps.items()}
        times = {k: [] for k in preps}
        for _ in range(3):
            for k, p in preps.items():
                times[k].append(R.measure(p, 0.2)[0] * 1e3)
        row = {"case": case.name, **{k: round(sorted(v)[1], 4) for k, v in times.items()},
               **{f + "_swap_vs_product": rel(outs[f + "_swap"], outs[f]) for f in stored},
               "s": round(time.time() - t0, 1)}
        print(json.dumps(row), flush=True); res.append(row)
        del preps, outs
    del params, stored
json.dump(res, open(sys.argv[1], "w"), indent=1)
