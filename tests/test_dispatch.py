import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moe_pallas.dispatch import cumsum, dispatch, num_visits, tile_schedule


def _check_dispatch(topk_idx: np.ndarray, num_experts: int):
    t, k = topk_idx.shape
    d = dispatch(jnp.asarray(topk_idx), num_experts)
    flat = topk_idx.reshape(-1)
    key = np.where((flat >= 0) & (flat < num_experts), flat, num_experts)
    expected_pairs = np.argsort(key, kind="stable")
    np.testing.assert_array_equal(d.row_pair, expected_pairs)
    np.testing.assert_array_equal(d.row_token, expected_pairs // k)
    np.testing.assert_array_equal(np.asarray(d.row_pair)[np.asarray(d.pair_row)], np.arange(t * k))
    sizes = np.bincount(key, minlength=num_experts + 1)[:num_experts]
    np.testing.assert_array_equal(d.group_sizes, sizes)
    np.testing.assert_array_equal(d.group_offsets, np.concatenate([[0], np.cumsum(sizes)]))
    for name in d._fields:
        assert getattr(d, name).dtype == jnp.int32, name


@pytest.mark.parametrize("t,k,e", [(1, 1, 4), (7, 2, 8), (64, 4, 128), (33, 8, 512), (5, 3, 1)])
def test_dispatch_random(t, k, e):
    rng = np.random.default_rng(t * 1000 + k * 10 + e)
    # Draw from a few experts so most are empty and ties are plentiful (stability matters).
    experts = rng.choice(e, size=min(e, 3), replace=False)
    _check_dispatch(rng.choice(experts, size=(t, k)).astype(np.int32), e)


def test_dispatch_all_rows_in_one_expert():
    _check_dispatch(np.full((9, 4), 5, np.int32), 8)


def test_dispatch_masked_ids_sort_last_and_count_nowhere():
    topk = np.array([[0, -1], [8, 3], [3, 0], [99, 2]], np.int32)
    d = dispatch(jnp.asarray(topk), 8)
    assert int(d.group_offsets[-1]) == 5
    np.testing.assert_array_equal(np.asarray(d.row_pair)[5:], [1, 2, 6])
    _check_dispatch(topk, 8)


def test_dispatch_rejects_bad_input():
    with pytest.raises(ValueError, match=r"\[T, k\]"):
        dispatch(jnp.zeros((4,), jnp.int32), 4)
    with pytest.raises(TypeError, match="integer"):
        dispatch(jnp.zeros((4, 2), jnp.float32), 4)


_SCHEDULE_CASES = [
    ([3, 0, 5, 0, 8], 16),
    ([0, 0, 0], 10),  # every row in the zero-filled tail
    ([20], 20),
    ([0, 20, 0], 23),  # rows past sum(group_sizes)
    ([1], 1),
    ([7, 9, 0, 2], 18),
]


@pytest.mark.parametrize(
    "sizes, num_rows, block_m, tail",
    [(s, n, bm, 0) for bm in (1, 4, 16) for s, n in _SCHEDULE_CASES]
    + [
        ([16, 17, 24, 25, 0, 40, 41, 56, 57], 300, 16, 8),
        ([33, 0, 1, 64, 65, 80], 260, 32, 16),
        ([0, 0], 5, 16, 16),  # every row in the zero-filled tail
    ],
)
def test_tile_schedule_covers_each_row_once(sizes, num_rows, block_m, tail):
    """Every row in one visit; a group's visits start at its first row and span block_m rows,
    except its last, which is shorter or (with tail) up to block_m + tail rows; the pseudo-group
    of unclaimed rows keeps block_m visits."""
    ends = np.minimum(np.cumsum(sizes), num_rows)
    sched = tile_schedule(jnp.asarray(ends, jnp.int32), num_rows, block_m, tail=tail)
    assert sched.group.shape == (num_visits(num_rows, len(sizes), block_m),)
    owner = np.full(num_rows, -1)
    starts = np.concatenate([[0], ends[:-1]])
    visits = np.zeros(len(sizes) + 1, int)
    for g, m0, r0, r1 in zip(*(np.asarray(a) for a in sched)):
        if r0 == r1:
            continue
        visits[g] += 1
        assert m0 == r0 < r1 <= num_rows
        if g < len(sizes):
            assert starts[g] <= r0 and r1 <= ends[g]
            assert (r0 - starts[g]) % block_m == 0  # tiles start at the group's first row
            assert r1 - r0 == block_m or r1 == ends[g]  # only the last visit is short or long
            assert r1 - r0 <= block_m + tail
        else:
            assert r0 >= ends[-1] and r1 - r0 <= block_m
        assert (owner[r0:r1] == -1).all()
        owner[r0:r1] = g
    assert (owner >= 0).all()
    want = [max(1, -(-(int(n) - tail) // block_m)) if n else 0 for n in ends - starts]
    assert list(visits) == [*want, -(-(num_rows - int(ends[-1])) // block_m)]


def test_large_inputs_take_the_binary_search_with_the_same_result(monkeypatch):
    import moe_pallas.dispatch as dispatch_module

    rng = np.random.default_rng()
    sizes = jnp.asarray(np.minimum(np.cumsum(rng.integers(0, 40, 300)), 9000), jnp.int32)
    topk_idx = jnp.asarray(rng.integers(0, 300, (500, 4)), jnp.int32)
    fused = tile_schedule(sizes, 9000, 16), dispatch(topk_idx, 300)
    monkeypatch.setattr(dispatch_module, "_COMPARE_ALL_MAX", 0)  # as if the inputs were huge
    searched = tile_schedule(sizes, 9000, 16), dispatch(topk_idx, 300)
    for a, b in zip(jax.tree.leaves(fused), jax.tree.leaves(searched)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("n", [1, 7, 257, 2049])  # 2049² is past the triangle's 2^22: the scan
def test_cumsum_matches_numpy(n):
    values = np.random.default_rng(n).integers(0, 1000, size=n).astype(np.int32)
    got = cumsum(jnp.asarray(values))
    assert got.dtype == jnp.int32
    np.testing.assert_array_equal(got, np.cumsum(values))
