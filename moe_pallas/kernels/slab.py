"""Capacity slabs of expert-sorted rows (and each group's row sums), Pallas Triton lowering.

Math. Rows m in [0, M) are split into contiguous groups by `group_offsets` ([G + 1], group g is
rows [offsets[g], offsets[g + 1])); row m reads r(m) = src_rows[row_index[m]] if row_index is
given, else src_rows[m], times row_scale[m] (float32, rounded back to src_rows' dtype) if given.
For a capacity C:
    slab[g, c] = r(offsets[g] + c)    for c < min(size_g, C), else 0                   [G, C, D]
    sums[g]    = Σ_{m in g} r(m)       float32, every row of g, also those past C
The scaled gather is the train step's dy = row_weight ⊙ dout[row_token] built where it is read,
so the backward never writes dy as an [M, D] array of its own.
The slabs are the operands of the cublas_slab backend's batched matmul
(`moe_pallas.backends.cublas_slab`), the sums its bias gradients. Rows past a group are never
loaded (masked loads), so NaN there reaches nothing; the sums run in a fixed order (bitwise
reproducible).

Tiling. A 2-D grid over (block_d columns, group); each program walks its group's first C rows
in block_c steps, storing each [block_c, block_d] tile (zeros past the group) and adding it to a
float32 row of sums, then, with sums, the group's rows past C. One read of the rows and one write
of the slab, where XLA's fusions of the same gathers, masks and sums read the rows more than once.
"""

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from moe_pallas.kernels import _common


def _slab_kernel(*refs, cap, dim, bc, bd, gather, scale, sums):
    it = iter(refs)
    offsets_ref = next(it)
    index_ref = next(it) if gather else None
    scale_ref = next(it) if scale else None
    src_ref, slab_ref = next(it), next(it)
    sums_ref = next(it) if sums else None
    d0 = pl.program_id(0) * bd
    g = pl.program_id(1)
    start, end = offsets_ref[g], offsets_ref[g + 1]
    cols = d0 + jnp.arange(bd, dtype=jnp.int32)
    col_ok = (cols < dim)[None, :] if dim % bd else None

    def load_rows(r0):  # [bc, bd] rows r0.. of the group (gathered, scaled), zero past its end
        row_ok = (r0 + jnp.arange(bc, dtype=jnp.int32) < end)[:, None]
        mask = row_ok if col_ok is None else row_ok & col_ok
        if gather:
            src = plgpu.load(index_ref.at[pl.ds(r0, bc)], mask=row_ok[:, 0], other=0)
            tile = plgpu.load(src_ref.at[src[:, None], cols[None, :]], mask=mask, other=0)
        else:
            tile = plgpu.load(src_ref.at[pl.ds(r0, bc), pl.ds(d0, bd)], mask=mask, other=0)
        if scale:
            w = plgpu.load(scale_ref.at[pl.ds(r0, bc)], mask=row_ok[:, 0], other=0)
            tile = _common.scale_rows(tile, w)
        return tile

    def slab_step(i, acc):
        tile = load_rows(start + i * bc)
        store_mask = None if col_ok is None else jnp.broadcast_to(col_ok, (bc, bd))
        plgpu.store(slab_ref.at[g, pl.ds(i * bc, bc), pl.ds(d0, bd)], tile, mask=store_mask)
        return acc + jnp.sum(tile.astype(jnp.float32), axis=0) if sums else acc

    acc = jax.lax.fori_loop(0, jnp.int32(cap // bc), slab_step, jnp.zeros((bd,), jnp.float32))
    if sums:
        beyond = pl.cdiv(jnp.maximum(end - start - cap, 0), jnp.int32(bc))
        acc = jax.lax.fori_loop(
            0,
            beyond,
            lambda i, acc: acc + jnp.sum(load_rows(start + cap + i * bc).astype(jnp.float32), 0),
            acc,
        )
        plgpu.store(sums_ref.at[g, pl.ds(d0, bd)], acc, mask=None if col_ok is None else col_ok[0])


def slab(
    src_rows: jax.Array,
    group_offsets: jax.Array,
    capacity: int,
    *,
    row_index: jax.Array | None = None,
    row_scale: jax.Array | None = None,
    sums: bool = False,
    block_c: int = 32,
    block_d: int = 256,
    num_warps: int = 4,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """`[G, C, D]` slab of each group's first `capacity` rows (module docstring), and with sums
    also the `[G, D]` float32 sums of every row of each group.

    src_rows `[M_src, D]` (row m read as src_rows[row_index[m]] when row_index `[M]` is given,
    and multiplied by row_scale[m] when row_scale `[M]` float32 is given); group_offsets
    `[G + 1]` int32, non-decreasing, from 0 to at most M; block_c (a power of 2) shrinks to
    divide capacity.
    """
    if src_rows.ndim != 2 or group_offsets.ndim != 1:
        raise ValueError(
            f"slab needs src_rows [M, D] and group_offsets [G + 1]; got {src_rows.shape}, "
            f"{group_offsets.shape}."
        )
    if capacity <= 0:
        raise ValueError(f"capacity={capacity} must be positive.")
    num_groups, dim = group_offsets.shape[0] - 1, src_rows.shape[1]
    slab_shape = jax.ShapeDtypeStruct((num_groups, capacity, dim), src_rows.dtype)
    sums_shape = jax.ShapeDtypeStruct((num_groups, dim), jnp.float32)
    if num_groups == 0 or dim == 0:
        out = jnp.zeros(slab_shape.shape, slab_shape.dtype)
        return (out, jnp.zeros(sums_shape.shape, jnp.float32)) if sums else out
    bc, bd = math.gcd(block_c, capacity), _common.pow2_block(block_d, dim)
    gather, scale = row_index is not None, row_scale is not None
    operands = [group_offsets.astype(jnp.int32)]
    operands += [row_index.astype(jnp.int32)] if gather else []
    operands += [row_scale.astype(jnp.float32)] if scale else []
    kernel = functools.partial(
        _slab_kernel, cap=capacity, dim=dim, bc=bc, bd=bd, gather=gather, scale=scale, sums=sums
    )
    return pl.pallas_call(
        kernel,
        out_shape=(slab_shape, sums_shape) if sums else slab_shape,
        grid=(pl.cdiv(dim, bd), num_groups),
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=3),
        interpret=_common.interpret_mode(),
        name="slab",
    )(*operands, src_rows)
