"""Device probe: the train step with fp8_training on "auto", as shipped (the backward's FP8 products
g and dx on Triton), against "auto" giving every FP8-activation product Mosaic GPU's FP8 kernel
where it takes it (g's float32 output at 3 ring slots, its store buffer twice bf16's), beside bf16
and the line; gpt-oss T = 4096, 16384. Run with --compile-workers 1 (the route is a global)."""
import dataclasses
import sys

import jax.numpy as jnp

from benchmarks import impls, run
from moe_pallas import backends
from moe_pallas.backends import mosaic_gpu as backend

_gmm_fp8, _select = backend._gmm_fp8.gmm_fp8, backends.select
ROUTE = [False]


def gmm_fp8(*args, out_dtype=jnp.bfloat16, config=None, **kwargs):
    if jnp.dtype(out_dtype).itemsize == 4 and config is not None and config.num_stages > 3:
        config = dataclasses.replace(config, num_stages=3)
    return _gmm_fp8(*args, out_dtype=out_dtype, config=config, **kwargs)


def select(policy, problem):
    if ROUTE[0] and policy == "auto" and problem.fp8_activations and backend.supports(problem):
        return backends.get("mosaic_gpu")
    return _select(policy, problem)


backend._gmm_fp8.gmm_fp8 = gmm_fp8
backends.select = select
_ours = impls._ours("auto", fp8_training=True)


def routed(case, inputs):
    ROUTE[0] = True
    try:
        return _ours(case, inputs)
    finally:
        ROUTE[0] = False


impls.IMPLS["moe_pallas:auto+fp8_training_mgpu"] = routed
run.main(sys.argv[1:])
