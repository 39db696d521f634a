"""Mosaic GPU gmm: Mosaic GPU interpret mode (CPU) against the float64 oracle, and lowering for an
abstract H200 (layout inference, TMA/wgmma constraints and the shared-memory budget are checked at
lowering; only the PTX compile is left for the GPU).

Interpret mode fills outputs with NaN and raises on out-of-bounds reads, so `rel_err` (which
rejects NaN) also proves every row was written, and a TMA box leaving lhs fails the test.
"""

import dataclasses
import functools
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractDevice, AbstractMesh

import moe_pallas
from moe_pallas import backends, tuning
from moe_pallas.backends import mosaic_gpu as mosaic_backend
from moe_pallas.kernels import gmm_mgpu, tgmm_mgpu
from tests.helpers import tile_schedule
from tests.test_kernels_gmm import gmm64, rel_err, tgmm64
from tests.test_lowering import _layer_args

SMALL = gmm_mgpu.MosaicConfig(block_m=64, block_n=64, block_k=32, num_stages=2, grid_tile_n=2)
BF16 = jnp.bfloat16
SDS = jax.ShapeDtypeStruct
H200 = AbstractMesh((1,), ("x",), abstract_device=AbstractDevice("NVIDIA H200", 132, "gpu"))


def _inputs(rng, num_rows, k, n, group_sizes, transpose_rhs=False):
    g = len(group_sizes)
    lhs = jnp.asarray(rng.standard_normal((num_rows, k)), BF16)
    rhs = jnp.asarray(
        rng.standard_normal((g, n, k) if transpose_rhs else (g, k, n)) / np.sqrt(k), BF16
    )
    return lhs, rhs, jnp.asarray(group_sizes, jnp.int32)


@pytest.mark.parametrize(
    "num_rows, group_sizes",
    [
        (100, [30, 0, 50, 13]),  # unaligned group starts, an empty group, zero tail, M % 8 != 0
        (128, [0, 128, 0, 0]),  # one hot expert: two full visits
        (1, [0, 0, 1, 0]),  # T = 1: lhs padded to one block
        (72, [5, 7, 9, 51]),  # many tiny groups, each inside an 8-row unit with its neighbours
    ],
)
def test_gmm_matches_oracle(num_rows, group_sizes):
    rng = np.random.default_rng(num_rows)
    lhs, rhs, sizes = _inputs(rng, num_rows, 64, 128, group_sizes)
    out = gmm_mgpu.gmm(lhs, rhs, sizes, out_dtype=jnp.float32, config=SMALL)
    assert out.shape == (num_rows, 128) and out.dtype == jnp.float32
    assert rel_err(out, gmm64(lhs, rhs, sizes)) < 1e-5  # bf16 products are exact in f32


def test_gmm_transposed_rhs_bf16_out():
    rng = np.random.default_rng(1)
    lhs, rhs, sizes = _inputs(rng, 96, 64, 128, [40, 0, 56], transpose_rhs=True)
    out = gmm_mgpu.gmm(lhs, rhs, sizes, transpose_rhs=True, config=SMALL)
    assert out.dtype == BF16
    assert rel_err(out, gmm64(lhs, rhs, sizes, transpose_rhs=True)) < 1e-2


@pytest.mark.parametrize("split", ["n", "m"])
@pytest.mark.parametrize("transpose_rhs", [False, True])
def test_gmm_warp_specialised_matches_oracle(transpose_rhs, split):
    """Split "m": 128-row CTA tiles whose two row halves often hold rows of two groups (a 30-row
    group ends inside the first half, the 50-row one spans both), stored by each consumer."""
    rng = np.random.default_rng(6)
    lhs, rhs, sizes = _inputs(rng, 100, 64, 256, [30, 0, 50, 13], transpose_rhs=transpose_rhs)
    cfg = gmm_mgpu.MosaicConfig(64, 64, 32, num_stages=2, grid_tile_n=2, consumers=2, split=split)
    out = gmm_mgpu.gmm(
        lhs, rhs, sizes, transpose_rhs=transpose_rhs, out_dtype=jnp.float32, config=cfg
    )
    assert rel_err(out, gmm64(lhs, rhs, sizes, transpose_rhs=transpose_rhs)) < 1e-5


@pytest.mark.parametrize(
    "consumers, split, has_bias, has_row_scale, transpose_rhs",
    [
        (1, "n", True, True, False),
        (1, "n", False, True, True),
        (1, "n", True, False, False),
        (2, "n", True, True, True),
        (2, "m", True, True, False),  # each consumer loads the row scale of its own rows
    ],
)
def test_gmm_epilogue_matches_oracle(consumers, split, has_bias, has_row_scale, transpose_rhs):
    rng = np.random.default_rng(7 + consumers)
    n = 128 * consumers
    lhs, rhs, sizes = _inputs(rng, 100, 64, n, [30, 0, 50, 13], transpose_rhs=transpose_rhs)
    bias = jnp.asarray(rng.standard_normal((4, n)), BF16) if has_bias else None
    row_scale = jnp.asarray(rng.random(104) + 0.5, jnp.float32) if has_row_scale else None
    cfg = gmm_mgpu.MosaicConfig(
        64, 64, 32, num_stages=2, grid_tile_n=2, consumers=consumers, split=split
    )
    out, ref = _with_epilogue(lhs, rhs, sizes, cfg, transpose_rhs, bias, row_scale)
    assert rel_err(out, ref) < 1e-5  # bias and scale are applied in float32


def _with_epilogue(lhs, rhs, sizes, cfg, transpose_rhs, bias, row_scale):
    """(gmm_mgpu's float32 output, the float64 oracle's) with bias and row scale (None: absent;
    row_scale may be longer than M, as for the Triton kernel: its extra entries are unused)."""
    kwargs = {"transpose_rhs": transpose_rhs, "bias": bias}
    out = gmm_mgpu.gmm(
        lhs, rhs, sizes, row_scale=row_scale, out_dtype=jnp.float32, config=cfg, **kwargs
    )
    num_rows = lhs.shape[0]
    ref = gmm64(
        lhs, rhs, sizes, row_scale=None if row_scale is None else row_scale[:num_rows], **kwargs
    )
    return np.asarray(out), ref


PINGPONG = gmm_mgpu.MosaicConfig(64, 128, 32, num_stages=3, consumers=2, split="pingpong", epi_n=64)


@pytest.mark.parametrize(
    "num_rows, group_sizes, has_epilogue, transpose_rhs",
    [
        (100, [30, 0, 50, 13], True, False),  # unaligned starts, an empty group, zero tail
        (300, [70, 64, 0, 100, 50, 16], False, True),  # more items than the two consumers
        (1, [0, 0, 1, 0], True, True),  # T = 1: one item, consumer 1 idle
        (72, [5, 7, 9, 51], False, False),  # tiny groups sharing 8-row units
    ],
)
def test_gmm_pingpong_matches_oracle(num_rows, group_sizes, has_epilogue, transpose_rhs):
    """Split "pingpong": consumers take alternate items of a CTA (INTERPRET_SMS = 2 CTAs stride
    the list), the ring's steps counted over the items that multiply only."""
    rng = np.random.default_rng(num_rows + 11)
    lhs, rhs, sizes = _inputs(rng, num_rows, 96, 256, group_sizes, transpose_rhs=transpose_rhs)
    g = len(group_sizes)
    bias = jnp.asarray(rng.standard_normal((g, 256)), BF16) if has_epilogue else None
    row_scale = jnp.asarray(rng.random(num_rows) + 0.5, jnp.float32) if has_epilogue else None
    out, ref = _with_epilogue(lhs, rhs, sizes, PINGPONG, transpose_rhs, bias, row_scale)
    assert rel_err(out, ref) < 1e-5
    assert np.all(out[sum(group_sizes) :] == 0)


def test_pingpong_config_is_checked():
    with pytest.raises(ValueError, match="consumers=2"):
        gmm_mgpu.MosaicConfig(split="pingpong").fit(256, 256)
    for split, epi_n in (("pingpong", 32), ("pingpong", 96), ("m", 64)):
        with pytest.raises(ValueError, match="epi_n"):
            gmm_mgpu.MosaicConfig(consumers=2, split=split, epi_n=epi_n).fit(256, 256)
    with pytest.raises(ValueError, match="no GLU epilogue"):
        lhs, rhs, sizes = _inputs(np.random.default_rng(0), 8, 64, 256, [8])
        gmm_mgpu.gmm(lhs, rhs, sizes, activation="swiglu", config=PINGPONG)
    # chunks that do not divide the fitted tile store it whole
    fitted = gmm_mgpu.MosaicConfig(128, 256, consumers=2, split="pingpong", epi_n=128).fit(2880, 64)
    assert (fitted.block_n, fitted.epi_n) == (192, 192)


WS_ROWS = gmm_mgpu.MosaicConfig(64, 64, 32, num_stages=2, grid_tile_n=2, consumers=2, split="m")


@pytest.mark.parametrize(
    "activation, config",
    [("swiglu", SMALL), ("gptoss", SMALL), ("swiglu", WS_ROWS)],
    ids=["swiglu", "gptoss", "swiglu_ws_rows"],
)
@pytest.mark.parametrize("with_epilogue", [False, True])
@pytest.mark.parametrize("num_rows, group_sizes", [(100, [30, 0, 50, 13]), (1, [0, 1, 0, 0])])
def test_gmm_glu_matches_oracle(num_rows, group_sizes, with_epilogue, activation, config):
    rng = np.random.default_rng(20 + num_rows)
    lhs, rhs, sizes = _inputs(rng, num_rows, 64, 256, group_sizes)
    rhs = rhs * 4  # pre-activations of a few units: gpt-oss's clamps at ±7 bite on some
    bias = jnp.asarray(rng.standard_normal((4, 256)), BF16) if with_epilogue else None
    row_scale = jnp.asarray(rng.random(num_rows) + 0.5, jnp.float32) if with_epilogue else None
    out = gmm_mgpu.gmm(
        lhs,
        rhs,
        sizes,
        bias=bias,
        activation=activation,
        row_scale=row_scale,
        out_dtype=jnp.float32,
        config=config,
    )
    assert out.shape == (num_rows, 128)
    ref = gmm64(lhs, rhs, sizes, bias=bias, activation=activation, row_scale=row_scale)
    assert rel_err(out, ref) < 1e-5  # gate and up are exact in f32; the GLU runs in f32


def test_decode_config_takes_64_row_tiles_at_least_64_columns_wide():
    """rows_class "tiny": 64-row tiles, block_n halved towards 4 pairs per SM but not below 64
    (narrower tiles misaligned on the H200); gpt-oss's GLU gets 6 stages (8 exceed its shared
    memory, measured on the H200), the rest 8."""
    with jax.sharding.use_abstract_mesh(H200):
        decode = mosaic_backend.default_config(4, 128, 2880, "gptoss")
        swiglu_down = mosaic_backend.default_config(8, 256, 4096, None)
        prefill = mosaic_backend.default_config(8192, 128, 2880, "gptoss")
    assert (decode.block_m, decode.block_n, decode.num_stages) == (64, 64, 6)
    assert (swiglu_down.block_m, swiglu_down.block_n, swiglu_down.num_stages) == (64, 64, 8)
    assert prefill == gmm_mgpu.MosaicConfig(block_n=64)


def test_config_narrower_than_64_columns_is_refused():
    with pytest.raises(ValueError, match="block_n=32 must be at least 64"):
        gmm_mgpu.MosaicConfig(block_n=32).fit(2880, 2880)


@pytest.mark.parametrize("activation", [None, "gptoss"])
def test_gmm_decode_config_matches_oracle(activation):
    """The backend's call at decode sizes (2 rows per group) runs the decode config; a row
    gather reads a gathered copy."""
    rng = np.random.default_rng(30)
    lhs, rhs, sizes = _inputs(rng, 6, 64, 256 if activation else 128, [2, 0, 3, 1])
    cfg = mosaic_backend.default_config(6, 4, 128, activation)
    # 4 experts x 1 column tile, far below 4 pairs per SM: narrowed once, to the 64-column floor
    assert (cfg.block_m, cfg.block_n) == (64, 64)
    out = mosaic_backend.gmm(lhs, rhs, sizes, activation=activation, out_dtype=jnp.float32)
    assert rel_err(out, gmm64(lhs, rhs, sizes, activation=activation)) < 1e-5
    index = jnp.asarray([5, 0, 2, 2, 1, 3], jnp.int32)
    out = mosaic_backend.gmm(
        lhs, rhs, sizes, lhs_row_index=index, activation=activation, out_dtype=jnp.float32
    )
    assert rel_err(out, gmm64(lhs[index], rhs, sizes, activation=activation)) < 1e-5


def test_gmm_clamps_invalid_group_sizes_like_triton():
    rng = np.random.default_rng(2)
    lhs, rhs, sizes = _inputs(rng, 64, 32, 64, [-5, 40, 100])
    out = gmm_mgpu.gmm(lhs, rhs, sizes, out_dtype=jnp.float32, config=SMALL)
    assert rel_err(out, gmm64(lhs, rhs, [0, 40, 24])) < 1e-5


def test_ragged_dot_mosaic_gpu_forward_and_grad():
    rng = np.random.default_rng(3)
    lhs, rhs, sizes = _inputs(rng, 64, 32, 64, [20, 0, 44])
    dot = functools.partial(moe_pallas.ragged_dot, implementation="mosaic_gpu")
    out = dot(lhs, rhs, sizes, preferred_element_type=jnp.float32)
    assert rel_err(out, gmm64(lhs, rhs, sizes)) < 1e-5
    # Gradients reuse the Triton kernels' VJP rules (interpret mode here).
    loss = lambda a, b: jnp.sum(dot(a, b, sizes, preferred_element_type=jnp.float32) ** 2)
    ref_loss = lambda a, b: jnp.sum(
        jax.lax.ragged_dot(a, b, sizes, preferred_element_type=jnp.float32) ** 2
    )
    for got, want in zip(jax.grad(loss, (0, 1))(lhs, rhs), jax.grad(ref_loss, (0, 1))(lhs, rhs)):
        assert (
            rel_err(got.astype(jnp.float32), np.asarray(want.astype(jnp.float32), np.float64))
            < 1e-2
        )


def test_schedule_covers_each_row_once_in_aligned_boxes():
    rng = np.random.default_rng(4)
    for _ in range(60):
        num_rows, block_m = int(rng.integers(1, 300)), int(rng.choice([64, 128]))
        g = int(rng.integers(1, 9))
        sizes = np.diff(np.concatenate([[0], np.sort(rng.integers(0, num_rows + 1, g))]))
        ends = jnp.asarray(np.cumsum(sizes), jnp.int32)
        sched = tile_schedule(ends, num_rows, block_m, align=8)
        group, m_start, start, end = map(np.asarray, sched)
        assert (m_start % 8 == 0).all()
        ends = np.concatenate([np.cumsum(sizes), [num_rows]])
        starts = np.concatenate([[0], ends[:-1]])
        cover = np.zeros(num_rows, int)
        for v in np.flatnonzero(end > start):
            assert m_start[v] <= start[v] and end[v] <= m_start[v] + block_m
            assert starts[group[v]] <= start[v] and end[v] <= ends[group[v]]
            cover[start[v] : end[v]] += 1
        np.testing.assert_array_equal(cover, 1)


def test_validation_names_the_fix():
    lhs, rhs, sizes = _inputs(np.random.default_rng(5), 8, 32, 64, [8])
    with pytest.raises(TypeError, match="pallas_triton"):
        gmm_mgpu.gmm(lhs.astype(jnp.float32), rhs, sizes)
    with pytest.raises(ValueError, match="N=72 is not a multiple of 16"):
        gmm_mgpu.gmm(lhs, jnp.zeros((1, 32, 72), BF16), sizes)
    with pytest.raises(ValueError, match="K=32"):
        gmm_mgpu.gmm(lhs, jnp.zeros((1, 48, 64), BF16), sizes)
    with pytest.raises(ValueError, match=r"bias must be \[1, 64\]"):
        gmm_mgpu.gmm(lhs, rhs, sizes, bias=jnp.zeros((64,), BF16))
    with pytest.raises(ValueError, match="row_scale must be 1-D with >= 8 entries"):
        gmm_mgpu.gmm(lhs, rhs, sizes, row_scale=jnp.ones((4,), jnp.float32))
    with pytest.raises(ValueError, match="'swiglu' or 'gptoss'"):
        gmm_mgpu.gmm(lhs, rhs, sizes, activation="relu")
    with pytest.raises(ValueError, match="consumers=1"):
        gmm_mgpu.gmm(lhs, jnp.swapaxes(rhs, 1, 2), sizes, activation="swiglu", transpose_rhs=True)


def _lower_for_h200(fn, *args) -> str:
    with jax.sharding.use_abstract_mesh(H200):
        return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


@pytest.mark.parametrize("consumers, split", [(1, "n"), (2, "n"), (2, "m")])
@pytest.mark.parametrize("transpose_rhs", [False, True])
@pytest.mark.parametrize(
    "rows, k, n, groups",
    [(8192, 2880, 5760, 128), (4, 2880, 2880, 128), (65536, 4096, 4096, 256), (8, 2048, 4096, 256)],
)
def test_gmm_lowers_for_h200(rows, k, n, groups, transpose_rhs, consumers, split):
    rhs = SDS((groups, n, k) if transpose_rhs else (groups, k, n), BF16)
    cfg = gmm_mgpu.MosaicConfig(
        num_stages=4 if consumers == 1 else 3, consumers=consumers, split=split
    )
    fn = functools.partial(gmm_mgpu.gmm, transpose_rhs=transpose_rhs, config=cfg)
    if split == "n" and consumers == 2 and n % 128:  # 45 units of 64 columns cannot be halved
        with pytest.raises(ValueError, match="multiple of 128"):
            _lower_for_h200(fn, SDS((rows, k), BF16), rhs, SDS((groups,), jnp.int32))
        return
    text = _lower_for_h200(fn, SDS((rows, k), BF16), rhs, SDS((groups,), jnp.int32))
    assert "mosaic_gpu_v2" in text


@pytest.mark.parametrize("consumers", [1, 2])
@pytest.mark.parametrize(
    "rows, k, n, groups", [(8192, 2880, 5760, 128), (4, 2048, 4096, 256), (65536, 4096, 4096, 256)]
)
def test_gmm_epilogue_lowers_for_h200(rows, k, n, groups, consumers):
    cfg = gmm_mgpu.MosaicConfig(num_stages=4 if consumers == 1 else 3, consumers=consumers)
    fn = lambda lhs, rhs, sizes, bias, row_scale: gmm_mgpu.gmm(
        lhs, rhs, sizes, bias=bias, row_scale=row_scale, config=cfg
    )
    args = (SDS((rows, k), BF16), SDS((groups, k, n), BF16), SDS((groups,), jnp.int32))
    text = _lower_for_h200(fn, *args, SDS((groups, n), BF16), SDS((rows,), jnp.float32))
    assert "mosaic_gpu_v2" in text


@pytest.mark.parametrize(
    "activation, rows, h, n, groups",
    [
        ("swiglu", 65536, 4096, 4096, 256),
        ("swiglu", 8, 4096, 4096, 256),
        ("gptoss", 8192, 2880, 5760, 128),
        ("gptoss", 4, 2880, 5760, 128),
        ("gptoss", 65536, 4096, 4096, 256),
    ],
)
@pytest.mark.parametrize(
    "config", [None, gmm_mgpu.MosaicConfig(128, 64, 64, 3, consumers=2, split="m")]
)
def test_gmm_glu_lowers_for_h200(activation, rows, h, n, groups, config):
    """gate_up projections (N = 2I) with bias and row_scale: the default config (the decode one
    at 4-8 rows), and warp-specialised 256 x 64 CTA tiles for SwiGLU (shared memory within
    227 KiB; gpt-oss's interleaved GLU is refused there)."""
    fn = lambda lhs, rhs, sizes, bias, row_scale: gmm_mgpu.gmm(
        lhs, rhs, sizes, bias=bias, activation=activation, row_scale=row_scale, config=config
    )
    args = (SDS((rows, h), BF16), SDS((groups, h, n), BF16), SDS((groups,), jnp.int32))
    if config is not None and activation == "gptoss":
        with pytest.raises(ValueError, match="interleaved"):
            _lower_for_h200(fn, *args, SDS((groups, n), BF16), SDS((rows,), jnp.float32))
        return
    text = _lower_for_h200(fn, *args, SDS((groups, n), BF16), SDS((rows,), jnp.float32))
    assert "mosaic_gpu_v2" in text


@pytest.mark.parametrize("transpose_rhs", [False, True])
@pytest.mark.parametrize(
    "rows, k, n, groups, block_n, stages",
    [
        (65536, 2880, 2880, 128, 192, 4),
        (8192, 5760, 2880, 128, 192, 4),
        (65536, 2048, 4096, 256, 128, 5),
    ],
)
def test_gmm_pingpong_lowers_for_h200(rows, k, n, groups, block_n, stages, transpose_rhs):
    """The ping-pong tiles the table runs, with bias and row scale, within 227 KiB of shared
    memory (the epilogue in 64-column chunks)."""
    cfg = gmm_mgpu.MosaicConfig(128, block_n, 64, stages, consumers=2, split="pingpong", epi_n=64)
    fn = lambda lhs, rhs, sizes, bias, row_scale: gmm_mgpu.gmm(
        lhs, rhs, sizes, transpose_rhs=transpose_rhs, bias=bias, row_scale=row_scale, config=cfg
    )
    rhs = SDS((groups, n, k) if transpose_rhs else (groups, k, n), BF16)
    args = (SDS((rows, k), BF16), rhs, SDS((groups,), jnp.int32))
    text = _lower_for_h200(fn, *args, SDS((groups, n), BF16), SDS((rows,), jnp.float32))
    assert "mosaic_gpu_v2" in text


def test_ragged_dot_lowers_to_mosaic_gpu_and_shared_memory_overflow_is_caught():
    args = SDS((8192, 2880), BF16), SDS((128, 2880, 5760), BF16), SDS((128,), jnp.int32)
    text = _lower_for_h200(
        functools.partial(moe_pallas.ragged_dot, implementation="mosaic_gpu"), *args
    )
    assert "mosaic_gpu_v2" in text and "__gpu$xla.gpu.triton" not in text
    too_big = gmm_mgpu.MosaicConfig(block_m=256, block_n=256, block_k=64, num_stages=8)
    with pytest.raises(ValueError, match="exceeds available shared memory"):
        _lower_for_h200(functools.partial(gmm_mgpu.gmm, config=too_big), *args)


TGMM_SMALL = tgmm_mgpu.TgmmMosaicConfig(block_m=64, block_k=64, block_n=32, num_stages=2)


@pytest.mark.parametrize(
    "num_rows, group_sizes",
    [
        (100, [30, 0, 50, 13]),  # unaligned group starts, an empty group, zero tail, M % 64 != 0
        (128, [0, 128, 0]),  # one hot group over two row blocks
        (1, [0, 1, 0]),  # T = 1
        (200, [5, 7, 9, 51, 0, 100]),  # tiny groups sharing one row block
    ],
)
def test_tgmm_matches_oracle(num_rows, group_sizes):
    rng = np.random.default_rng(10 + num_rows)
    lhs = jnp.asarray(rng.standard_normal((num_rows, 128)), BF16)
    rhs = jnp.asarray(rng.standard_normal((num_rows, 64)), BF16)
    sizes = jnp.asarray(group_sizes, jnp.int32)
    out = tgmm_mgpu.tgmm(lhs, rhs, sizes, out_dtype=jnp.float32, config=TGMM_SMALL)
    assert out.shape == (len(group_sizes), 128, 64) and out.dtype == jnp.float32
    assert rel_err(out, tgmm64(lhs, rhs, group_sizes)) < 1e-5  # bf16 products are exact in f32
    for g in np.flatnonzero(np.asarray(group_sizes) == 0):
        assert not np.asarray(out[g]).any()  # exact zeros, not a small residue


@pytest.mark.parametrize("variant", [{"num_stages": 2}, {"num_stages": 3}])
def test_tgmm_variants_match_oracle(variant):
    """Rings of 2 and 3 slots: the refill wraps around many times over 14 boxes."""
    rng = np.random.default_rng(14)
    sizes = [13, 20, 0, 30, 7]
    lhs = jnp.asarray(rng.standard_normal((75, 128)), BF16)
    rhs = jnp.asarray(rng.standard_normal((75, 64)), BF16)
    cfg = dataclasses.replace(TGMM_SMALL, **variant)
    out = tgmm_mgpu.tgmm(lhs, rhs, jnp.asarray(sizes, jnp.int32), out_dtype=jnp.float32, config=cfg)
    assert rel_err(out, tgmm64(lhs, rhs, sizes)) < 1e-5


def test_tgmm_keeps_nan_rows_in_their_group():
    """Row boxes start at multiples of 8 and cover neighbours' rows: those are zeroed in both
    operands, so a NaN in one group's rows (or past every group) reaches no other group."""
    rng = np.random.default_rng(13)
    sizes = [13, 20, 0, 30]
    lhs_np, rhs_np = rng.standard_normal((70, 128)), rng.standard_normal((70, 64))
    rhs_np[15, 3] = np.nan  # group 1 (rows 13-32)
    lhs_np[68, 0] = np.nan  # past every group (63 rows)
    lhs, rhs = jnp.asarray(lhs_np, BF16), jnp.asarray(rhs_np, BF16)
    out = np.asarray(tgmm_mgpu.tgmm(lhs, rhs, jnp.asarray(sizes, jnp.int32), config=TGMM_SMALL))
    assert np.isnan(out[1]).any()
    assert np.isfinite(out[[0, 2, 3]]).all()
    clean = np.where(np.isnan(rhs_np), 0, rhs_np)
    ref = tgmm64(lhs, jnp.asarray(clean, BF16), sizes)
    assert rel_err(out[[0, 3]], ref[[0, 3]]) < 1e-2


def test_tgmm_clamps_invalid_group_sizes_and_validates():
    rng = np.random.default_rng(11)
    lhs = jnp.asarray(rng.standard_normal((64, 64)), BF16)
    rhs = jnp.asarray(rng.standard_normal((64, 32)), BF16)
    out = tgmm_mgpu.tgmm(lhs, rhs, jnp.asarray([-5, 40, 100], jnp.int32), config=TGMM_SMALL)
    assert out.dtype == BF16
    assert rel_err(out, tgmm64(lhs, rhs, [0, 40, 24])) < 1e-2
    with pytest.raises(TypeError, match="pallas_triton"):
        tgmm_mgpu.tgmm(lhs.astype(jnp.float32), rhs, jnp.asarray([64], jnp.int32))
    with pytest.raises(ValueError, match="K=32 is not a multiple of 64"):
        tgmm_mgpu.tgmm(lhs[:, :32], rhs, jnp.asarray([64], jnp.int32))
    with pytest.raises(ValueError, match="same rows"):
        tgmm_mgpu.tgmm(lhs, rhs[:8], jnp.asarray([64], jnp.int32))


def test_tgmm_op_and_bf16_grads_run_mosaic_gpu():
    """ops.tgmm and ragged_dot with implementation="mosaic_gpu": forward and bf16 gradients
    against float64 oracles (bf16 cotangents take the Mosaic GPU kernels)."""
    rng = np.random.default_rng(12)
    sizes_np = [20, 0, 44]
    lhs, rhs, sizes = _inputs(rng, 64, 64, 64, sizes_np)
    d_out = jnp.asarray(rng.standard_normal((64, 64)), BF16)
    out, vjp = jax.vjp(
        lambda a, b: moe_pallas.ragged_dot(a, b, sizes, implementation="mosaic_gpu"), lhs, rhs
    )
    d_lhs, d_rhs = vjp(d_out)
    assert out.dtype == d_lhs.dtype == d_rhs.dtype == BF16
    assert rel_err(out, gmm64(lhs, rhs, sizes_np)) < 1e-2
    assert rel_err(d_lhs, gmm64(d_out, rhs, sizes_np, transpose_rhs=True)) < 1e-2
    assert rel_err(d_rhs, tgmm64(lhs, d_out, sizes_np)) < 1e-2

    y = jnp.asarray(rng.standard_normal((64, 32)), BF16)
    d_w = jnp.asarray(rng.standard_normal((3, 64, 32)), BF16)
    w, vjp = jax.vjp(lambda a, b: moe_pallas.tgmm(a, b, sizes, implementation="mosaic_gpu"), lhs, y)
    d_x, d_y = vjp(d_w)
    assert rel_err(w, tgmm64(lhs, y, sizes_np)) < 1e-2
    assert rel_err(d_x, gmm64(y, d_w, sizes_np, transpose_rhs=True)) < 1e-2
    assert rel_err(d_y, gmm64(lhs, d_w, sizes_np)) < 1e-2


def test_ops_fall_back_to_triton_for_float32(monkeypatch):
    """implementation="mosaic_gpu" with float32 operands (wgmma takes one 16-bit dtype): ragged_dot
    and tgmm, forward and gradients, run the Triton kernels instead of raising."""

    def refuse(*args, **kwargs):
        raise AssertionError("a float32 operand reached a Mosaic GPU kernel")

    monkeypatch.setattr(gmm_mgpu, "gmm", refuse)
    monkeypatch.setattr(tgmm_mgpu, "tgmm", refuse)
    rng = np.random.default_rng(13)
    sizes_np = [20, 0, 12]
    lhs, rhs, sizes = (
        a.astype(jnp.float32) if a.dtype == BF16 else a for a in _inputs(rng, 32, 32, 16, sizes_np)
    )
    y = jnp.asarray(rng.standard_normal((32, 16)), jnp.float32)
    w, vjp = jax.vjp(lambda a, b: moe_pallas.tgmm(a, b, sizes, implementation="mosaic_gpu"), lhs, y)
    d_x, d_y = vjp(jnp.ones_like(w))
    assert rel_err(w, tgmm64(lhs, y, sizes_np)) < 1e-5
    assert rel_err(d_x, gmm64(y, jnp.ones_like(w), sizes_np, transpose_rhs=True)) < 1e-5
    assert rel_err(d_y, gmm64(lhs, jnp.ones_like(w), sizes_np)) < 1e-5
    out = moe_pallas.ragged_dot(lhs, rhs, sizes, implementation="mosaic_gpu")
    assert rel_err(out, gmm64(lhs, rhs, sizes_np)) < 1e-5


@pytest.mark.parametrize(
    "rows, k, n, groups, config",
    [
        (8192, 2880, 5760, 128, None),
        (8, 2880, 2880, 128, None),
        (65536, 4096, 4096, 256, None),
        (100, 2048, 4096, 256, None),
        (100, 2048, 4096, 256, TGMM_SMALL),  # lhs and rhs slots of different widths: one swizzle
        (8192, 2880, 5760, 128, tgmm_mgpu.TgmmMosaicConfig(64, 64, 128, 3)),
    ],
)
def test_tgmm_lowers_for_h200(rows, k, n, groups, config):
    args = SDS((rows, k), BF16), SDS((rows, n), BF16), SDS((groups,), jnp.int32)
    fn = functools.partial(tgmm_mgpu.tgmm, config=config)
    assert "mosaic_gpu_v2" in _lower_for_h200(fn, *args)


def test_mosaic_gpu_training_step_lowers_without_triton():
    """ragged_dot's bf16 forward and backward lower to Mosaic GPU kernels only (gpt-oss seed
    shapes), and an oversized tgmm config is refused at lowering."""
    lhs, rhs, sizes = SDS((8192, 2880), BF16), SDS((128, 2880, 5760), BF16), SDS((128,), jnp.int32)

    def loss(a, b, s):
        out = moe_pallas.ragged_dot(a, b, s, implementation="mosaic_gpu")
        return jnp.sum(out.astype(jnp.float32) ** 2)

    grads = jax.grad(lambda a, b, s: loss(a, b, s).astype(BF16), (0, 1))
    text = _lower_for_h200(grads, lhs, rhs, sizes)
    assert text.count("mosaic_gpu_v2") >= 3 and "__gpu$xla.gpu.triton" not in text
    too_big = tgmm_mgpu.TgmmMosaicConfig(block_m=128, block_k=256, block_n=256, num_stages=8)
    with pytest.raises(ValueError, match="exceeds available shared memory"):
        _lower_for_h200(
            functools.partial(tgmm_mgpu.tgmm, config=too_big),
            lhs,
            SDS((8192, 5760), BF16),
            sizes,
        )


@pytest.mark.parametrize(
    "tokens, mosaic_kernels, grad_mosaic_kernels", [(16384, 1, 2), (2048, 0, 0)]
)
def test_auto_runs_mosaic_gpu_on_the_table_shapes_only(tokens, mosaic_kernels, grad_mosaic_kernels):
    """Under "auto" on an H200, the gpt-oss layer's down projection and the backward's dx at 512
    rows per expert (in the tuning table) lower to Mosaic GPU; gate_up (row gather, GLU), combine
    and the rest of the backward stay Triton, and nothing runs on Mosaic GPU at 64 rows per
    expert."""
    from moe_pallas import fused

    args = _layer_args("gptoss", tokens)
    layer = lambda x, i, w, p: fused.expert_block(x, i, w, p, "gptoss", "auto")
    text = _lower_for_h200(layer, *args)
    assert text.count("mosaic_gpu_v2") == mosaic_kernels
    assert text.count("__gpu$xla.gpu.triton") == 3 - mosaic_kernels
    loss = lambda x, i, w, p: jnp.sum(layer(x, i, w, p).astype(jnp.float32))
    grad_text = _lower_for_h200(jax.grad(loss, (0, 2, 3)), *args)
    assert grad_text.count("mosaic_gpu_v2") == grad_mosaic_kernels


def _mosaic_entries():
    """The table's bf16 mosaic_gpu entries (its FP8-activation ones: tests/test_lowering.py)."""
    entries = tuning.table()["devices"]["NVIDIA H200"]["entries"]
    return [e for e in entries if e["backend"] == "mosaic_gpu" and not e["kernel"].endswith("_a8")]


@pytest.mark.parametrize("out_dtype", [BF16, jnp.float32])
@pytest.mark.parametrize(
    "entry", _mosaic_entries(), ids=lambda e: f"{e['kernel']}-{e['k']}x{e['n']}"
)
def test_auto_table_entries_lower_for_h200(entry, out_dtype):
    """Every mosaic_gpu entry of the tuning table lowers for an H200 at a shape of its rows class
    (512 rows per group, 128 groups) as the layer calls it (gmm: the down call's bias and row
    scale; gmm_t: dx, rhs transposed): its tiles divide K and N and its TMA ring fits in shared
    memory. A float32 output (twice the store buffer, past the shared memory of the 4-stage
    entries) runs on Triton instead."""
    assert entry["rows"] == "large"  # the rows per group below; extend for other classes
    k, n, groups = entry["k"], entry["n"], 128
    rows = 512 * groups
    args = (SDS((rows, k), BF16),)
    if entry["kernel"] == "gmm_t":
        fn = lambda lhs, rhs, sizes: backends.gmm(
            "auto", lhs, rhs, sizes, transpose_rhs=True, out_dtype=out_dtype
        )
        args += (SDS((groups, n, k), BF16), SDS((groups,), jnp.int32))
    else:
        fn = lambda lhs, rhs, sizes, bias, row_scale: backends.gmm(
            "auto", lhs, rhs, sizes, bias=bias, row_scale=row_scale, out_dtype=out_dtype
        )
        args += (SDS((groups, k, n), BF16), SDS((groups,), jnp.int32))
        args += (SDS((groups, n), BF16), SDS((rows,), jnp.float32))
    text = _lower_for_h200(fn, *args)
    mosaic = out_dtype == BF16
    assert text.count("mosaic_gpu_v2") == mosaic
    assert text.count("__gpu$xla.gpu.triton") == (not mosaic)


def test_auto_table_hit_runs_mosaic_gpu_and_matches_triton(monkeypatch, tmp_path):
    """A plain gmm whose shape has a mosaic_gpu entry runs the Mosaic GPU kernel with the entry's
    config (interpret mode here, the device made to look like an H200) and equals Triton's
    result; the same shape with a row gather or a float32 output stays on Triton."""
    table = tmp_path / "tuning.json"
    shutil.copy(tuning.TABLE_PATH, table)
    entry = {"backend": "mosaic_gpu", "kernel": "gmm", "dtype": "bfloat16", "k": 64, "n": 128}
    entry |= {"rows": "small", "config": dataclasses.asdict(SMALL)}
    tuning.write_entries([entry], "NVIDIA H200", path=table)
    monkeypatch.setattr(tuning, "TABLE_PATH", table)
    monkeypatch.setattr(tuning, "device_name", lambda: "NVIDIA H200")
    mosaic = dataclasses.replace(backends.get("mosaic_gpu"), available=lambda: True)
    monkeypatch.setitem(backends.REGISTRY, "mosaic_gpu", mosaic)
    rng = np.random.default_rng(6)
    lhs, rhs, sizes = _inputs(rng, 96, 64, 128, [40, 0, 56])
    bias = jnp.asarray(rng.standard_normal((3, 128)), BF16)
    row_scale = jnp.asarray(rng.random(96), jnp.float32)
    calls = []
    real = gmm_mgpu.gmm
    monkeypatch.setattr(
        gmm_mgpu, "gmm", lambda *a, **kw: calls.append(kw["config"]) or real(*a, **kw)
    )
    kwargs = {"bias": bias, "row_scale": row_scale}
    got = backends.gmm("auto", lhs, rhs, sizes, **kwargs)
    assert calls == [SMALL]
    want = backends.gmm("pallas_triton", lhs, rhs, sizes, **kwargs)
    assert rel_err(got, np.asarray(want, np.float64)) < 1e-6
    backends.gmm("auto", lhs, rhs, sizes, lhs_row_index=jnp.arange(96), **kwargs)
    backends.gmm("auto", lhs, rhs, sizes, out_dtype=jnp.float32, **kwargs)
    assert calls == [SMALL]
