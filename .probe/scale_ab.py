"""fp8_block's block-scale scalars loaded before each step's wgmma (the tree's gmm_fp8_mgpu) against
after its wait (.probe/gmm_fp8_mgpu_before.py, the kernel at bc54e75): the SwiGLU-256 layer forward
with fp8_block and fp8 weights and FP8 activations on mosaic_gpu, in one process, medians of 3
alternating rounds, ms (fp8 runs the same code both ways: the noise). Outputs compared bit for bit.
Usage: python .probe/scale_ab.py OUT.json [--small] [--tokens T,T,...]"""
import dataclasses, importlib.util, json, sys, time
import jax
import numpy as np
import moe_pallas
from moe_pallas.kernels import gmm_fp8_mgpu as K
from benchmarks import cases as C, impls, run as R

spec = importlib.util.spec_from_file_location("before", ".probe/gmm_fp8_mgpu_before.py")
B = importlib.util.module_from_spec(spec)
spec.loader.exec_module(B)
KERNELS = {"after": K._kernel, "before": B._kernel}

out_path = sys.argv[1]
small = "--small" in sys.argv
W = (C.SMALL_WORKLOADS if small else C.WORKLOADS)["swiglu256"]
if small:
    W = dataclasses.replace(W, hidden=256, inter=128)
params = C.make_params(W)
stored = {f: moe_pallas.quantize_experts(params, f, fp8_activations=True) for f in ("fp8_block", "fp8")}
TOKENS = (64,) if small else (2048, 4096, 8192)
if "--tokens" in sys.argv:
    TOKENS = tuple(int(t) for t in sys.argv[sys.argv.index("--tokens") + 1].split(","))
res = []
for T in TOKENS:
    case = C.Case("decode", W, T, "fwd")
    inputs = R._inputs(case, params)
    t0 = time.time()
    preps = {}
    for fmt, p in stored.items():
        for name, kern in KERNELS.items():
            K._kernel = kern
            jax.clear_caches()
            preps[f"{fmt} {name}"] = impls._ours("mosaic_gpu")(case, {**inputs, "params": p})
    K._kernel = KERNELS["after"]
    outs = {k: np.asarray(p.wait(p.call()), np.float32) for k, p in preps.items()}
    times = {k: [] for k in preps}
    for _ in range(3):
        for k, p in preps.items():
            times[k].append(R.measure(p, 0.2)[0] * 1e3)
    row = {"T": T, **{k: round(sorted(v)[1], 4) for k, v in times.items()},
           "equal": {f: bool(np.array_equal(outs[f"{f} after"], outs[f"{f} before"])) for f in stored},
           "s": round(time.time() - t0, 1)}
    print(json.dumps(row), flush=True)
    res.append(row)
    json.dump(res, open(out_path, "w"), indent=1)
    del preps, outs
