"""The gpt-oss layer forward at T = 16384 under "auto" with the new AUTO_TABLE entry (64-row
halves, two consumers) against the previous one (128 x 256, one warpgroup) and pallas_triton:
the suite runner's measure() on the suite's own case, alternating, and the outputs compared."""
import json, os
import jax, jax.numpy as jnp
from benchmarks import cases as _cases, impls as _impls, run as _run
from moe_pallas.kernels import gmm_mgpu

NEW = dict(gmm_mgpu.AUTO_TABLE)
OLD = {("large", 2880, 2880): gmm_mgpu.MosaicConfig(128, 256, 64, num_stages=3, grid_tile_n=4)}
w = _cases.WORKLOADS["gptoss"]
params = _cases.make_params(w)
case = _cases.Case("gptoss", w, 16384, "fwd")
inputs = _run._inputs(case, params)
preps, outs = {}, {}
for label, table, impl in (("new", NEW, "auto"), ("old", OLD, "auto"), ("triton", NEW, "pallas_triton")):
    gmm_mgpu.AUTO_TABLE.clear(); gmm_mgpu.AUTO_TABLE.update(table)
    preps[label] = _impls._ours(impl)(case, inputs)
    outs[label] = preps[label].call()
    jax.block_until_ready(outs[label])
gmm_mgpu.AUTO_TABLE.clear(); gmm_mgpu.AUTO_TABLE.update(NEW)
res = {}
for rnd in range(3):
    for label, prep in preps.items():
        t, n, _ = _run.measure(prep, 1.0)
        res.setdefault(label, []).append(t * 1e3)
f32 = lambda a: jnp.asarray(a, jnp.float32)
err = {k: float(jnp.linalg.norm(f32(v) - f32(outs["triton"])) / jnp.linalg.norm(f32(outs["triton"]))) for k, v in outs.items()}
print(json.dumps({"ms": res, "rel_err_vs_triton": err}), flush=True)
