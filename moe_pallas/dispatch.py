"""Routing metadata in plain JAX with static shapes: expert sort and the kernels' tile schedule.

`dispatch` sorts the M = T·k (token, slot) pairs by expert, stably, so rows of one expert form a
contiguous group and ties keep token order (deterministic results). Pairs whose expert id lies
outside [0, E) are "masked": they sort after every valid row and belong to no group, so
`group_offsets[E]` counts the valid rows only.

`tile_schedule` turns group sizes into the work list of the grouped matmul (no padding): each
group's rows are cut into m-tiles of `block_m` starting at the group's first row, so a visit
touches one group only and a group of at most `block_m` rows is one visit, reading its expert's
weights once (tiles aligned to multiples of `block_m` instead would visit most groups twice in the
weight-bandwidth-bound regime of a few dozen rows per expert). Rows past `sum(group_sizes)` form
one extra pseudo-group (id G) whose visits write zeros. Since
sum_g cdiv(size_g, block_m) <= cdiv(M, block_m) + (non-empty groups) - 1, and at most min(G+1, M)
groups are non-empty, `cdiv(M, block_m) + min(G+1, M) - 1` visits always suffice; unused visits
get an empty row range.
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


class TileSchedule(NamedTuple):
    group: jax.Array  # [V] int32: group of each visit (G = the zero-filled tail rows)
    m_start: jax.Array  # [V] int32: first row of the visited m-tile (the kernels' row base)
    row_start: jax.Array  # [V] int32: first row of the visit (= m_start: tiles start in the group)
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
    )


_COMPARE_ALL_MAX = 1 << 26  # compares; past this the binary search's O(log n) launches are cheaper


def searchsorted(sorted_keys: jax.Array, queries: jax.Array, side: str) -> jax.Array:
    """int32 `jnp.searchsorted`. compare_all (every query against every key) is one fused kernel,
    where the default binary search is a loop of small launches: on the H200 that loop cost
    ~0.1 ms per call at decode, where the whole layer takes ~0.16 ms. Huge inputs keep the search.
    """
    small = sorted_keys.size * queries.size <= _COMPARE_ALL_MAX
    method = "compare_all" if small else "scan"
    return jnp.searchsorted(sorted_keys, queries, side=side, method=method).astype(jnp.int32)


_TRIANGLE_MAX = 1 << 22  # elements of cumsum's [n, n] triangle; past this the scan is cheaper


def cumsum(values: jax.Array) -> jax.Array:
    """Inclusive int32 cumulative sum of a 1-D vector. Short vectors (the E + 1 group sizes)
    take a masked sum over the [n, n] lower triangle, fused into the kernels around it, instead
    of XLA's scan, a reduce-window kernel of its own (~5 us on the H200): the layer's forward at
    T = 1 took 0.067 ms of GPU time instead of 0.070 (gpt-oss) and 0.113 instead of 0.117
    (SwiGLU) in traces of 2026-12-01 (benchmarks/results/2026-12-01_h200_session9/)."""
    values = values.astype(jnp.int32)
    n = values.shape[0]
    if n * n > _TRIANGLE_MAX:
        return jnp.cumsum(values)
    lower = jnp.arange(n)[:, None] >= jnp.arange(n)[None, :]
    return jnp.sum(jnp.where(lower, values[None, :], 0), axis=1, dtype=jnp.int32)


def num_visits(num_rows: int, num_groups: int, block_m: int) -> int:
    """Static length of the tile schedule for `num_rows` rows in `num_groups` groups."""
    return _cdiv(num_rows, block_m) + min(num_groups + 1, num_rows) - 1


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def tile_schedule(
    group_sizes: jax.Array, num_rows: int, block_m: int, *, tail: int = 0
) -> TileSchedule:
    """Visits (group, m-tile, row range) covering rows [0, num_rows) once each, in row order.

    Each visit of a group spans block_m rows from the group's first row on, but its last visit
    takes up to block_m + tail rows: with tail > 0 a group of block_m + 8 rows is one visit (its
    expert's weights read once, the kernel's tail path multiplying the 8 extra rows) instead of
    two. The rows no group claims (past sum(group_sizes)) form pseudo-group G, in block_m visits.
    """
    ends = jnp.minimum(cumsum(group_sizes), num_rows)
    return schedule_from_ends(ends, num_rows, block_m, tail=tail)


def schedule_from_ends(
    group_ends: jax.Array, num_rows: int, block_m: int, *, tail: int = 0
) -> TileSchedule:
    """`tile_schedule` from the groups' end rows (`[G]` int32, non-decreasing, at most num_rows),
    for callers that have them: one scan fewer."""
    num_groups = group_ends.shape[0]
    ends = group_ends.astype(jnp.int32)
    # The pseudo-group G holds the rows no real group claims.
    ends = jnp.concatenate([ends, jnp.array([num_rows], jnp.int32)])
    starts = jnp.concatenate([jnp.zeros((1,), jnp.int32), ends[:-1]])
    sizes = ends - starts
    tiles = (sizes + block_m - 1) // block_m
    if tail:
        real = jnp.arange(num_groups + 1) < num_groups
        merged = jnp.maximum((sizes - tail + block_m - 1) // block_m, 1)
        tiles = jnp.where(real & (sizes > 0), merged, tiles)
    visit_end = cumsum(tiles)
    v = jnp.arange(num_visits(num_rows, num_groups, block_m), dtype=jnp.int32)
    group = searchsorted(visit_end, v, side="right")
    used = group <= num_groups
    group = jnp.minimum(group, num_groups)
    m_start = starts[group] + (v - (visit_end[group] - tiles[group])) * block_m
    reach = block_m + jnp.where(v == visit_end[group] - 1, tail, 0) if tail else block_m
    row_end = jnp.where(used, jnp.minimum(ends[group], m_start + reach), m_start)
    return TileSchedule(group=group, m_start=m_start, row_start=m_start, row_end=row_end)
