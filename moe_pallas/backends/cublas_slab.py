"""The cublas_slab backend: tgmm out[g] = lhs[rows of g]ᵀ @ rhs[rows of g] as one batched matmul.

Math. The contract of `kernels.tgmm.tgmm` (row gather, rhs_sums, empty groups exact zeros, rows
past sum(group_sizes) left out), computed differently: each group's first C rows (C =
`capacity(M, G)`) are copied into `[G, C, K]` and `[G, C, N]` slabs, zero past the group
(`kernels.slab`, which also sums each group's rhs rows, all of them, in float32), and one batched
`dot_general` contracting over C gives every group's product at once (on the GPU, XLA runs it on
cuBLAS with float32 accumulation and writes out_dtype). A group with more than C rows (skewed
routing, one hot expert) has its rows past C added by the Triton tgmm's overflow mode
(`row_skip=C`, `accumulate`) into the same outputs, which touches only such groups; nothing is
dropped.

Why. With a few dozen rows per group the weight gradient is bound by writing `[G, K, N]`, and
cuBLAS's batched kernel writes faster than the Triton tgmm, whose loads and stores barely
overlap; with hundreds of rows per group cuBLAS still multiplies faster, in spite of the slabs'
padded rows (C = 608 at 512 rows per group: +19% FLOPs). So on the H200 the tuning table sends
16-bit weight gradients at more than 16 rows per group here under "auto" (docs/decisions.md has
the figures). The padded rows are not free: only a grouped matmul contracting each group over
its own rows would save them, as no smaller capacity keeps the overflow pass to a few groups.
"""

import math

import jax
import jax.numpy as jnp

from moe_pallas import backends
from moe_pallas.backends import pallas_triton
from moe_pallas.kernels import _common
from moe_pallas.kernels import slab as _slab


def capacity(num_rows: int, num_groups: int) -> int:
    """Rows per group of the slabs: the mean plus four standard deviations of a uniformly routed
    group's size (binomial, sqrt(mean)), rounded up to 32; e.g. 96 at 64 rows per group and 192
    at 128. Groups above it take the overflow path."""
    mean = num_rows / max(num_groups, 1)
    return max(32, math.ceil((mean + 4 * math.sqrt(mean)) / 32) * 32)


def supports(problem: backends.Problem) -> bool:
    """16-bit operands (what the tuning table's entries were measured on)."""
    return all(jnp.dtype(d).itemsize == 2 for d in problem.dtypes)


def tgmm(
    lhs: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    *,
    lhs_row_index: jax.Array | None = None,
    rhs_row_index: jax.Array | None = None,
    rhs_row_scale: jax.Array | None = None,
    out_dtype=None,
    rhs_sums: bool = False,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """`[G, K, N]` products (and with rhs_sums the `[G, N]` float32 sums of rhs's rows), the
    arguments of `kernels.tgmm.tgmm`."""
    if lhs.ndim != 2 or rhs.ndim != 2:
        raise ValueError(f"tgmm needs lhs [M, K] and rhs [M, N]; got {lhs.shape}, {rhs.shape}.")
    num_rows = rhs.shape[0] if rhs_row_index is None else rhs_row_index.shape[0]
    num_groups = group_sizes.shape[0]
    out_dtype = jnp.dtype(out_dtype or jnp.promote_types(lhs.dtype, rhs.dtype))
    cap = capacity(num_rows, num_groups)
    ends = _common.clamp_group_ends(group_sizes, num_rows)
    offsets = jnp.concatenate([jnp.zeros((1,), jnp.int32), ends])
    lhs_slab = _slab.slab(lhs, offsets, cap, row_index=lhs_row_index)
    rhs_slab = _slab.slab(
        rhs, offsets, cap, row_index=rhs_row_index, row_scale=rhs_row_scale, sums=rhs_sums
    )
    rhs_slab, sums = rhs_slab if rhs_sums else (rhs_slab, None)
    out = jax.lax.dot_general(
        lhs_slab, rhs_slab, (((1,), (1,)), ((0,), (0,))), preferred_element_type=out_dtype
    )
    out = pallas_triton.tgmm(
        lhs,
        rhs,
        group_sizes,
        lhs_row_index=lhs_row_index,
        rhs_row_index=rhs_row_index,
        rhs_row_scale=rhs_row_scale,
        out_dtype=out_dtype,
        row_skip=cap,
        accumulate=(out, None),
    )
    return (out, sums) if rhs_sums else out


def _on_gpu() -> bool:
    return _common.target_device().platform == "gpu"


BACKEND = backends.Backend(
    name="cublas_slab", gmm=None, tgmm=tgmm, supports=supports, available=_on_gpu
)
