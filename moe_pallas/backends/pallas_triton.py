"""The pallas_triton backend: every op on the Pallas Triton kernels, block sizes from the table.

Config of a call: the tuning table's "pallas_triton" entry for (kernel, dtype, K, N, rows class)
(`moe_pallas.tuning`), fitted to the problem, with block_n then narrowed by `spread_block_n` for
the gmm kernels: with few rows each hit expert's weights must be split over every SM to stream at
full bandwidth (at T = 1, 4 experts x 45 column tiles would leave SMs idle). A gmm on a
`quant.QuantizedWeight` runs `kernels.gmm_quant` with the entry of its stored element type
(float8_e4m3fn, float4_e2m1fn), else the bf16 ("*") entry of its shape; with `fp8_activations` its
activations are quantised here, per row and 128 values of K (`quant.quantize_rows`), for
gmm_quant's FP8 products, whose config is the "gmm_a8" / "gmm_glu_a8" entry where the table has one
(`tuning.A8_KERNELS`), else the format's. Its transposed products (the backward's) run
`kernels.gmm_quant_t` with the "gmm_t" entry of the element type, whose block_n spreads no narrower
than 128 bytes of a stored [N, K] row (`min_block_n`): the rows run along the output's columns
there.
"""

import dataclasses

import jax.numpy as jnp

from moe_pallas import backends, quant, tuning
from moe_pallas.kernels.combine import combine
from moe_pallas.kernels.config import BlockConfig
from moe_pallas.kernels.glu_bwd import glu_backward
from moe_pallas.kernels.gmm import gmm as _gmm
from moe_pallas.kernels.gmm_quant import gmm_quant as _gmm_quant
from moe_pallas.kernels.gmm_quant_t import gmm_quant_t as _gmm_quant_t
from moe_pallas.kernels.tgmm import tgmm as _tgmm

PROGRAMS_PER_SM = 4  # (row tile, column tile) pairs per SM that keep every SM streaming weights


def spread_block_n(
    block_n: int, n: int, num_rows: int, num_groups: int, min_block_n: int, programs: int
) -> int:
    """block_n halved (not below min_block_n) until the min(rows, groups) experts hit have
    `programs` (row tile, column tile) pairs."""
    while block_n > min_block_n and min(num_rows, num_groups) * -(-n // block_n) < programs:
        block_n //= 2
    return block_n


def min_block_n(kernel: str, activation: str | None = None, dtype=None) -> int:
    """The narrowest block_n `config` spreads to: a tile's rows of weights stay at least 64
    columns (128 bf16 bytes) contiguous, as narrower tiles streamed the weights slower on the
    H200 in spite of more programs. gpt-oss's GLU reads its gate and up columns interleaved,
    2·block_n contiguous; SwiGLU's reads two blocks of block_n. gmm_t reads rows of the weights'
    K dimension, contiguous at any block_n, but on quantised weights (`kernels.gmm_quant_t`)
    the stored [N, K] rows run across the tile's columns: 128 bytes are 128 fp8 columns, 256
    mxfp4 ones."""
    if kernel == "gmm_glu":
        return 32 if activation == "gptoss" else 64
    if kernel == "gmm_t":
        stored = {jnp.dtype(jnp.float8_e4m3fn): 128, jnp.dtype(jnp.float4_e2m1fn): 256}
        return stored.get(None if dtype is None else jnp.dtype(dtype), 32)
    return 64


def config(
    kernel: str,
    dtype,
    num_rows: int,
    num_groups: int,
    k: int,
    n: int,
    activation=None,
    fp8_activations: bool = False,
) -> BlockConfig:
    """The block config of one call (module docstring)."""
    rows = tuning.rows_class(num_rows, num_groups)
    entry = None
    if fp8_activations:  # the FP8-activation tiles, where tuned
        entry = tuning.lookup("pallas_triton", f"{kernel}_a8", dtype=dtype, k=k, n=n, rows=rows)
    if entry is None:
        entry = tuning.lookup("pallas_triton", kernel, dtype=dtype, k=k, n=n, rows=rows)
    cfg = BlockConfig(**entry) if entry is not None else BlockConfig()
    cfg = cfg.fit(num_rows, k, n)
    if kernel != "tgmm":
        programs = PROGRAMS_PER_SM * tuning.policy_sms()
        block_n = spread_block_n(
            cfg.block_n, n, num_rows, num_groups, min_block_n(kernel, activation, dtype), programs
        )
        cfg = dataclasses.replace(cfg, block_n=block_n)
    return cfg


def gmm(
    lhs,
    rhs,
    group_sizes,
    *,
    lhs_row_index=None,
    transpose_rhs=False,
    activation=None,
    out_dtype=None,
    **epilogue,
):
    num_rows = lhs.shape[0] if lhs_row_index is None else lhs_row_index.shape[0]
    n_dim = rhs.shape[1] if transpose_rhs else rhs.shape[2]
    kernel = backends.gmm_kernel_name(activation, transpose_rhs)
    quantised = quant.is_quantized(rhs)
    cfg = config(
        kernel,
        rhs.element_dtype if quantised else jnp.promote_types(lhs.dtype, rhs.dtype),
        num_rows,
        rhs.shape[0],
        lhs.shape[1],
        n_dim // 2 if activation else n_dim,
        activation,
        fp8_activations=quantised and rhs.fp8_activations and not transpose_rhs,
    )
    if quantised and transpose_rhs:  # (`gmm_quant_t.supports`: backends.gmm)
        return _gmm_quant_t(
            lhs,
            rhs,
            group_sizes,
            lhs_row_index=lhs_row_index,
            out_dtype=out_dtype,
            config=cfg,
        )
    if quantised:
        lhs_scales = None
        if rhs.fp8_activations:  # e4m3 rows for the FP8 tensor cores
            out_dtype = out_dtype or lhs.dtype
            lhs, lhs_scales = quant.quantize_rows(lhs)
        return _gmm_quant(
            lhs,
            rhs,
            group_sizes,
            lhs_row_index=lhs_row_index,
            activation=activation,
            out_dtype=out_dtype,
            lhs_scales=lhs_scales,
            config=cfg,
            **epilogue,
        )
    return _gmm(
        lhs,
        rhs,
        group_sizes,
        lhs_row_index=lhs_row_index,
        transpose_rhs=transpose_rhs,
        activation=activation,
        out_dtype=out_dtype,
        config=cfg,
        **epilogue,
    )


def tgmm(lhs, rhs, group_sizes, *, lhs_row_index=None, out_dtype=None, rhs_sums=False, **kwargs):
    rhs_row_index = kwargs.get("rhs_row_index")
    cfg = config(
        "tgmm",
        jnp.promote_types(lhs.dtype, rhs.dtype),
        rhs.shape[0] if rhs_row_index is None else rhs_row_index.shape[0],
        group_sizes.shape[0],
        lhs.shape[1],
        rhs.shape[1],
    )
    return _tgmm(
        lhs,
        rhs,
        group_sizes,
        lhs_row_index=lhs_row_index,
        out_dtype=out_dtype,
        rhs_sums=rhs_sums,
        config=cfg,
        **kwargs,
    )


BACKEND = backends.Backend(
    name="pallas_triton",
    gmm=gmm,
    tgmm=tgmm,
    combine=combine,
    glu_backward=glu_backward,
)
