"""The three oracles agree with each other and with a hand-written numpy float64 computation."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moe_pallas.reference import moe_experts_by_expert, moe_experts_loop, moe_experts_reference
from tests.helpers import make_params, random_routing


def numpy_moe(x, idx, w, params, activation):
    x, idx, w = np.asarray(x, np.float64), np.asarray(idx), np.asarray(w, np.float64)
    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(idx.shape[1]):
            e = idx[t, j]
            if not 0 <= e < p["w_gate_up"].shape[0]:
                continue
            h = x[t] @ p["w_gate_up"][e] + (p["b_gate_up"][e] if "b_gate_up" in p else 0)
            if activation == "gptoss":
                gate, up = np.minimum(h[0::2], 7.0), np.clip(h[1::2], -7.0, 7.0)
                a = (up + 1) * gate / (1 + np.exp(-1.702 * gate))
            else:
                half = h.shape[0] // 2
                gate, up = h[:half], h[half:]
                a = gate / (1 + np.exp(-gate)) * up
            y = a @ p["w_down"][e] + (p["b_down"][e] if "b_down" in p else 0)
            out[t] += w[t, j] * y
    return out


@pytest.mark.parametrize(
    "activation,biases", [("gptoss", True), ("swiglu", False), ("swiglu", True)]
)
def test_oracles_agree_with_numpy(activation, biases):
    rng = np.random.default_rng()
    T, H, I, E, k = 11, 24, 10, 6, 3
    params = make_params(
        rng, E, H, I, biases=biases, scale=3.0
    )  # large: exercises the gpt-oss clamps
    x = rng.standard_normal((T, H))
    idx, w = random_routing(rng, T, E, k)
    idx[0, 1] = E  # out of range: contributes zero
    idx[1, 0] = -1
    want = numpy_moe(x, idx, w, params, activation)
    with jax.enable_x64(True):
        for oracle in (
            functools.partial(moe_experts_reference, chunk=4),
            functools.partial(moe_experts_loop, chunk=4),
            moe_experts_by_expert,
        ):
            got = oracle(
                x,
                jnp.asarray(idx),
                jnp.asarray(w),
                params,
                activation=activation,
                dtype=jnp.float64,
            )
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("activation", ["gptoss", "swiglu"])
def test_dense_oracle_gradients_match_the_sorted_one(activation):
    """The GPU full-shape test takes its gradients from moe_experts_by_expert: they must equal the
    sorted oracle's (float64), h rounding included."""
    rng = np.random.default_rng()
    T, H, I, E, k = 9, 16, 8, 5, 3
    params = make_params(rng, E, H, I, biases=activation == "gptoss", scale=3.0)
    x = rng.standard_normal((T, H))
    idx, w = random_routing(rng, T, E, k)
    idx[0, 0] = E  # out of range: zero
    cot = rng.standard_normal((T, H))
    with jax.enable_x64(True):
        grads = [
            jax.grad(
                lambda x, w, p: jnp.vdot(
                    oracle(
                        x,
                        jnp.asarray(idx),
                        w,
                        p,
                        activation=activation,
                        dtype=jnp.float64,
                        h_dtype=jnp.bfloat16,
                    ),
                    cot,
                ),
                argnums=(0, 1, 2),
            )(jnp.asarray(x), jnp.asarray(w), params)
            for oracle in (moe_experts_reference, moe_experts_by_expert)
        ]
        for got, want in zip(*map(jax.tree.leaves, grads)):
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-9, atol=1e-9)


def test_reference_handles_single_token_and_all_rows_in_one_expert():
    rng = np.random.default_rng()
    params = make_params(rng, 4, 8, 4, biases=True)
    x = rng.standard_normal((1, 8)).astype(np.float32)
    idx = np.full((1, 2), 3, np.int32)
    w = np.array([[0.25, 0.75]], np.float32)
    got = moe_experts_reference(x, idx, w, params, activation="gptoss")
    want = numpy_moe(x, idx, w, params, "gptoss")
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)
