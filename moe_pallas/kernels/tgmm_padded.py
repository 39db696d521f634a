"""Transposed grouped matmul out[g] = lhs[rows of g]ᵀ @ rhs[rows of g] as one batched matmul.

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
cuBLAS's batched kernel writes faster than our Triton tgmm, whose loads and stores barely overlap
(module docstring there). On the H200 (2026-12-01, benchmarks/results/2026-12-01_h200_session11/):
gpt-oss d w_gate_up at T = 2048 1.41 ms for the batched matmul alone against 1.70 for the Triton
tgmm; the whole train step in three alternating rounds 6.22-6.78 ms against 6.73-6.84 (gpt-oss
T = 2048), 8.55-9.15 against 9.39-10.52 (T = 4096), 12.28-13.00 against 12.74-13.06 (SwiGLU
T = 2048). With hundreds of rows per group the problem is compute bound and the slabs pad the
FLOPs (C = 608 at 512 rows per group: +19%), yet cuBLAS still beats our tgmm (400-436 TFLOP/s
there, session 2): train step 23.05 / 23.37 ms against 26.71 / 28.78 (gpt-oss T = 16384),
24.32 / 24.35 against 26.87 / 29.10 (SwiGLU T = 8192), two alternating rounds. So `implementation="auto"` takes this
path for 16-bit operands at more than 16 rows per group (`applies`); at decode sizes (not
measured) and on explicit Pallas backends the Triton kernel stays.
The padded rows are not free: at T = 2048 cuBLAS took 13-17% longer over C = 96 slabs than over
the groups' first 64 rows, within 10% of its time over 128 (benchmarks/results/
2026-12-02_h200_session18/); only a grouped matmul contracting each group over its own rows
would save that, as no smaller capacity keeps the overflow pass to a few groups.
"""

import math

import jax
import jax.numpy as jnp

from moe_pallas.kernels import config as _config
from moe_pallas.kernels import slab as _slab
from moe_pallas.kernels.gmm import clamp_group_ends
from moe_pallas.kernels.tgmm import tgmm as _triton_tgmm


def capacity(num_rows: int, num_groups: int) -> int:
    """Rows per group of the slabs: the mean plus four standard deviations of a uniformly routed
    group's size (binomial, sqrt(mean)), rounded up to 32; e.g. 96 at 64 rows per group and 192
    at 128. Groups above it take the overflow path."""
    mean = num_rows / max(num_groups, 1)
    return max(32, math.ceil((mean + 4 * math.sqrt(mean)) / 32) * 32)


def applies(lhs: jax.Array, rhs: jax.Array, num_groups: int) -> bool:
    """Whether "auto" computes this weight gradient here: 16-bit operands (what was measured) at
    more than 16 rows per group (`config.rows_class` "small" and "large", not decode's "tiny")."""
    measured = _config.rows_class(rhs.shape[0], num_groups) != "tiny"
    return measured and all(jnp.dtype(a.dtype).itemsize == 2 for a in (lhs, rhs))


def tgmm(
    lhs: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    *,
    lhs_row_index: jax.Array | None = None,
    out_dtype=None,
    rhs_sums: bool = False,
    rows_per_group: int | None = None,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """`[G, K, N]` products (and with rhs_sums the `[G, N]` float32 sums of rhs), the arguments
    of `kernels.tgmm.tgmm`; rows_per_group overrides `capacity` (tests force the overflow path)."""
    if lhs.ndim != 2 or rhs.ndim != 2:
        raise ValueError(f"tgmm needs lhs [M, K] and rhs [M, N]; got {lhs.shape}, {rhs.shape}.")
    num_rows, num_groups = rhs.shape[0], group_sizes.shape[0]
    out_dtype = jnp.dtype(out_dtype or jnp.promote_types(lhs.dtype, rhs.dtype))
    cap = rows_per_group or capacity(num_rows, num_groups)
    ends = clamp_group_ends(group_sizes, num_rows)
    offsets = jnp.concatenate([jnp.zeros((1,), jnp.int32), ends])
    lhs_slab = _slab.slab(lhs, offsets, cap, row_index=lhs_row_index)
    rhs_slab = _slab.slab(rhs, offsets, cap, sums=rhs_sums)
    rhs_slab, sums = rhs_slab if rhs_sums else (rhs_slab, None)
    out = jax.lax.dot_general(
        lhs_slab, rhs_slab, (((1,), (1,)), ((0,), (0,))), preferred_element_type=out_dtype
    )
    out = _triton_tgmm(
        lhs,
        rhs,
        group_sizes,
        lhs_row_index=lhs_row_index,
        out_dtype=out_dtype,
        row_skip=cap,
        accumulate=(out, None),
    )
    return (out, sums) if rhs_sums else out
