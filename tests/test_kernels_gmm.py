"""gmm / tgmm kernels in interpret mode (CPU) or compiled (GPU) against float64 oracles.

Interpret mode fills pallas_call outputs with NaN before the kernel runs, so `rel_err` (which
rejects NaN) also proves every output element was written.
"""

import dataclasses
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moe_pallas.backends import pallas_triton
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


def test_gmm_validation():
    rng = np.random.default_rng(4)
    lhs, rhs = _arrays(rng, 20, 16, 16, 2, jnp.float32)
    with pytest.raises(ValueError, match="K="):
        gmm(lhs[:, :8], rhs, jnp.asarray([4, 6], jnp.int32))
    with pytest.raises(ValueError, match="even"):
        gmm(lhs, rhs[:, :, :15], jnp.asarray([4, 6], jnp.int32), activation="swiglu")


# Bucketed M: a visit runs the smallest tile height of cfg.m_paths() that covers its rows.
PATH_CFGS = [
    BlockConfig(block_m=64, block_n=32, block_k=16, group_m=2, min_block_m=16),  # 64, 32, 16
    BlockConfig(block_m=32, block_n=32, block_k=16, group_m=2, min_block_m=16),  # 32, 16
    # 32, 16, and a last visit of up to 32 + 32 rows through the tail path
    BlockConfig(block_m=32, block_n=32, block_k=16, group_m=2, min_block_m=16, tail_m=32),
]


def _cfg_id(c):
    return f"bm{c.block_m}-min{c.min_block_m}" + (f"-tail{c.tail_m}" if c.tail_m else "")


def path_sizes(cfg):
    """Group sizes at the edges of every path p (1, p/2, p/2 + 1, p, p + 1), each after an empty
    group; p + 1 rows past block_m take a second visit of 1 row, or with tail_m the tail path,
    whose edges (block_m + tail_m, + 1, and after a full visit) are added."""
    edges = {s for p in cfg.m_paths() for s in (1, p // 2, p // 2 + 1, p, p + 1)}
    bm, tail = cfg.block_m, cfg.tail_m
    if tail:
        edges |= {bm + tail, bm + tail + 1, 2 * bm + 1, 2 * bm + tail}
    edges = sorted(edges)
    sizes = np.zeros(2 * len(edges), np.int32)
    sizes[1::2] = edges
    return sizes


def visit_heights(cfg, size):
    """The tile height that writes each row of a group of `size` rows: full block_m visits, the
    last visit on the smallest path covering it or, past block_m, block_m rows then tail_m."""
    bm, tail = cfg.block_m, cfg.tail_m
    visits = max(1, -(-(size - tail) // bm)) if tail else -(-size // bm)
    heights = [bm] * (bm * (visits - 1))
    last = size - bm * (visits - 1)
    if last > bm:
        return heights + [bm] * bm + [tail] * (last - bm)
    return heights + [min(p for p in cfg.m_paths() if p >= last)] * last


def test_block_config_paths():
    assert BlockConfig(128, min_block_m=16).m_paths() == (128, 64, 32, 16)
    assert BlockConfig(128).m_paths() == (128,)
    assert BlockConfig(64, min_block_m=64).m_paths() == (64,)
    fitted = BlockConfig(128, 64, 64, min_block_m=32).fit(20, 64, 64)
    assert (fitted.block_m, fitted.min_block_m, fitted.m_paths()) == (32, 32, (32,))
    assert BlockConfig(128, min_block_m=16).fit(40, 64, 64).m_paths() == (64, 32, 16)
    assert BlockConfig(128).fit(40, 64, 64).min_block_m is None
    with pytest.raises(ValueError, match="power of 2"):
        BlockConfig(128, min_block_m=24)
    with pytest.raises(ValueError, match="power of 2"):
        BlockConfig(128, min_block_m=8)
    assert BlockConfig(128, tail_m=32).fit(4096, 64, 64).tail_m == 32
    assert BlockConfig(128, tail_m=32).fit(40, 64, 64).tail_m == 0  # one tile holds every row
    for bad in (8, 16, 24, 256):  # 16: wrong rows on the H200 (kernels/gmm.py, Tails)
        with pytest.raises(ValueError, match="tail_m"):
            BlockConfig(128, tail_m=bad)
    with pytest.raises(ValueError, match="num_warps=8"):  # 32 at 8 warps: the same fault
        BlockConfig(128, 256, 64, num_warps=8, tail_m=32)
    assert BlockConfig(128, 256, 64, num_warps=8, tail_m=64).tail_m == 64


@pytest.mark.parametrize("cfg", PATH_CFGS, ids=_cfg_id)
def test_gmm_path_choice(cfg, monkeypatch):
    """Each visit of r rows runs the smallest path p >= r: with the epilogue replaced by the tile
    height, every row reports the path that wrote it."""
    gmm_module = importlib.import_module("moe_pallas.kernels.gmm")  # the name gmm is the function
    monkeypatch.setattr(gmm_module, "glu", lambda gate, up, act: jnp.full_like(gate, len(gate)))
    sizes = path_sizes(cfg)
    m, k, g = int(sizes.sum()) + 5, 16, len(sizes)
    out = gmm(
        jnp.ones((m, k), jnp.float32),
        jnp.ones((g, k, 64), jnp.float32),
        jnp.asarray(sizes),
        activation="swiglu",
        config=cfg,
    )
    want = np.zeros(m)
    for start, size in zip(group_bounds(sizes, m)[0], sizes):
        if size:
            want[start : start + size] = visit_heights(cfg, int(size))
    assert (np.asarray(out) == want[:, None]).all()
    assert set(want[: sizes.sum()]) == set(cfg.m_paths()), "every path runs"


@pytest.mark.parametrize("variant", ["plain", "transpose_gather", "swiglu", "gptoss"])
@pytest.mark.parametrize("cfg", PATH_CFGS, ids=_cfg_id)
def test_gmm_paths(cfg, variant):
    """Every path at its edge sizes, with empty groups and rows past the last group (zeros).
    Poisoned inputs no visit may read: NaN weights (and bias) of the empty groups, NaN lhs rows
    past the groups (plain) or outside the gather index."""
    rng = np.random.default_rng(cfg.block_m)
    sizes = path_sizes(cfg)
    g, k, n_out = len(sizes), 24, 40  # K and N tails masked
    m = int(sizes.sum()) + 5
    activation = variant if variant in ("swiglu", "gptoss") else None
    gather = variant != "plain"
    m_src = 20 if gather else m
    lhs = rng.standard_normal((m_src, k))
    rhs = rng.standard_normal((g, k, 2 * n_out if activation else n_out)) / np.sqrt(k)
    if activation:
        rhs *= 3  # a fair share of the gpt-oss clamps (|h| > 7) bite
    if variant == "transpose_gather":
        rhs = rhs.transpose(0, 2, 1)
    rhs[sizes == 0] = np.nan
    kwargs = {"transpose_rhs": variant == "transpose_gather", "activation": activation}
    if gather:
        kwargs["lhs_row_index"] = jnp.asarray(rng.integers(0, m_src - 2, m), jnp.int32)
        lhs[m_src - 2 :] = np.nan
    else:
        lhs[sizes.sum() :] = np.nan
    if activation:
        bias = rng.standard_normal((g, 2 * n_out))
        bias[sizes == 0] = np.nan
        kwargs["bias"] = jnp.asarray(bias, jnp.float32)
        kwargs["row_scale"] = jnp.asarray(rng.random(m), jnp.float32)
    lhs, rhs = jnp.asarray(lhs, jnp.float32), jnp.asarray(rhs, jnp.float32)
    out = gmm(lhs, rhs, jnp.asarray(sizes), config=cfg, **kwargs)
    assert out.shape == (m, n_out)
    assert rel_err(out, gmm64(lhs, rhs, sizes, **kwargs)) < _tol(jnp.float32)
    assert not np.asarray(out[sizes.sum() :]).any()


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


@pytest.mark.parametrize(
    "k, gather, dtype",
    [
        (40, False, jnp.float32),  # K tail: the ones column in the last k-tile's padding
        (32, True, jnp.float32),  # block_k divides K: one more k-tile, gathered lhs
        (48, False, jnp.bfloat16),
    ],
)
def test_tgmm_rhs_sums(k, gather, dtype):
    """rhs_sums: the per-group sums of rhs (the bias gradient) from the same kernel; the product
    unchanged; empty groups and rows past the groups give zeros; a NaN row stays in its group."""
    rng = np.random.default_rng(k)
    m, n, g = 45, 40, 6
    lhs = jnp.asarray(rng.standard_normal((m, k)), dtype)
    rhs_np = rng.standard_normal((m, n))
    sizes = random_group_sizes(rng, g, m - 3)
    sizes[[1, 4]] += sizes[[0, 3]]
    sizes[[0, 3]] = 0
    rhs_np[m - 1, 5] = np.nan  # past every group: must not reach any sum
    rhs = jnp.asarray(rhs_np, dtype)
    index = jnp.asarray(rng.integers(0, m, m), jnp.int32) if gather else None
    cfg = dataclasses.replace(CFG, block_k=16 if k == 40 else 32)
    out, sums = tgmm(lhs, rhs, jnp.asarray(sizes), lhs_row_index=index, config=cfg, rhs_sums=True)
    assert sums.shape == (g, n) and sums.dtype == jnp.float32
    assert rel_err(out, tgmm64(lhs, rhs, sizes, lhs_row_index=index)) < _tol(dtype)
    ends = np.cumsum(sizes)
    rows = np.asarray(rhs, np.float64)
    want = np.stack([rows[e - s : e].sum(0) for s, e in zip(sizes, ends)])
    assert rel_err(sums, want) < _tol(dtype)
    assert not np.asarray(sums[sizes == 0]).any()


@pytest.mark.parametrize("gather, rhs_sums", [(False, False), (True, True)])
def test_tgmm_one_and_many_row_steps(gather, rhs_sums):
    """Groups of at most block_m rows (lhs tile loaded once) next to groups of 2-3 row steps (the
    pipelined loop), unaligned starts, empty groups, NaN in the rows past the groups."""
    rng = np.random.default_rng(11)
    sizes = np.array([16, 0, 17, 5, 40, 1, 0, 9], np.int32)  # block_m = 16
    m, k, n = int(sizes.sum()) + 3, 40, 72
    lhs_np = rng.standard_normal((m, k))
    rhs_np = rng.standard_normal((m, n))
    rhs_np[m - 3 :] = np.nan
    index = None
    if gather:
        index = jnp.asarray(rng.integers(0, m - 3, m), jnp.int32)
    else:
        lhs_np[m - 3 :] = np.nan
    lhs, rhs = jnp.asarray(lhs_np, jnp.float32), jnp.asarray(rhs_np, jnp.float32)
    cfg = dataclasses.replace(CFG, group_m=3)
    out = tgmm(lhs, rhs, jnp.asarray(sizes), lhs_row_index=index, config=cfg, rhs_sums=rhs_sums)
    if rhs_sums:
        out, sums = out
        ends = np.cumsum(sizes)
        want = np.stack([rhs_np[e - s : e].sum(0) for s, e in zip(sizes, ends)])
        assert rel_err(sums, want) < _tol(jnp.float32)
    assert rel_err(out, tgmm64(lhs, rhs, sizes, lhs_row_index=index)) < _tol(jnp.float32)
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


@pytest.mark.parametrize("rhs_sums", [False, True])
def test_tgmm_overflow_mode(rhs_sums):
    """row_skip + accumulate: the rows of each group past its first row_skip are added to the
    given arrays (one- and many-step groups); groups with no rows left keep theirs bit for bit."""
    rng = np.random.default_rng(21)
    sizes = np.array([5, 0, 40, 20, 9, 37], np.int32)  # row_skip 9: 0, 0, 31, 11, 0, 28 rows
    m, k, n, g, skip = int(sizes.sum()) + 2, 40, 72, 6, 9
    lhs = jnp.asarray(rng.standard_normal((m, k)), jnp.float32)
    rhs_np = rng.standard_normal((m, n))
    rhs_np[m - 2 :] = np.nan  # past every group
    rhs = jnp.asarray(rhs_np, jnp.float32)
    out_init = jnp.asarray(rng.standard_normal((g, k, n)), jnp.float32)
    sums_init = jnp.asarray(rng.standard_normal((g, n)), jnp.float32) if rhs_sums else None
    got = tgmm(
        lhs,
        rhs,
        jnp.asarray(sizes),
        config=CFG,
        rhs_sums=rhs_sums,
        row_skip=skip,
        accumulate=(out_init, sums_init),
    )
    out, sums = got if rhs_sums else (got, None)
    kept = np.maximum(sizes - skip, 0)
    starts = np.cumsum(sizes) - sizes + np.minimum(sizes, skip)
    lhs64, rhs64 = np.asarray(lhs, np.float64), np.asarray(rhs, np.float64)
    want = np.asarray(out_init, np.float64).copy()
    want_sums = None if sums_init is None else np.asarray(sums_init, np.float64).copy()
    for e, (s0, r) in enumerate(zip(starts, kept)):
        want[e] += lhs64[s0 : s0 + r].T @ rhs64[s0 : s0 + r]
        if want_sums is not None:
            want_sums[e] += rhs64[s0 : s0 + r].sum(0)
    assert rel_err(out, want) < _tol(jnp.float32)
    untouched = kept == 0
    assert np.array_equal(np.asarray(out)[untouched], np.asarray(out_init)[untouched])
    if rhs_sums:
        assert rel_err(sums, want_sums) < _tol(jnp.float32)
        assert np.array_equal(np.asarray(sums)[untouched], np.asarray(sums_init)[untouched])


def test_tgmm_accumulate_must_match():
    lhs, rhs = jnp.ones((8, 16), jnp.float32), jnp.ones((8, 16), jnp.float32)
    with pytest.raises(ValueError, match="accumulate must be"):
        tgmm(lhs, rhs, jnp.array([8]), accumulate=(jnp.zeros((1, 16, 8)), None))


@pytest.mark.parametrize(
    "kernel, activation, k, n, want",
    [
        ("gmm_glu", "gptoss", 2880, 2880, 32),  # 64 interleaved weight columns
        ("gmm_glu", "swiglu", 4096, 2048, 64),  # gate and up: two 64-column blocks
        ("gmm", None, 2880, 2880, 64),
        ("gmm", None, 2048, 4096, 64),
    ],
)
def test_decode_tiles_keep_contiguous_weight_rows(kernel, activation, k, n, want):
    """At T = 1 (4 or 8 rows, one per expert) the Triton backend spreads block_n over the SMs
    but keeps each weight row of a tile at least 64 columns contiguous (narrower streamed slower
    on the H200)."""
    top_k, experts = (4, 128) if activation != "swiglu" and n != 4096 else (8, 256)
    pick = pallas_triton.config
    cfg = pick(kernel, jnp.bfloat16, top_k, experts, k, n, activation)
    assert cfg.block_n == want
    wide = pick(kernel, jnp.bfloat16, 2048 * top_k, experts, k, n, activation)
    assert wide.block_n >= want
