"""The capacity-slab kernel (`kernels.slab`, the operands and bias sums of the batched weight
gradient) against numpy: exact copies, zeros past each group, sums over every row of a group."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moe_pallas import backends
from moe_pallas.kernels import slab


def _rows(src, index, scale):
    """The rows the slab reads, in src's dtype: gathered, and scaled as the kernel rounds them."""
    index, scale = (None if a is None else jnp.asarray(a) for a in (index, scale))
    return np.asarray(backends.scaled_rows(src, index, scale), np.float64)


def _expected(rows, offsets, cap):
    num_groups, dim = len(offsets) - 1, rows.shape[1]
    want = np.zeros((num_groups, cap, dim))
    sums = np.zeros((num_groups, dim))
    for g in range(num_groups):
        members = np.arange(offsets[g], offsets[g + 1])
        picked = rows[members]
        want[g, : min(len(members), cap)] = picked[:cap]
        sums[g] = picked.sum(0)
    return want, sums


@pytest.mark.parametrize(
    "dtype, cap, dim, gather, scaled",
    [
        (jnp.bfloat16, 32, 300, False, False),  # 300 columns: a masked tail of the 256 block
        (jnp.float32, 48, 64, True, False),  # block_c shrinks to 16, which divides 48
        (jnp.bfloat16, 16, 40, True, True),  # the train step's dy = w ⊙ dout[row_token]
        (jnp.bfloat16, 32, 72, False, True),
    ],
)
def test_matches_numpy(dtype, cap, dim, gather, scaled):
    rng = np.random.default_rng(cap + dim)
    sizes = np.array([5, 0, cap + 37, cap, 1, 2 * cap + 3], np.int32)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32)
    m = int(offsets[-1]) + 6
    src_np = rng.standard_normal((40 if gather else m, dim))
    index = rng.integers(0, 40, m).astype(np.int32) if gather else None
    if not gather:
        src_np[offsets[-1] :] = np.nan  # rows past every group are never read
    src = jnp.asarray(src_np, dtype)
    row_scale = rng.uniform(0.1, 2.0, m).astype(np.float32) if scaled else None
    got, sums = slab.slab(
        src,
        jnp.asarray(offsets),
        cap,
        row_index=None if index is None else jnp.asarray(index),
        row_scale=None if row_scale is None else jnp.asarray(row_scale),
        sums=True,
    )
    want, want_sums = _expected(_rows(src, index, row_scale), offsets, cap)
    assert got.shape == (6, cap, dim) and got.dtype == dtype and sums.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(got, np.float64), want)  # a copy: exact
    scale = np.nansum(np.abs(np.asarray(src, np.float64))) + 1
    assert np.abs(np.asarray(sums, np.float64) - want_sums).max() < 1e-5 * scale
    alone = slab.slab(
        src,
        jnp.asarray(offsets),
        cap,
        row_index=None if index is None else index,
        row_scale=None if row_scale is None else jnp.asarray(row_scale),
    )
    np.testing.assert_array_equal(np.asarray(alone), np.asarray(got))


def test_rejects_bad_capacity_and_shapes():
    src, offsets = jnp.zeros((8, 4)), jnp.array([0, 4, 8], jnp.int32)
    with pytest.raises(ValueError, match="capacity=0"):
        slab.slab(src, offsets, 0)
    with pytest.raises(ValueError, match="group_offsets"):
        slab.slab(src, offsets[None], 32)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "rows, dim, groups, gather", [(8192, 5760, 128, False), (8192, 2880, 128, True)]
)
def test_full_shapes_gpu(rows, dim, groups, gather):
    """gpt-oss's slabs at T = 2048 (dh with its sums, x gathered) on the GPU, one group far above
    capacity: the copies exact against XLA's gather, the sums against a float32 segment sum."""
    rng = np.random.default_rng(0)
    sizes = rng.multinomial(rows - 1000, np.full(groups, 1 / groups)).astype(np.int32)
    sizes[5] += 1000  # a hot group
    offsets = jnp.asarray(np.concatenate([[0], np.cumsum(sizes)]), jnp.int32)
    cap = 96
    src = jnp.asarray(rng.standard_normal((2048 if gather else rows, dim)), jnp.bfloat16)
    index = jnp.asarray(rng.integers(0, 2048, rows), jnp.int32) if gather else None
    got, sums = slab.slab(src, offsets, cap, row_index=index, sums=True)
    picked = src if index is None else src[index]
    slot = jnp.arange(cap)
    valid = slot[None, :] < jnp.minimum(jnp.diff(offsets), cap)[:, None]
    want = jnp.where(valid[..., None], picked[jnp.where(valid, offsets[:-1, None] + slot, 0)], 0)
    assert bool(jnp.array_equal(got, want))
    group = jnp.repeat(jnp.arange(groups), jnp.asarray(sizes), total_repeat_length=rows)
    want_sums = jax.ops.segment_sum(picked.astype(jnp.float32), group, groups)
    err = jnp.max(jnp.abs(sums - want_sums)) / jnp.max(jnp.abs(want_sums))
    assert float(err) < 1e-5
