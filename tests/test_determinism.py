"""Bitwise reproducibility of the Pallas paths: outputs and every gradient, run to run.

The fused block sums each token's k rows in a fixed order (combine), per-expert sums are matmuls,
and no kernel uses atomics (docs/reliability.md), so repeated runs must agree to the bit. On CPU
each run is a separate trace and compilation (interpret mode); on the GPU, 10 runs of one
compiled step at a moderate gpt-oss-like shape, and of ragged_dot / tgmm fwd+bwd.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moe_pallas import moe_experts, ragged_dot, tgmm
from tests.helpers import FULL_SHAPES, device_expert_params, device_normal


def _inputs(seed, tokens, hidden, inter, experts, top_k, dtype, biases):
    rng = np.random.default_rng(seed)
    p = device_expert_params(rng, experts, hidden, inter, dtype, (1.0, 1.0) if biases else None)
    # Zipf-skewed routing: a few hot experts with long groups, many empty ones.
    prob = 1.0 / np.arange(1, experts + 1) ** 1.2
    idx = np.stack(
        [rng.choice(experts, top_k, replace=False, p=prob / prob.sum()) for _ in range(tokens)]
    )
    return (
        device_normal(rng, (tokens, hidden), dtype),
        jnp.asarray(idx, jnp.int32),
        jnp.asarray(rng.random((tokens, top_k)) + 0.1, jnp.float32),
        p,
        device_normal(rng, (tokens, hidden), dtype),
    )


def _step(activation):
    """A fresh jitted fwd+bwd (a new function object: its own trace and compilation)."""

    def f(x, idx, w, p, d_out):
        fn = lambda x, w, p: moe_experts(
            x, idx, w, p, activation=activation, implementation="pallas_triton"
        )
        out, vjp = jax.vjp(fn, x, w, p)
        return out, vjp(d_out)

    return jax.jit(f)


_UINT = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}


@jax.jit
def _same_bits(a, b):
    as_uint = lambda v: jax.lax.bitcast_convert_type(v, _UINT[v.dtype.itemsize])
    return jnp.array_equal(as_uint(a), as_uint(b))


def _assert_same_bits(runs):
    """Every run's leaves equal the first run's to the bit. `runs` may be a generator: each run is
    compared on the device and dropped, so only two runs' outputs are alive at a time (ten
    gpt-oss-sized weight gradients would hold 63 GB)."""
    runs = iter(runs)
    first = jax.tree.leaves(next(runs))
    for i, run in enumerate(runs, 1):
        leaves = jax.tree.leaves(run)
        assert len(leaves) == len(first)
        for j, (a, b) in enumerate(zip(first, leaves)):
            assert a.shape == b.shape and a.dtype == b.dtype, f"run {i}, output leaf {j}"
            assert bool(_same_bits(a, b)), f"run {i} differs from run 0 in output leaf {j}"
        del run, leaves


def test_the_comparison_sees_one_bit():
    a = jnp.asarray([1.0, -0.0, jnp.nan], jnp.bfloat16)
    _assert_same_bits([(a, a), (a, jnp.array(a, copy=True))])
    flipped = jax.lax.bitcast_convert_type(
        jax.lax.bitcast_convert_type(a, jnp.uint16) ^ jnp.uint16(1), jnp.bfloat16
    )
    for other in (flipped, jnp.asarray([1.0, 0.0, jnp.nan], jnp.bfloat16)):  # -0.0 vs 0.0 too
        with pytest.raises(AssertionError, match="leaf 1"):
            _assert_same_bits([(a, a), (a, other)])


@pytest.mark.parametrize("activation", ["swiglu", "gptoss"])
def test_moe_experts_bitwise_reproducible_cpu(activation):
    args = _inputs(0, 23, 40, 24, 6, 3, jnp.bfloat16, activation == "gptoss")
    _assert_same_bits([_step(activation)(*args) for _ in range(2)])


def test_ragged_dot_and_tgmm_bitwise_reproducible_cpu():
    rng = np.random.default_rng(1)
    lhs = jnp.asarray(rng.standard_normal((45, 32)), jnp.bfloat16)
    rhs = jnp.asarray(rng.standard_normal((5, 32, 24)), jnp.bfloat16)
    sizes = jnp.asarray([20, 0, 17, 1, 4], jnp.int32)

    def step(lhs, rhs):
        out, vjp = jax.vjp(
            lambda a, b: ragged_dot(a, b, sizes, implementation="pallas_triton"), lhs, rhs
        )
        return out, vjp(out), tgmm(lhs, out, sizes, implementation="pallas_triton")

    _assert_same_bits([jax.jit(step)(lhs, rhs) for _ in range(2)])


@FULL_SHAPES
@pytest.mark.gpu
@pytest.mark.parametrize("activation", ["swiglu", "gptoss"])
def test_moe_experts_bitwise_reproducible_gpu(activation):
    hidden = inter = 2880 if activation == "gptoss" else 1024
    args = _inputs(0, 1024, hidden, inter, 128, 4, jnp.bfloat16, activation == "gptoss")
    step = _step(activation)
    _assert_same_bits(step(*args) for _ in range(10))
    _assert_same_bits(f(*args) for f in (step, _step(activation)))  # a second compilation too


@pytest.mark.gpu
def test_ragged_dot_and_tgmm_bitwise_reproducible_gpu():
    rng = np.random.default_rng(2)
    lhs = jnp.asarray(rng.standard_normal((4096, 1024)), jnp.bfloat16)
    rhs = jnp.asarray(rng.standard_normal((64, 1024, 768)) / 32, jnp.bfloat16)
    sizes = jnp.asarray(rng.multinomial(4000, np.ones(64) / 64), jnp.int32)

    @jax.jit
    def step(lhs, rhs):
        out, vjp = jax.vjp(lambda a, b: ragged_dot(a, b, sizes), lhs, rhs)
        return out, vjp(out), tgmm(lhs, out, sizes)

    _assert_same_bits(step(lhs, rhs) for _ in range(10))
