"""gmm / tgmm kernels in interpret mode (CPU) or compiled (GPU) against float64 oracles.

Interpret mode fills pallas_call outputs with NaN before the kernel runs, so `rel_err` (which
rejects NaN) also proves every output element was written.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moe_pallas.kernels import BlockConfig, gmm, tgmm


# float64 numpy oracles, independent of the kernels and of jax (also used by test_kernels_ops).
def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def glu64(h, activation):
    if activation == "gptoss":
        gate, up = np.minimum(h[:, 0::2], 7.0), np.clip(h[:, 1::2], -7.0, 7.0)
        return (up + 1) * gate * _sigmoid(1.702 * gate)
    half = h.shape[1] // 2
    gate, up = h[:, :half], h[:, half:]
    return gate * _sigmoid(gate) * up


def group_bounds(group_sizes, num_rows):
    ends = np.minimum(np.cumsum(np.asarray(group_sizes, np.int64)), num_rows)
    return np.concatenate([[0], ends[:-1]]), ends


def gmm64(
    lhs,
    rhs,
    group_sizes,
    *,
    lhs_row_index=None,
    transpose_rhs=False,
    bias=None,
    activation=None,
    row_scale=None,
):
    x = np.asarray(lhs, np.float64)
    if lhs_row_index is not None:
        x = x[np.asarray(lhs_row_index)]
    w = np.asarray(rhs, np.float64)
    if transpose_rhs:
        w = w.transpose(0, 2, 1)
    n = w.shape[2] // 2 if activation else w.shape[2]
    out = np.zeros((x.shape[0], n))
    for g, (s, e) in enumerate(zip(*group_bounds(group_sizes, x.shape[0]))):
        h = x[s:e] @ w[g]
        if bias is not None:
            h = h + np.asarray(bias, np.float64)[g]
        out[s:e] = glu64(h, activation) if activation else h
    if row_scale is not None:
        out = out * np.asarray(row_scale, np.float64)[:, None]
    return out


def tgmm64(lhs, rhs, group_sizes, *, lhs_row_index=None):
    x = np.asarray(lhs, np.float64)
    if lhs_row_index is not None:
        x = x[np.asarray(lhs_row_index)]
    y = np.asarray(rhs, np.float64)
    starts, ends = group_bounds(group_sizes, y.shape[0])
    return np.stack([x[s:e].T @ y[s:e] for s, e in zip(starts, ends)])


def rel_err(out, ref):
    out = np.asarray(out, np.float64)
    assert not np.isnan(out).any(), "NaN in the output: a row or tile was never written"
    return np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30)


def random_group_sizes(rng, num_groups, total):
    """Random sizes summing to `total`, with about a third of the groups empty."""
    weights = rng.random(num_groups) * (rng.random(num_groups) > 0.33)
    if weights.sum() == 0:
        weights[rng.integers(num_groups)] = 1.0
    sizes = np.floor(weights / weights.sum() * total).astype(np.int32)
    sizes[np.argmax(weights)] += total - sizes.sum()
    return sizes


CFG = BlockConfig(block_m=16, block_n=32, block_k=16, group_m=2)
TOL = {jnp.float32: 1e-5, jnp.bfloat16: 1e-2}


def _tol(dtype):
    # f32 dots on GPU tensor cores run in tf32.
    return 2e-3 if dtype == jnp.float32 and jax.default_backend() == "gpu" else TOL[dtype]


def _sizes(rng, mode, num_groups, num_rows):
    if mode == "random":
        return random_group_sizes(rng, num_groups, num_rows)
    if mode == "one_group":
        sizes = np.zeros(num_groups, np.int32)
        sizes[num_groups // 2] = num_rows
        return sizes
    if mode == "tail":  # rows past sum(group_sizes) must come out as zeros
        return random_group_sizes(rng, num_groups, num_rows - 5)
    raise ValueError(mode)


CASES = [  # (M, K, N, G, mode, dtype)
    (40, 48, 40, 5, "random", jnp.float32),  # M, K, N not multiples of the blocks
    (64, 32, 64, 8, "random", jnp.bfloat16),
    (1, 16, 32, 3, "random", jnp.float32),
    (37, 32, 32, 4, "one_group", jnp.float32),
    (30, 16, 48, 6, "tail", jnp.float32),
]


def _arrays(rng, m, k, n, g, dtype, m_src=None):
    lhs = jnp.asarray(rng.standard_normal((m_src or m, k)), dtype)
    rhs = jnp.asarray(rng.standard_normal((g, k, n)) / np.sqrt(k), dtype)
    return lhs, rhs


@pytest.mark.parametrize("m,k,n,g,mode,dtype", CASES)
def test_gmm_plain(m, k, n, g, mode, dtype):
    rng = np.random.default_rng(m * 7 + k + n + g)
    lhs, rhs = _arrays(rng, m, k, n, g, dtype)
    sizes = _sizes(rng, mode, g, m)
    out = gmm(lhs, rhs, jnp.asarray(sizes), config=CFG)
    assert out.shape == (m, n) and out.dtype == dtype
    assert rel_err(out, gmm64(lhs, rhs, sizes)) < _tol(dtype)
    if mode == "tail":
        assert not np.asarray(out[sizes.sum() :]).any()


def test_gmm_matches_lax_ragged_dot():
    rng = np.random.default_rng(1)
    lhs, rhs = _arrays(rng, 50, 32, 40, 6, jnp.float32)
    sizes = jnp.asarray(random_group_sizes(rng, 6, 45))
    ref = jax.lax.ragged_dot(lhs, rhs, sizes, precision=jax.lax.Precision.HIGHEST)
    assert rel_err(gmm(lhs, rhs, sizes, config=CFG), np.asarray(ref, np.float64)) < _tol(
        jnp.float32
    )


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_gmm_gather_transpose(dtype):
    rng = np.random.default_rng(2)
    m, m_src, k, n, g = 45, 20, 40, 48, 5
    lhs = jnp.asarray(rng.standard_normal((m_src, k)), dtype)
    rhs_t = jnp.asarray(rng.standard_normal((g, n, k)) / np.sqrt(k), dtype)
    index = jnp.asarray(rng.integers(0, m_src, m), jnp.int32)
    sizes = random_group_sizes(rng, g, m - 3)
    out = gmm(
        lhs,
        rhs_t,
        jnp.asarray(sizes),
        lhs_row_index=index,
        transpose_rhs=True,
        out_dtype=jnp.float32,
        config=CFG,
    )
    assert out.dtype == jnp.float32
    ref = gmm64(lhs, rhs_t, sizes, lhs_row_index=index, transpose_rhs=True)
    assert rel_err(out, ref) < _tol(dtype)


@pytest.mark.parametrize("activation", ["swiglu", "gptoss"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_gmm_epilogue(activation, dtype):
    rng = np.random.default_rng(3)
    m, m_src, k, n_out, g = 40, 16, 32, 24, 4  # n_out not a multiple of block_n
    lhs = jnp.asarray(rng.standard_normal((m_src, k)), dtype)
    # Scaled so a fair share of the gpt-oss clamps (|h| > 7) bite.
    rhs = jnp.asarray(rng.standard_normal((g, k, 2 * n_out)) * 1.5, dtype)
    bias = jnp.asarray(rng.standard_normal((g, 2 * n_out)), dtype)
    index = jnp.asarray(rng.integers(0, m_src, m), jnp.int32)
    row_scale = jnp.asarray(rng.random(m), jnp.float32)
    sizes = random_group_sizes(rng, g, m - 2)
    out = gmm(
        lhs,
        rhs,
        jnp.asarray(sizes),
        lhs_row_index=index,
        bias=bias,
        activation=activation,
        row_scale=row_scale,
        config=CFG,
    )
    assert out.shape == (m, n_out)
    ref = gmm64(
        lhs, rhs, sizes, lhs_row_index=index, bias=bias, activation=activation, row_scale=row_scale
    )
    assert rel_err(out, ref) < _tol(dtype)
    assert not np.asarray(out[sizes.sum() :]).any()


def test_gmm_num_rows_and_validation():
    rng = np.random.default_rng(4)
    lhs, rhs = _arrays(rng, 20, 16, 16, 2, jnp.float32)
    out = gmm(lhs, rhs, jnp.asarray([4, 6], jnp.int32), num_rows=12, config=CFG)
    assert rel_err(out, gmm64(lhs[:12], rhs, [4, 6])) < _tol(jnp.float32)
    with pytest.raises(ValueError, match="K="):
        gmm(lhs[:, :8], rhs, jnp.asarray([4, 6], jnp.int32))
    with pytest.raises(ValueError, match="even"):
        gmm(lhs, rhs[:, :, :15], jnp.asarray([4, 6], jnp.int32), activation="swiglu")


@pytest.mark.parametrize(
    "m,k,n,g,mode,dtype",
    [
        (40, 48, 40, 6, "random", jnp.float32),
        (64, 32, 32, 4, "random", jnp.bfloat16),
        (30, 16, 32, 5, "tail", jnp.float32),
        (1, 16, 16, 3, "one_group", jnp.float32),
    ],
)
def test_tgmm(m, k, n, g, mode, dtype):
    rng = np.random.default_rng(m + k * 3 + n + g)
    lhs = jnp.asarray(rng.standard_normal((m, k)), dtype)
    rhs = jnp.asarray(rng.standard_normal((m, n)), dtype)
    sizes = _sizes(rng, mode, g, m)
    out = tgmm(lhs, rhs, jnp.asarray(sizes), config=CFG)
    assert out.shape == (g, k, n) and out.dtype == dtype
    assert rel_err(out, tgmm64(lhs, rhs, sizes)) < _tol(dtype)
    assert not np.asarray(out[sizes == 0]).any(), "empty groups must give exact zeros"


@pytest.mark.parametrize("tiles_per_program", [1, 3, 8])
def test_tgmm_tiles_per_program(tiles_per_program):
    """A program walks group_m output tiles (here 4 n-tiles: chunks of 1, 3 + 1, one short 4)."""
    rng = np.random.default_rng(tiles_per_program)
    m, k, n, g = 45, 24, 112, 6
    lhs = jnp.asarray(rng.standard_normal((m, k)), jnp.float32)
    rhs = jnp.asarray(rng.standard_normal((m, n)), jnp.float32)
    sizes = random_group_sizes(rng, g, m - 3)
    sizes[[1, 4]] += sizes[[0, 3]]
    sizes[[0, 3]] = 0  # empty groups, one of them first
    cfg = dataclasses.replace(CFG, group_m=tiles_per_program)
    out = tgmm(lhs, rhs, jnp.asarray(sizes), config=cfg)
    assert rel_err(out, tgmm64(lhs, rhs, sizes)) < _tol(jnp.float32)
    assert not np.asarray(out[sizes == 0]).any(), "empty groups must give exact zeros"


def test_tgmm_gather():
    rng = np.random.default_rng(5)
    m, m_src, k, n, g = 50, 12, 40, 24, 5
    lhs = jnp.asarray(rng.standard_normal((m_src, k)), jnp.float32)
    rhs = jnp.asarray(rng.standard_normal((m, n)), jnp.float32)
    index = jnp.asarray(rng.integers(0, m_src, m), jnp.int32)
    sizes = random_group_sizes(rng, g, m - 4)
    out = tgmm(lhs, rhs, jnp.asarray(sizes), lhs_row_index=index, config=CFG)
    assert rel_err(out, tgmm64(lhs, rhs, sizes, lhs_row_index=index)) < _tol(jnp.float32)
