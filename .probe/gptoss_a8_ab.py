"""gpt-oss's FP8-activation layer forward with its products on Mosaic GPU (`kernels.gmm_fp8_mgpu`
with K and N tails and the interleaved GLU; implementation="mosaic_gpu") against Triton's
("pallas_triton") and our bf16 layer ("auto"), in one process, medians of 3 alternating rounds,
ms; outputs compared with Triton's. fp8_block: its GLU stays on Triton, its down product moves.
Usage: python .probe/gptoss_a8_ab.py OUT.json [--small] [--tokens T,T,...]"""
import dataclasses, json, sys, time
import numpy as np
import moe_pallas
from benchmarks import cases as C, impls, run as R


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


out_path = sys.argv[1]
small = "--small" in sys.argv
W = (C.SMALL_WORKLOADS if small else C.WORKLOADS)["gptoss"]
if small:
    W = dataclasses.replace(W, hidden=320, inter=192)
params = C.make_params(W)
stored = {f: moe_pallas.quantize_experts(params, f, fp8_activations=True) for f in ("fp8", "fp8_block")}
TOKENS = (64,) if small else (512, 2048, 4096, 16384)
if "--tokens" in sys.argv:
    TOKENS = tuple(int(t) for t in sys.argv[sys.argv.index("--tokens") + 1].split(","))
res = []
for T in TOKENS:
    case = C.Case("decode", W, T, "fwd")
    inputs = R._inputs(case, params)
    t0 = time.time()
    preps = {"bf16": impls._ours("pallas_triton" if small else "auto")(case, inputs)}
    for fmt, p in stored.items():
        for impl, name in (("pallas_triton", "triton"), ("mosaic_gpu", "mgpu")):
            try:
                preps[f"{fmt}_a8 {name}"] = impls._ours(impl)(case, {**inputs, "params": p})
            except Exception as err:
                print(fmt, name, type(err).__name__, str(err)[:400], flush=True)
    outs = {}
    for k, p in list(preps.items()):
        try:
            outs[k] = np.asarray(p.wait(p.call()), np.float32)
        except Exception as err:
            print(k, type(err).__name__, str(err)[:400], flush=True)
            del preps[k]
    times = {k: [] for k in preps}
    for _ in range(3):
        for k, p in preps.items():
            times[k].append(R.measure(p, 0.2)[0] * 1e3)
    row = {"case": case.name, **{k: round(sorted(v)[1], 4) for k, v in times.items()},
           "vs_triton": {k: rel(outs[k], outs[k.split()[0] + " triton"]) for k in outs if "mgpu" in k},
           "finite": {k: bool(np.isfinite(v).all()) for k, v in outs.items()},
           "s": round(time.time() - t0, 1)}
    print(json.dumps(row), flush=True)
    res.append(row)
    json.dump(res, open(out_path, "w"), indent=1)
    del preps, outs
