"""Input handling of the public ops under non-default settings and odd inputs
(docs/reliability.md): jax_enable_x64, meshes from `jax.make_mesh`, NaN in expert weights,
array-likes and numpy inputs, and error messages that name the user's argument.

Tests that need x64 enable it for their own body only (`jax.enable_x64` is a context manager
in jax 0.11.2 and part of jit's cache key), so the rest of the suite keeps 32-bit defaults.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moe_pallas import moe_experts, ragged_dot, tgmm
from moe_pallas.reference import moe_experts_reference
from tests.helpers import make_params, random_routing

F32, F64, I32 = jnp.float32, jnp.float64, jnp.int32


def rel_err(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert np.isfinite(got).all()
    return np.linalg.norm(got - want) / np.linalg.norm(want)


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield
    assert not jax.config.jax_enable_x64


# --- jax_enable_x64 ----------------------------------------------------------------------------


@pytest.mark.parametrize("impl", ["pallas_triton", "xla"])
def test_ops_and_grads_under_x64_with_float32_operands(x64, impl):
    """float32 operands and int32 group sizes under x64: the kernels' index arithmetic stays
    int32 (a Python int next to an int32 value would be int64 there)."""
    rng = np.random.default_rng()
    lhs = jnp.asarray(rng.standard_normal((20, 16)), F32)
    rhs = jnp.asarray(rng.standard_normal((3, 16, 24)), F32)
    rows = jnp.asarray(rng.standard_normal((20, 24)), F32)
    sizes = jnp.asarray([7, 0, 11], I32)
    lhs64, rhs64, rows64 = (np.asarray(a, np.float64) for a in (lhs, rhs, rows))
    ends = np.cumsum([0, 7, 0, 11])
    want_dot = np.zeros((20, 24))
    want_tgmm = np.zeros((3, 16, 24))
    for g in range(3):
        r = slice(ends[g], ends[g + 1])
        want_dot[r] = lhs64[r] @ rhs64[g]
        want_tgmm[g] = lhs64[r].T @ rows64[r]
    dot = lambda a, b: ragged_dot(a, b, sizes, implementation=impl)
    assert dot(lhs, rhs).dtype == F32
    assert rel_err(dot(lhs, rhs), want_dot) < 1e-5
    got_tgmm = tgmm(lhs, rows, sizes, implementation=impl)
    assert got_tgmm.dtype == F32 and rel_err(got_tgmm, want_tgmm) < 1e-5
    d_lhs, d_rhs = jax.grad(lambda a, b: jnp.sum(dot(a, b) * rows), (0, 1))(lhs, rhs)
    assert rel_err(d_rhs, want_tgmm) < 1e-5
    d_lhs_t, d_rows = jax.grad(
        lambda a, r: jnp.sum(tgmm(a, r, sizes, implementation=impl) * rhs), (0, 1)
    )(lhs, rows)
    assert d_lhs.shape == d_lhs_t.shape == lhs.shape and d_rows.shape == rows.shape


@pytest.mark.parametrize("impl, activation", [("pallas_triton", "gptoss"), ("xla", "swiglu")])
def test_moe_experts_under_x64_with_float32_inputs(x64, impl, activation):
    rng = np.random.default_rng()
    tokens, hidden, inter, experts, top_k = 12, 16, 24, 4, 2
    params = make_params(rng, experts, hidden, inter, biases=activation == "gptoss")
    params = {k: jnp.asarray(v) for k, v in params.items()}
    idx, w = (jnp.asarray(a) for a in random_routing(rng, tokens, experts, top_k))
    x = jnp.asarray(rng.standard_normal((tokens, hidden)), F32)
    cot = jnp.asarray(rng.standard_normal((tokens, hidden)), F32)
    f = lambda x, w, p: moe_experts(x, idx, w, p, activation=activation, implementation=impl)
    ref = lambda x, w, p: moe_experts_reference(x, idx, w, p, activation=activation, dtype=F64)
    out, vjp = jax.vjp(f, x, w, params)
    want, want_vjp = jax.vjp(ref, *jax.tree.map(lambda a: a.astype(F64), (x, w, params)))
    assert out.dtype == F32 and rel_err(out, want) < 1e-4
    got_grads, want_grads = vjp(cot), want_vjp(cot.astype(F64))
    for got, want in zip(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads)):
        assert got.dtype == F32 and rel_err(got, want) < 1e-3


def test_mosaic_gpu_kernels_under_x64(x64):
    """The Mosaic GPU gmm and tgmm (interpret mode) on bf16 with int32 sizes under x64."""
    from moe_pallas.kernels import gmm_mgpu, tgmm_mgpu

    rng = np.random.default_rng()
    lhs = jnp.asarray(rng.standard_normal((64, 64)), jnp.bfloat16)
    rhs = jnp.asarray(rng.standard_normal((2, 64, 64)) / 8, jnp.bfloat16)
    sizes = jnp.asarray([20, 44], I32)
    a, b = np.asarray(lhs, np.float64), np.asarray(rhs, np.float64)
    want = np.concatenate([a[:20] @ b[0], a[20:] @ b[1]])
    assert rel_err(gmm_mgpu.gmm(lhs, rhs, sizes, out_dtype=F32), want) < 1e-5
    want_t = np.stack([a[:20].T @ a[:20], a[20:].T @ a[20:]])
    assert rel_err(tgmm_mgpu.tgmm(lhs, lhs, sizes, out_dtype=F32), want_t) < 1e-5


def test_float64_under_x64_runs_on_xla_and_is_refused_by_the_kernels(x64):
    rng = np.random.default_rng()
    lhs = jnp.asarray(rng.standard_normal((10, 8)), F64)
    rhs = jnp.asarray(rng.standard_normal((2, 8, 4)), F64)
    sizes = jnp.asarray([4, 6], I32)
    out = ragged_dot(lhs, rhs, sizes, implementation="xla")
    want = np.concatenate([np.asarray(lhs[:4]) @ np.asarray(rhs[0]), np.asarray(lhs[4:]) @ rhs[1]])
    assert out.dtype == F64 and rel_err(out, want) < 1e-12
    for impl in ("pallas_triton", "mosaic_gpu"):
        with pytest.raises(TypeError, match="lhs is float64.*implementation='xla'"):
            ragged_dot(lhs, rhs, sizes, implementation=impl)
        with pytest.raises(TypeError, match="lhs is float64"):
            tgmm(lhs, lhs, sizes, implementation=impl)
    params = {k: jnp.asarray(v, F64) for k, v in make_params(rng, 2, 8, 4, biases=False).items()}
    idx, w = (jnp.asarray(a) for a in random_routing(rng, 10, 2, 1))
    out = moe_experts(lhs, idx, w, params, activation="swiglu", implementation="xla")
    want = moe_experts_reference(lhs, idx, w, params, activation="swiglu", dtype=F64)
    assert out.dtype == F64 and rel_err(out, want) < 1e-12
    with pytest.raises(TypeError, match="x is float64"):
        moe_experts(lhs, idx, w, params, activation="swiglu", implementation="pallas_triton")
