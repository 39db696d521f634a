"""The backward's GLU pass (kernels/glu_bwd.py) against the same math in jnp, interpret mode on CPU
(outputs pre-filled with NaN there, so an unwritten element fails), and its lowering for an H200."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moe_pallas.activations import glu, glu_bwd, split_gate_up
from moe_pallas.kernels.glu_bwd import glu_backward
from tests.helpers import merge_gate_up
from tests.test_lowering import SDS, lower_for_h200, triton_calls


def _reference(h, g, row_weight, activation):
    gate, up = split_gate_up(h.astype(jnp.float64), activation)
    a = glu(gate, up, activation)
    d_gate, d_up = glu_bwd(gate, up, g * row_weight[:, None], activation)
    return merge_gate_up(d_gate, d_up, activation), a, jnp.sum(g * a, axis=1)


@pytest.mark.parametrize("activation", ["gptoss", "swiglu"])
@pytest.mark.parametrize(
    "rows, inter, dtype, block_i",
    [
        (37, 40, jnp.float32, 16),  # ragged rows, I not a multiple of the column block
        (16, 64, jnp.bfloat16, 32),  # several column steps
        (1, 24, jnp.float32, 128),  # T = 1, one masked step
    ],
)
def test_glu_backward_matches_reference(activation, rows, inter, dtype, block_i):
    rng = np.random.default_rng(rows + inter)
    h = jnp.asarray(6 * rng.standard_normal((rows, 2 * inter)), dtype)  # the ±7 clamps bite
    g = jnp.asarray(rng.standard_normal((rows, inter)), jnp.float32)
    row_weight = jnp.asarray(rng.random(rows), jnp.float32)
    dh, a, dw = glu_backward(h, g, row_weight, activation, block_i=block_i)
    assert (dh.dtype, a.dtype, dw.dtype) == (dtype, dtype, jnp.float32)
    with jax.enable_x64(True):
        want = _reference(
            h.astype(jnp.float64), g.astype(jnp.float64), row_weight.astype(jnp.float64), activation
        )
    tol = 1e-5 if dtype == jnp.float32 else 1e-2
    for got, ref in zip((dh, a, dw), want):
        got, ref = np.asarray(got, np.float64), np.asarray(ref)
        assert np.isfinite(got).all()
        assert np.linalg.norm(got - ref) <= tol * np.linalg.norm(ref)


def test_glu_backward_rejects_mismatched_shapes():
    h = jnp.zeros((4, 8), jnp.float32)
    with pytest.raises(ValueError, match=r"g must be \[4, 4\]"):
        glu_backward(h, jnp.zeros((4, 8)), jnp.zeros((4,)), "swiglu")
    with pytest.raises(ValueError, match="GLU activation"):
        glu_backward(h, jnp.zeros((4, 4)), jnp.zeros((4,)), "relu")


@pytest.mark.parametrize(
    "activation, rows, inter", [("gptoss", 8192, 2880), ("swiglu", 16384, 2048)]
)
def test_glu_backward_lowers_for_h200(activation, rows, inter):
    args = SDS((rows, 2 * inter), jnp.bfloat16), SDS((rows, inter), jnp.float32)
    text = lower_for_h200(
        lambda h, g, w: glu_backward(h, g, w, activation), *args, SDS((rows,), jnp.float32)
    )
    assert triton_calls(text) == 1


def test_gptoss_clamp_gradient_at_exactly_the_limit():
    """At gate or up exactly ±7 (a bf16 h hits it), jax.grad of `glu` passes the whole gradient,
    as `glu_bwd` and torch.clamp do (jnp.minimum / jnp.clip would pass half: a tie)."""
    gate = jnp.array([7.0, 7.0, -7.0, 6.5, 7.5, 3.0], jnp.float32)
    up = jnp.array([7.0, -7.0, 1.0, 7.5, 2.0, -7.0], jnp.float32)
    d_out = jnp.ones_like(gate)
    _, vjp = jax.vjp(lambda g, u: glu(g, u, "gptoss"), gate, up)
    want = glu_bwd(gate, up, d_out, "gptoss")
    for got, expected in zip(vjp(d_out), want):
        np.testing.assert_allclose(got, expected, rtol=1e-6)
    assert float(want[0][0]) > 0 and float(want[1][0]) > 0  # the ties pass gradient
    assert float(want[0][4]) == 0 and float(want[1][3]) == 0  # past the clamps: none
