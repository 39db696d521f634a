"""The sort-free few-token forward (`kernels/decode.py`) against the float64 reference.

Interpret mode on CPU pre-fills outputs with NaN and `_rel_err` rejects NaN, so every output
element must be written; the `gpu` test runs the seed workloads at full size.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moe_pallas.kernels.decode import decode_experts
from moe_pallas.reference import moe_experts_reference
from tests.test_fused import TOL, _problem, _rel_err

CASES = [  # (T, H, I, E, k): H, I off the 16-wide blocks; T = 1 and a few tokens
    (1, 40, 24, 6, 3),
    (3, 64, 48, 8, 4),
    (2, 33, 20, 5, 2),
    (4, 48, 16, 16, 8),
]


def _reference64(activation, x, idx, w, params):
    with jax.enable_x64(True):
        up = lambda a: jnp.asarray(np.asarray(a, np.float64))
        p64 = {k: up(v) for k, v in params.items()}
        out = moe_experts_reference(
            up(x), idx, up(w), p64, activation=activation, dtype=jnp.float64
        )
        return np.asarray(out)


def _decode(activation, **blocks):
    return jax.jit(lambda x, i, w, p: decode_experts(x, i, w, p, activation, **blocks))


@pytest.mark.parametrize("activation", ["gptoss", "swiglu"])
@pytest.mark.parametrize(
    "mode,dtype", [("random", jnp.float32), ("masked", jnp.bfloat16), ("hot", jnp.float32)]
)
@pytest.mark.parametrize("case", CASES)
def test_decode_matches_float64(case, mode, dtype, activation):
    rng = np.random.default_rng()
    x, idx, w, params = _problem(rng, activation, *case, dtype, mode)
    out = _decode(activation, block_k=16, block_n=16)(x, idx, w, params)
    ref = _reference64(activation, x, idx, w, params)
    assert out.shape == x.shape and out.dtype == x.dtype
    assert _rel_err(out, ref) < TOL[dtype]


def test_decode_masked_slots_add_nothing():
    """Out-of-range ids contribute zero, even though the down kernel reads expert 0 for them
    (here all NaN): they are selected away, not multiplied by zero."""
    rng = np.random.default_rng(3)
    x, _, w, params = _problem(rng, "gptoss", 2, 32, 16, 4, 3, jnp.float32)
    idx = jnp.asarray([[1, 4, 2], [-1, 3, 99]], jnp.int32)  # experts 1-3 real, 3 slots masked
    ref = _reference64("gptoss", x, idx, w, params)
    poisoned = {k: v.at[0].set(jnp.nan) for k, v in params.items()}
    out = _decode("gptoss", block_k=16, block_n=16)(x, idx, w, poisoned)
    assert _rel_err(out, ref) < TOL[jnp.float32]


def test_decode_is_bitwise_reproducible_and_zero_tokens():
    rng = np.random.default_rng(5)
    x, idx, w, params = _problem(rng, "swiglu", 3, 32, 16, 8, 4, jnp.bfloat16)
    fn = _decode("swiglu")
    assert np.array_equal(np.asarray(fn(x, idx, w, params)), np.asarray(fn(x, idx, w, params)))
    empty = fn(x[:0], idx[:0], w[:0], params)
    assert empty.shape == (0, 32)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "activation,h,i,e,k", [("gptoss", 2880, 2880, 128, 4), ("swiglu", 4096, 2048, 256, 8)]
)
@pytest.mark.parametrize("tokens", [1, 4])
def test_decode_full_shapes_gpu(activation, h, i, e, k, tokens):
    rng = np.random.default_rng(tokens)
    x, idx, w, params = _problem(rng, activation, tokens, h, i, e, k, jnp.bfloat16)
    out = _decode(activation)(x, idx, w, params)
    ref = _reference64(activation, x, idx, w, params)
    assert _rel_err(out, ref) < TOL[jnp.bfloat16]
