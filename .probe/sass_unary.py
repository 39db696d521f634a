"""Offline SASS of mxfp4's 16-row K loop with the e2m1 decode as a unary inline-asm block (only the
byte pairs as operand), then the scale as an arith.mulf by the broadcast factor ("mul"), or no
scale at all ("none", wrong values: shows what Triton's HoistLayoutConversion does with a unary
chain). Usage: PYTHONPATH=$PWD JAX_PLATFORMS=cpu python .probe/sass_unary.py mul|early|none [sass args]"""
import sys

import jax.numpy as jnp

from benchmarks import sass
from moe_pallas.kernels import gmm_quant as gq

MODE = sys.argv[1]
_factors = gq._e8m0_factors


def early_factors(codes, small):  # "early": broadcast where the scales load, before the pairs
    return tuple(jnp.broadcast_to(f[:, None], (f.shape[0], gq.MX_BLOCK // 2))
                 for f in _factors(codes, small))


def unary_e2m1(pairs, quarter, factors):
    ptx = "{\n.reg .b32 t, a, b;\n" + gq._E2M1_BODY[quarter] + "\nmov.b32 $0, t;\n}"
    t = gq._inline_asm(ptx, [pairs], "=r,r", 2, jnp.bfloat16)
    if MODE == "mul":
        for f in factors:
            t = t * f[:, None]
    if MODE == "early":
        for f in factors:
            t = t * f
    return t


gq._e2m1 = unary_e2m1
if MODE == "early":
    gq._e8m0_factors = early_factors
sys.exit(sass.main(["--weights", "mxfp4", *sys.argv[2:]]))
