"""Routing metadata in plain JAX with static shapes: the expert sort and every tile schedule.

`dispatch` sorts the M = T·k (token, slot) pairs by expert, stably, so rows of one expert form a
contiguous group and ties keep token order (deterministic results). Pairs whose expert id lies
outside [0, E) are "masked": they sort after every valid row and belong to no group, so
`group_offsets[E]` counts the valid rows only. The single-device block, the xla backend and the
expert-parallel exchange all sort with it.

`tile_schedule` turns group ends into the work list of a grouped matmul (no padding): each group's
rows are cut into m-tiles of `block_m` starting at the group's first row rounded down to a
multiple of `align` (1 for Triton; 8 for Mosaic GPU, whose TMA boxes start at multiples of 8
rows), so a visit touches one group only and a group of at most `block_m` rows is one visit,
reading its expert's weights once (tiles aligned to multiples of `block_m` instead would visit
most groups twice in the weight-bandwidth-bound regime of a few dozen rows per expert). A visit
computes the rows from `m_start` on and owns [row_start, row_end) of them (with align > 1 the rows
before row_start belong to the previous group: computed, not stored). Rows past
`sum(group_sizes)` form one extra pseudo-group (id G) whose visits write zeros. A group of s rows
starting r rows past an aligned row takes cdiv(s + r, block_m) visits; with r < align and at most
n = min(G + 1, M) non-empty groups, `cdiv(M + n·(align - 1), block_m) + n - 1` visits always
suffice; unused visits get an empty row range.

`row_boxes` is the same cut for the weight-gradient kernels, which walk each group's rows in
aligned boxes of `block_m`.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp


class Dispatch(NamedTuple):
    row_token: jax.Array  # [M] int32: source token of each expert-sorted row
    row_pair: jax.Array  # [M] int32: flat (token, slot) index t*k+j of each sorted row
    pair_row: jax.Array  # [M] int32: inverse, the sorted row of flat pair p
    group_sizes: jax.Array  # [E] int32
    group_offsets: jax.Array  # [E+1] int32, exclusive cumsum; [E] = number of valid rows
    row_expert: jax.Array  # [M] int32: expert of each sorted row, E for masked rows


class TileSchedule(NamedTuple):
    group: jax.Array  # [V] int32: group of each visit (G = the zero-filled tail rows)
    m_start: jax.Array  # [V] int32: first row of the visited m-tile (a multiple of align)
    row_start: jax.Array  # [V] int32: first row the visit stores (m_start when align is 1)
    row_end: jax.Array  # [V] int32: one past its last row; row_start == row_end for unused visits


def dispatch(topk_idx: jax.Array, num_experts: int) -> Dispatch:
    """Stable expert sort of `topk_idx[T, k]`; ids outside [0, num_experts) are masked."""
    if topk_idx.ndim != 2:
        raise ValueError(f"topk_idx must be [T, k], got shape {topk_idx.shape}.")
    if not jnp.issubdtype(topk_idx.dtype, jnp.integer):
        raise TypeError(f"topk_idx must hold integer expert ids, got {topk_idx.dtype}.")
    _, k = topk_idx.shape
    expert = topk_idx.reshape(-1).astype(jnp.int32)
    num_pairs = expert.shape[0]
    key = jnp.where((expert >= 0) & (expert < num_experts), expert, num_experts)
    row_pair = jnp.argsort(key, stable=True).astype(jnp.int32)
    pair_row = (
        jnp.zeros_like(row_pair)
        .at[row_pair]
        .set(jnp.arange(num_pairs, dtype=jnp.int32), unique_indices=True)
    )
    group_offsets = searchsorted(
        key[row_pair], jnp.arange(num_experts + 1, dtype=jnp.int32), side="left"
    )
    return Dispatch(
        row_token=row_pair // k,
        row_pair=row_pair,
        pair_row=pair_row,
        group_sizes=jnp.diff(group_offsets),
        group_offsets=group_offsets,
        row_expert=key[row_pair],
    )


_COMPARE_ALL_MAX = 1 << 26  # compares; past this the binary search's O(log n) launches are cheaper


def searchsorted(sorted_keys: jax.Array, queries: jax.Array, side: str) -> jax.Array:
    """int32 `jnp.searchsorted`. compare_all (every query against every key) is one fused kernel,
    where the default binary search is a loop of small launches, as long as the whole layer at
    decode. Huge inputs keep the search.
    """
    small = sorted_keys.size * queries.size <= _COMPARE_ALL_MAX
    method = "compare_all" if small else "scan"
    return jnp.searchsorted(sorted_keys, queries, side=side, method=method).astype(jnp.int32)


_TRIANGLE_MAX = 1 << 22  # elements of cumsum's [n, n] triangle; past this the scan is cheaper


def cumsum(values: jax.Array) -> jax.Array:
    """Inclusive int32 cumulative sum of a 1-D vector. Short vectors (the E + 1 group sizes)
    take a masked sum over the [n, n] lower triangle, which XLA fuses into the kernels around
    it, instead of XLA's scan, a reduce-window kernel of its own (a few microseconds: it shows at
    decode, where the whole layer takes tens)."""
    values = values.astype(jnp.int32)
    n = values.shape[0]
    if n * n > _TRIANGLE_MAX:
        return jnp.cumsum(values)
    lower = jnp.arange(n)[:, None] >= jnp.arange(n)[None, :]
    return jnp.sum(jnp.where(lower, values[None, :], 0), axis=1, dtype=jnp.int32)


def num_visits(num_rows: int, num_groups: int, block_m: int, align: int = 1) -> int:
    """Static length of the tile schedule for `num_rows` rows in `num_groups` groups."""
    groups = min(num_groups + 1, num_rows)
    return _cdiv(num_rows + groups * (align - 1), block_m) + groups - 1


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def tile_schedule(
    group_ends: jax.Array, num_rows: int, block_m: int, *, tail: int = 0, align: int = 1
) -> TileSchedule:
    """Visits (group, m-tile, row range) covering rows [0, num_rows) once each, in row order.

    group_ends `[G]` int32 are the groups' end rows (non-decreasing, at most num_rows: see
    `kernels._common.clamp_group_ends`). Each visit of a group spans block_m rows, but with
    tail > 0 its last visit takes up to block_m + tail rows: a group of block_m + 8 rows is then
    one visit (its expert's weights read once, the kernel's tail path multiplying the 8 extra
    rows) instead of two. The rows no group claims (past the last end) form pseudo-group G.
    """
    if tail and align != 1:
        raise ValueError("tile_schedule: tails need align=1.")
    num_groups = group_ends.shape[0]
    # The pseudo-group G holds the rows no real group claims.
    ends = jnp.concatenate([group_ends.astype(jnp.int32), jnp.array([num_rows], jnp.int32)])
    starts = jnp.concatenate([jnp.zeros((1,), jnp.int32), ends[:-1]])
    first = starts // align * align
    tiles = jnp.where(ends > starts, (ends - first + block_m - 1) // block_m, 0)
    if tail:
        real = jnp.arange(num_groups + 1) < num_groups
        merged = jnp.maximum((ends - starts - tail + block_m - 1) // block_m, 1)
        tiles = jnp.where(real & (ends > starts), merged, tiles)
    visit_end = cumsum(tiles)
    v = jnp.arange(num_visits(num_rows, num_groups, block_m, align), dtype=jnp.int32)
    group = searchsorted(visit_end, v, side="right")
    used = group <= num_groups
    group = jnp.minimum(group, num_groups)
    m_start = first[group] + (v - (visit_end[group] - tiles[group])) * block_m
    row_start = jnp.maximum(starts[group], m_start) if align > 1 else m_start
    reach = block_m + jnp.where(v == visit_end[group] - 1, tail, 0) if tail else block_m
    row_end = jnp.where(used, jnp.minimum(ends[group], m_start + reach), row_start)
    return TileSchedule(group=group, m_start=m_start, row_start=row_start, row_end=row_end)


class RowBoxes(NamedTuple):
    group_start: jax.Array  # [G] int32: first row of each group
    group_end: jax.Array  # [G] int32: one past its last row
    boxes: jax.Array  # [G] int32: aligned boxes of block_m rows covering it (1 if empty)


def row_boxes(group_ends: jax.Array, block_m: int, *, align: int = 8) -> RowBoxes:
    """Each group's rows cut into boxes of block_m rows, box r starting at the group's first row
    rounded down to a multiple of align, plus r·block_m. An empty group gets one box (whose rows
    the kernel zeroes, so its product is an exact zero)."""
    group_end = group_ends.astype(jnp.int32)
    group_start = jnp.concatenate([jnp.zeros((1,), jnp.int32), group_end[:-1]])
    first = group_start // align * align
    boxes = jnp.where(group_end > group_start, -(-(group_end - first) // block_m), 1)
    return RowBoxes(group_start, group_end, boxes.astype(jnp.int32))
