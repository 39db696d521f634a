"""What every kernel shares: the target device, int32 index limits, group ends, block sizes,
masked Triton loads, the programs' swizzle and tile-height paths.

Kernels import this module, `moe_pallas.activations` and `moe_pallas.dispatch` (pure jnp math)
and nothing else of the package, so the layers above (backends, ops, the layer) can change
without touching them.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from moe_pallas import dispatch

# Row ids, group offsets, tile starts and column indices are int32 in the kernels and the
# schedules, so no dimension may reach 2^31. Element counts may: Pallas computes pointer offsets in
# int64 for any array over 2^32 bytes, and in int32 only below, where every array of 2- or 4-byte
# elements has fewer than 2^31 elements (jax/_src/pallas/triton/lowering.py,
# _compute_offsets_from_indices).
MAX_DIM = 2**31 - 1
INTERPRET_SMS = 2  # persistent grids in interpret mode: enough CTAs to exercise the striding


def div(a, b):
    """`jax.lax.div` of int32 index values. A Python int operand is cast to int32 first: under
    `jax_enable_x64` lax would make it int64, and lax ops refuse mixed dtypes."""
    return jax.lax.div(jnp.asarray(a, jnp.int32), jnp.asarray(b, jnp.int32))


def rem(a, b):
    """`jax.lax.rem` of int32 index values (see `div`)."""
    return jax.lax.rem(jnp.asarray(a, jnp.int32), jnp.asarray(b, jnp.int32))


def and_masks(a, b):
    """a & b, either of them None for "every element"."""
    return b if a is None else a if b is None else a & b


def masked_load(ref, mask):
    """A Triton load of ref, zeros where mask is False; unmasked without a mask (Triton rejects
    `other` without one, and unmasked loads are the common, faster case)."""
    return plgpu.load(ref, mask=mask) if mask is None else plgpu.load(ref, mask=mask, other=0)


def swizzled_tile(num_visits: int, n_tiles, group_m: int):
    """(visit, column tile) of this program of a 1-D grid over the num_visits x n_tiles pairs,
    walked in bands of group_m visits down each column tile before moving right, so consecutive
    programs reuse one column tile of an expert's weights from L2 (a band's visits are mostly
    one group's when it has many rows)."""
    pid = pl.program_id(0)
    band = group_m * n_tiles
    first_v = div(pid, band) * group_m
    band_rows = jnp.minimum(num_visits - first_v, group_m)
    return first_v + rem(rem(pid, band), band_rows), div(rem(pid, band), band_rows)


def run_paths(paths, span, run, body, *, tail: bool = False) -> None:
    """body(p) for the one tile height p of `BlockConfig.m_paths()` (largest first) that takes a
    visit of `span` rows where `run`: p/2 < span <= p (the smallest path every span <= p, the
    largest every span > p/2; with `tail`, a span past the largest is the tail path's)."""
    for i, p in enumerate(paths):
        when = run
        if i > 0 or tail:
            when &= span <= p
        if i < len(paths) - 1:
            when &= span > p // 2
        pl.when(when)(functools.partial(body, p))


def target_device():
    """The device kernels are compiled for: the abstract device of an active abstract mesh (how
    tests lower GPU kernels on a CPU machine), else jax's first device."""
    device = jax.sharding.get_abstract_mesh().abstract_device
    return device if device is not None else jax.devices()[0]


def interpret_mode() -> bool:
    """Pallas kernels run in interpret mode unless they are compiled for a GPU: on a GPU backend,
    or when lowered ahead of time for an abstract GPU device (`jax.sharding.use_abstract_mesh`
    with an `AbstractDevice` of platform "gpu")."""
    return target_device().platform != "gpu"


def num_sms() -> int:
    """Streaming multiprocessors of the target GPU (persistent grids, work spreading); in
    interpret mode `INTERPRET_SMS`."""
    device = target_device()
    if device.platform != "gpu":
        return INTERPRET_SMS
    return getattr(device, "num_cores", None) or device.core_count


def check_int32_sizes(kernel: str, **shapes: tuple[int, ...]) -> None:
    """Raise a ValueError at trace time if a dimension is too large for int32 indices."""
    for name, shape in shapes.items():
        if shape and max(shape) > MAX_DIM:
            raise ValueError(
                f"{kernel}: {name} of shape {tuple(shape)} has a dimension >= 2^31, past the "
                "int32 row and column indices of the kernels; split the tokens into chunks (e.g. "
                'jax.lax.map over token blocks) or use implementation="xla".'
            )


def check_epilogue(num_groups: int, n_dim: int, num_rows: int, bias, row_scale) -> None:
    """Raise a ValueError unless bias is [G, N] and row_scale 1-D with at least num_rows entries
    (either may be None)."""
    if bias is not None and bias.shape != (num_groups, n_dim):
        raise ValueError(
            f"bias must be [{num_groups}, {n_dim}] (one row per group), got {bias.shape}."
        )
    if row_scale is not None and (row_scale.ndim != 1 or row_scale.shape[0] < num_rows):
        raise ValueError(
            f"row_scale must be 1-D with >= {num_rows} entries, got {row_scale.shape}."
        )


def grouped_dims(lhs, rhs, group_sizes, transpose_rhs: bool) -> tuple[int, int, int]:
    """(G, K, N) of a grouped matmul lhs [M, K] x rhs [G, K, N] (or [G, N, K] transposed)."""
    num_groups = rhs.shape[0]
    k_dim, n_dim = (rhs.shape[2], rhs.shape[1]) if transpose_rhs else rhs.shape[1:]
    if lhs.shape[1] != k_dim:
        raise ValueError(f"lhs has K={lhs.shape[1]} columns but rhs contracts over K={k_dim}.")
    if group_sizes.shape != (num_groups,):
        raise ValueError(f"group_sizes must be [{num_groups}], got {group_sizes.shape}.")
    return num_groups, k_dim, n_dim


def clamp_group_ends(group_sizes: jax.Array, num_rows: int) -> jax.Array:
    """`[G]` int32 one-past-the-last row of each group, made safe to schedule: negative sizes
    count as 0 and the running sum saturates at num_rows (trailing groups lose the rows past the
    end); valid sizes pass unchanged. Without this a negative size would move a group start below
    row 0 (out-of-bounds loads and stores on the GPU) and a huge one would overflow int32."""
    check_int32_sizes("grouped matmul", rows=(num_rows,))
    sizes = jnp.clip(group_sizes.astype(jnp.int32), 0, num_rows)
    if sizes.shape[0] * num_rows <= MAX_DIM:  # no partial sum of clipped sizes overflows int32
        return jnp.minimum(dispatch.cumsum(sizes), num_rows)
    # saturating cumsum min(a + b, num_rows), no int32 intermediate overflows (~10x the ops)
    return jax.lax.associative_scan(lambda a, b: b + jnp.minimum(a, num_rows - b), sizes)


def scale_rows(rows: jax.Array, row_scale: jax.Array) -> jax.Array:
    """rows[m] · row_scale[m] as a float32 product rounded once to rows' dtype: the one rounding
    of the backward's dy = row_weight ⊙ dout[row_token], wherever it is built (the slab and tgmm
    kernels' loads, `backends.scaled_rows`), so every backend's weight gradient sees the same
    bits."""
    return (rows.astype(jnp.float32) * row_scale.astype(jnp.float32)[:, None]).astype(rows.dtype)


def clamp_group_sizes(group_sizes: jax.Array, num_rows: int) -> jax.Array:
    """The sizes of `clamp_group_ends`' groups."""
    return jnp.diff(clamp_group_ends(group_sizes, num_rows), prepend=jnp.zeros((1,), jnp.int32))


def pow2_block(block: int, dim: int) -> int:
    """block, shrunk to the smallest power of 2 covering dim, but at least 16 (the Triton dot's
    minimum)."""
    return min(block, max(16, 1 << max(dim - 1, 0).bit_length()))


def dividing_block(block: int, dim: int, floor: int) -> int:
    """The power-of-2 block halved while it does not divide dim, down to floor: a block that
    divides the dimension needs no masked tail (2880 = 45 * 64)."""
    while dim % block and block > floor:
        block //= 2
    return block
