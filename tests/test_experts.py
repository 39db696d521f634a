"""moe_experts (XLA backend): values and gradients against the oracle; input validation; debug checks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import moe_pallas
from moe_pallas import moe_experts
from moe_pallas.reference import moe_experts_reference
from tests.helpers import make_params, random_routing


def rel_err(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return np.linalg.norm(got - want) / np.linalg.norm(want)


def case(rng, T=9, H=16, I=8, E=5, k=2, biases=True, dtype=np.float32, skew=None):
    params = make_params(rng, E, H, I, biases=biases, scale=2.0, dtype=dtype)
    x = rng.standard_normal((T, H)).astype(dtype)
    idx, w = random_routing(rng, T, E, k, skew=skew)
    return x, idx, w, params


@pytest.mark.parametrize("activation", ["gptoss", "swiglu"])
@pytest.mark.parametrize("shape", [dict(), dict(T=1, k=1), dict(T=17, E=7, k=3, skew=3.0)])
def test_xla_matches_reference(activation, shape):
    rng = np.random.default_rng()
    x, idx, w, params = case(rng, **shape)
    # jitted (eagerly, every op compiled on its own; test_out_of_range_ids_contribute_zero and
    # test_bf16_within_bound_and_empty_and_hot_experts call moe_experts eagerly)
    ours = lambda x, idx, w, p: moe_experts(
        x, idx, w, p, activation=activation, implementation="xla"
    )
    got = jax.jit(ours)(x, idx, w, params)
    with jax.enable_x64(True):
        want = jax.jit(moe_experts_reference, static_argnames=("activation", "dtype"))(
            x, idx, w, params, activation=activation, dtype=jnp.float64
        )
    assert got.dtype == jnp.float32 and got.shape == x.shape
    assert rel_err(got, want) < 1e-5


def test_bf16_within_bound_and_empty_and_hot_experts():
    rng = np.random.default_rng()
    x, idx, w, params = case(rng, T=12, E=6, k=2)
    idx[:, 0] = 4  # one hot expert: every token; experts 0..3 mostly empty
    idx[:, 1] = 5
    xb = jnp.asarray(x, jnp.bfloat16)
    pb = {n: jnp.asarray(v, jnp.bfloat16) for n, v in params.items()}
    got = moe_experts(xb, idx, w, pb, activation="gptoss", implementation="xla")
    want = moe_experts_reference(xb, idx, w, pb, activation="gptoss")
    assert got.dtype == jnp.bfloat16
    assert rel_err(got, want) < 2e-2


def test_out_of_range_ids_contribute_zero():
    rng = np.random.default_rng()
    x, idx, w, params = case(rng, T=6, E=4, k=2)
    bad = idx.copy()
    bad[0, 0], bad[3, 1] = 4, -2
    masked_w = w.copy()
    masked_w[0, 0] = masked_w[3, 1] = 0.0
    got = moe_experts(x, bad, w, params, activation="swiglu", implementation="xla")
    want = moe_experts(x, idx, masked_w, params, activation="swiglu", implementation="xla")
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)


def test_debug_checks_raise_on_bad_routing():
    rng = np.random.default_rng()
    x, idx, w, params = case(rng, T=4, E=4, k=2)
    idx[1, 1] = 7
    f = jax.jit(lambda x, i, w, p: moe_experts(x, i, w, p, activation="swiglu"))
    with moe_pallas.debug_checks():
        checked = jax.jit(lambda x, i, w, p: moe_experts(x, i, w, p, activation="swiglu"))
        with pytest.raises(Exception, match="outside"):
            jax.block_until_ready(checked(x, idx, w, params))
        x_nan = x.copy()
        x_nan[2, 3] = np.nan
        with pytest.raises(Exception, match="NaN"):
            jax.block_until_ready(checked(x_nan, np.clip(idx, 0, 3), w, params))
    assert np.isfinite(np.asarray(f(x, idx, w, params))).all()  # unchecked: masked, no error


def test_gradients_match_reference():
    rng = np.random.default_rng()
    x, idx, w, params = case(rng, T=7, E=4, k=2)
    idx = jnp.asarray(idx)  # (the oracle indexes with it: a jax array under jit)
    cot = rng.standard_normal(x.shape).astype(np.float32)

    def loss(fn, x, w, params):
        return jnp.sum(fn(x, idx, w, params) * cot)

    ours = lambda x, i, w, p: moe_experts(x, i, w, p, activation="gptoss", implementation="xla")
    ref = lambda x, i, w, p: moe_experts_reference(
        x, i, w, p, activation="gptoss", dtype=jnp.float64
    )
    got = jax.jit(jax.grad(lambda *a: loss(ours, *a), argnums=(0, 1, 2)))(x, w, params)
    with jax.enable_x64(True):
        want = jax.jit(jax.grad(lambda *a: loss(ref, *a), argnums=(0, 1, 2)))(x, w, params)
    for g, r in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert rel_err(g, r) < 1e-5


def test_check_grads_small():
    rng = np.random.default_rng()
    with jax.enable_x64(True):
        x, idx, w, params = case(rng, T=3, H=4, I=2, E=3, k=2, dtype=np.float64)
        w = w.astype(np.float64)
        f = lambda x, w, p: moe_experts(x, idx, w, p, activation="swiglu", implementation="xla")
        check_grads(f, (x, w, params), order=1, modes=["rev"], eps=1e-4)


def test_zero_tokens():
    rng = np.random.default_rng()
    _, _, _, params = case(rng)
    out = moe_experts(
        np.zeros((0, 16), np.float32),
        np.zeros((0, 2), np.int32),
        np.zeros((0, 2), np.float32),
        params,
        activation="swiglu",
    )
    assert out.shape == (0, 16)


def bad_inputs():
    rng = np.random.default_rng(0)
    x, idx, w, params = case(rng)
    p = lambda **kw: {**params, **kw}
    return [
        (dict(x=x[None]), TypeError, "x must be"),
        (dict(x=x.astype(np.int32)), TypeError, "x must be"),
        (dict(idx=idx.astype(np.float32)), TypeError, "topk_idx"),
        (dict(idx=idx[:-1], w=w[:-1]), ValueError, "tokens"),
        (dict(w=w[:, :1]), TypeError, "topk_weight"),
        (dict(params=p(w_gate_up=params["w_gate_up"][:, :-1])), ValueError, "H="),
        (dict(params=p(w_down=params["w_down"][:-1])), ValueError, "w_down"),
        (dict(params=p(b_down=params["b_down"][:, :-1])), ValueError, "b_down"),
        (dict(params=p(w_down=params["w_down"].astype(np.float16))), TypeError, "cast"),
        (dict(params={"w_gate_up": params["w_gate_up"]}), ValueError, "w_down"),
        (dict(params=p(w_up=params["w_down"])), ValueError, "unknown"),
        (dict(activation="gelu"), ValueError, "activation"),
        (dict(implementation="cuda"), ValueError, "implementation"),
    ]


@pytest.mark.parametrize("change,error,match", bad_inputs())
def test_bad_input_is_named(change, error, match):
    rng = np.random.default_rng(0)
    x, idx, w, params = case(rng)
    args = (
        dict(x=x, idx=idx, w=w, params=params, activation="swiglu", implementation="xla") | change
    )
    with pytest.raises(error, match=match):
        moe_experts(
            args["x"],
            args["idx"],
            args["w"],
            args["params"],
            activation=args["activation"],
            implementation=args["implementation"],
        )


def test_params_as_dataclass():
    import dataclasses

    @dataclasses.dataclass
    class Experts:
        w_gate_up: np.ndarray
        w_down: np.ndarray
        b_gate_up: np.ndarray | None = None
        b_down: np.ndarray | None = None

    rng = np.random.default_rng()
    x, idx, w, params = case(rng)
    got = moe_experts(x, idx, w, Experts(**params), activation="gptoss", implementation="xla")
    want = moe_experts(x, idx, w, params, activation="gptoss", implementation="xla")
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
