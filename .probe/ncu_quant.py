"""One layer call per weight format at gpt-oss and SwiGLU-256 decode sizes, for ncu."""
import sys
import jax, numpy as np
import moe_pallas
from benchmarks import cases as C, impls, run as R

wl = sys.argv[1]; T = int(sys.argv[2]); fmts = sys.argv[3].split(",")
params = C.make_params(C.WORKLOADS[wl])
case = C.Case("decode", C.WORKLOADS[wl], T, "fwd")
inputs = R._inputs(case, params)
for f in fmts:
    p = params if f == "bf16" else jax.jit(lambda p, f=f: moe_pallas.quantize_experts(p, f))(params)
    prep = impls._ours("auto")(case, {**inputs, "params": p})
    jax.block_until_ready(prep.wait(prep.call()))
    print(f, "done", flush=True)
