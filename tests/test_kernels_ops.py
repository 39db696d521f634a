"""Public ragged_dot / tgmm: forward against jax and float64, gradients, jit, vmap, validation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import moe_pallas
from moe_pallas import backends
from moe_pallas.kernels import _common
from tests.test_kernels_gmm import gmm64, random_group_sizes, rel_err, tgmm64

TOL = {jnp.float32: 1e-5, jnp.bfloat16: 1e-2}
IMPLS = ["pallas_triton", "xla"]


def _tol(dtype):
    return 2e-3 if dtype == jnp.float32 and jax.default_backend() == "gpu" else TOL[dtype]


def _problem(seed, m=40, k=32, n=24, g=5, dtype=jnp.float32, tail=3):
    rng = np.random.default_rng(seed)
    lhs = jnp.asarray(rng.standard_normal((m, k)), dtype)
    rhs = jnp.asarray(rng.standard_normal((g, k, n)) / np.sqrt(k), dtype)
    sizes = jnp.asarray(random_group_sizes(rng, g, m - tail))
    d_out = jnp.asarray(rng.standard_normal((m, n)), dtype)
    return lhs, rhs, sizes, d_out


def _ragged(impl):
    return lambda lhs, rhs, sizes: moe_pallas.ragged_dot(lhs, rhs, sizes, implementation=impl)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_ragged_dot_forward(impl, dtype):
    lhs, rhs, sizes, _ = _problem(10, dtype=dtype)
    out = jax.jit(_ragged(impl))(lhs, rhs, sizes)
    assert out.shape == (40, 24) and out.dtype == dtype
    assert rel_err(out, gmm64(lhs, rhs, sizes)) < _tol(dtype)
    assert not np.asarray(out[int(sizes.sum()) :]).any()
    out32 = moe_pallas.ragged_dot(
        lhs, rhs, sizes, preferred_element_type=jnp.float32, implementation=impl
    )
    assert out32.dtype == jnp.float32


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_ragged_dot_grads_match_xla(dtype):
    lhs, rhs, sizes, d_out = _problem(11, dtype=dtype)

    def loss(impl):
        def f(lhs, rhs):
            out = moe_pallas.ragged_dot(lhs, rhs, sizes, implementation=impl)
            return jnp.sum(out.astype(jnp.float32) * d_out.astype(jnp.float32))

        return jax.jit(jax.grad(f, argnums=(0, 1)))(lhs, rhs)

    for got, want in zip(loss("pallas_triton"), loss("xla")):
        assert got.dtype == want.dtype
        assert rel_err(got, np.asarray(want, np.float64)) < 5 * _tol(dtype)


def test_ragged_dot_check_grads():
    lhs, rhs, sizes, _ = _problem(12, m=12, k=16, n=16, g=3, tail=2)
    f = lambda lhs, rhs: moe_pallas.ragged_dot(lhs, rhs, sizes, implementation="pallas_triton")
    check_grads(f, (lhs, rhs), order=1, modes=["rev"], eps=1e-2, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("impl", IMPLS)
def test_tgmm_forward_and_grads(impl):
    rng = np.random.default_rng(13)
    m, k, n, g = 40, 24, 32, 6
    lhs = jnp.asarray(rng.standard_normal((m, k)), jnp.float32)
    rhs = jnp.asarray(rng.standard_normal((m, n)), jnp.float32)
    sizes = jnp.asarray(random_group_sizes(rng, g, m - 4))
    out = moe_pallas.tgmm(lhs, rhs, sizes, implementation=impl)
    assert out.shape == (g, k, n)
    assert rel_err(out, tgmm64(lhs, rhs, sizes)) < _tol(jnp.float32)
    d_out = jnp.asarray(rng.standard_normal((g, k, n)), jnp.float32)

    def grads(impl):
        f = lambda lhs, rhs: jnp.sum(moe_pallas.tgmm(lhs, rhs, sizes, implementation=impl) * d_out)
        return jax.jit(jax.grad(f, argnums=(0, 1)))(lhs, rhs)

    for got, want in zip(grads(impl), grads("xla")):
        assert rel_err(got, np.asarray(want, np.float64)) < _tol(jnp.float32)


def test_ragged_dot_vmap_over_lhs():
    lhs, rhs, sizes, _ = _problem(14, m=20, k=16, n=16, g=3, tail=0)
    batch = jnp.stack([lhs, -2 * lhs])
    f = lambda lhs: moe_pallas.ragged_dot(lhs, rhs, sizes, implementation="pallas_triton")
    out = jax.vmap(f)(batch)
    for b in range(2):
        assert rel_err(out[b], gmm64(batch[b], rhs, sizes)) < _tol(jnp.float32)


def test_validation_errors_name_the_argument():
    lhs, rhs, sizes, _ = _problem(15, m=8, k=16, n=16, g=2, tail=0)
    with pytest.raises(ValueError, match="lhs must be 2-D"):
        moe_pallas.ragged_dot(lhs[None], rhs, sizes)
    with pytest.raises(ValueError, match="rhs must be 3-D"):
        moe_pallas.ragged_dot(lhs, rhs[0], sizes)
    with pytest.raises(ValueError, match="disagree on K"):
        moe_pallas.ragged_dot(lhs[:, :8], rhs, sizes)
    with pytest.raises(TypeError, match="group_sizes must be integer"):
        moe_pallas.ragged_dot(lhs, rhs, sizes.astype(jnp.float32))
    with pytest.raises(ValueError, match=r"group_sizes must have shape \(2,\)"):
        moe_pallas.ragged_dot(lhs, rhs, sizes[:1])
    with pytest.raises(TypeError, match="lhs must be a floating"):
        moe_pallas.ragged_dot(lhs.astype(jnp.int32), rhs, sizes)
    with pytest.raises(ValueError, match="same rows"):
        moe_pallas.tgmm(lhs, lhs[:4], sizes)


def test_backend_resolution():
    expected = "auto" if jax.default_backend() == "gpu" else "xla"
    assert backends.resolve("auto") == expected
    assert _common.interpret_mode() == (jax.default_backend() != "gpu")
    assert backends.resolve("mosaic_gpu") == "mosaic_gpu"
    with pytest.raises(ValueError, match="implementation="):
        backends.resolve("cuda")
