"""The mosaic_gpu backend: the grouped matmuls on Hopper's Mosaic GPU kernels (wgmma, TMA).

What it takes: gmm and tgmm whose operands share one 16-bit float dtype (wgmma's inputs) and
whose shapes it tiles (below), and gmm on FP8-activation weights (`quant.QuantizedWeight` with
`fp8_activations`, the shapes and GLUs its Limits name) on `kernels.gmm_fp8_mgpu`, the
activations quantised here (`quant.quantize_rows`) and their e4m3 rows gathered; the policy gives
other calls, and the block's combine and GLU backward, to pallas_triton. A row
gather reads an XLA-gathered copy of lhs (Hopper's TMA cannot gather rows). tgmm's rhs_sums come
from a Triton tgmm whose lhs is one dummy column, so its own [G, 1, N] product is negligible.
Shapes: N and K multiples of 16 (gmm), K of 64 (tgmm); calls of other shapes run on Triton too.

Config of a gmm: the tuning table's "mosaic_gpu" entry for the shape if there is one (the shapes
where "auto" runs this backend), else `default_config`. "auto" gives it only plain gmm calls (no
row gather, 16-bit output) and FP8-activation calls (row gather and a float32 output included:
FP8 training's g, `moe_pallas.fused`, whose entries are "gmm_a8_f32"), as its table entries were
measured on those.
"""

import dataclasses

import jax.numpy as jnp

from moe_pallas import backends, quant, tuning
from moe_pallas.backends import pallas_triton
from moe_pallas.kernels import _common
from moe_pallas.kernels import gmm_fp8_mgpu as _gmm_fp8
from moe_pallas.kernels import gmm_mgpu as _gmm_mgpu
from moe_pallas.kernels import tgmm_mgpu as _tgmm_mgpu
from moe_pallas.kernels.gmm_mgpu import MIN_BLOCK_N, MosaicConfig


def available() -> bool:
    """Whether the target device is an sm90 GPU (H100/H200), where Mosaic GPU kernels compile."""
    device = _common.target_device()
    if device.platform != "gpu":
        return False
    capability = getattr(device, "compute_capability", None)
    if capability is not None:
        return capability == "9.0"
    return any(name in device.device_kind for name in ("H100", "H200", "H800", "H20"))


def supports(problem: backends.Problem) -> bool:
    """One 16-bit dtype (wgmma's inputs) and the shapes its TMA boxes tile: for gmm K a multiple
    of 16 and N of MIN_BLOCK_N (64: every narrower tile misaligns the epilogue's shared-memory
    copies), for tgmm K of 64 (one warpgroup's wgmma M) and N of 16; of quantised weights, the
    FP8-activation products `kernels.gmm_fp8_mgpu` tiles."""
    if problem.weight_format is not None:
        return (
            problem.fp8_activations
            and problem.kernel in ("gmm", "gmm_glu")
            and not _gmm_fp8.check(
                problem.k, problem.n, problem.weight_format, None, problem.activation
            )
        )
    if problem.dtype is None or problem.dtype not in _gmm_mgpu.DTYPES:
        return False
    if problem.kernel == "tgmm":
        return problem.k % 64 == 0 and problem.n % 16 == 0
    return problem.k % 16 == 0 and problem.n % MIN_BLOCK_N == 0


def auto_supports(problem: backends.Problem) -> bool:
    if problem.fp8_activations:  # its table entries were measured on the layer's calls
        return supports(problem)
    return supports(problem) and not problem.gather and jnp.dtype(problem.out_dtype).itemsize == 2


def default_config(
    num_rows: int, num_groups: int, n_out: int, activation: str | None
) -> MosaicConfig:
    """128 x 128 tiles (a GLU: 128 x 64 outputs, as its tile reads 2·block_n weight columns); for
    decode (rows class "tiny", at most 16 rows per group) 64-row tiles (one wgmma M), block_n
    narrowed towards 4 (visit, n-tile) pairs per SM but not below MIN_BLOCK_N, and 8 stages, as
    each holds a few KiB, to keep more bytes in flight (6 for gpt-oss's GLU, whose split gate and
    up halves take shared memory too: 8 exceed the H200's 227 KiB)."""
    cfg = MosaicConfig(block_n=64 if activation else 128)  # the kernel's own default
    if tuning.rows_class(num_rows, num_groups) != "tiny":
        return cfg
    block_n = pallas_triton.spread_block_n(
        cfg.block_n, n_out, num_rows, num_groups, MIN_BLOCK_N, 4 * tuning.policy_sms()
    )
    stages = 6 if activation == "gptoss" else 8
    return dataclasses.replace(cfg, block_m=64, block_n=block_n, num_stages=stages)


def config(lhs, rhs, transpose_rhs, activation, num_rows, out_dtype=None) -> MosaicConfig:
    """The table's entry for the call (an FP8-activation weight's `backends.a8_kernel_name`,
    keyed by its stored dtype), else the kernel's default."""
    num_groups = rhs.shape[0]
    n_dim = rhs.shape[1] if transpose_rhs else rhs.shape[2]
    n_out = n_dim // 2 if activation else n_dim
    kernel = backends.gmm_kernel_name(activation, transpose_rhs)
    fp8 = quant.is_quantized(rhs)
    entry = tuning.lookup(
        "mosaic_gpu",
        backends.a8_kernel_name(kernel, out_dtype or lhs.dtype) if fp8 else kernel,
        dtype=rhs.values.dtype if fp8 else lhs.dtype,
        k=lhs.shape[1],
        n=n_out,
        rows=tuning.rows_class(num_rows, num_groups),
    )
    if entry is not None:
        return MosaicConfig(**entry)
    if fp8:
        return _gmm_fp8.default_config(activation)
    return default_config(num_rows, num_groups, n_out, activation)


def gmm_fp8(lhs, rhs, group_sizes, *, lhs_row_index=None, activation=None, **epilogue):
    """An FP8-activation product: lhs quantised per row and 128 values of K, its e4m3 rows (not
    lhs's bf16 ones) gathered; fp8_block scales in the per-column form go to pallas_triton."""
    n_out = rhs.shape[2] // 2 if activation else rhs.shape[2]
    pitch = rhs.values.shape[2]
    if _gmm_fp8.check(rhs.shape[1], n_out, rhs.fmt, rhs.scales.shape, activation, None, pitch):
        return pallas_triton.gmm(
            lhs, rhs, group_sizes, lhs_row_index=lhs_row_index, activation=activation, **epilogue
        )
    num_rows = lhs.shape[0] if lhs_row_index is None else lhs_row_index.shape[0]
    out_dtype = epilogue.pop("out_dtype", None) or lhs.dtype
    cfg = config(lhs, rhs, False, activation, num_rows, out_dtype)
    x, x_scales = quant.quantize_rows(lhs)
    if lhs_row_index is not None:
        x, x_scales = x[lhs_row_index], x_scales[lhs_row_index]
    return _gmm_fp8.gmm_fp8(
        x,
        x_scales,
        rhs,
        group_sizes,
        activation=activation,
        out_dtype=out_dtype,
        config=cfg,
        **epilogue,
    )


def gmm(
    lhs, rhs, group_sizes, *, lhs_row_index=None, transpose_rhs=False, activation=None, **epilogue
):
    if quant.is_quantized(rhs):  # `supports`: FP8 activations, not transposed
        return gmm_fp8(
            lhs, rhs, group_sizes, lhs_row_index=lhs_row_index, activation=activation, **epilogue
        )
    if lhs_row_index is not None:
        lhs = lhs[lhs_row_index]
    cfg = config(lhs, rhs, transpose_rhs, activation, lhs.shape[0])
    return _gmm_mgpu.gmm(
        lhs,
        rhs,
        group_sizes,
        transpose_rhs=transpose_rhs,
        activation=activation,
        config=cfg,
        **epilogue,
    )


def tgmm(lhs, rhs, group_sizes, *, lhs_row_index=None, out_dtype=None, rhs_sums=False):
    gathered = lhs if lhs_row_index is None else lhs[lhs_row_index]
    out = _tgmm_mgpu.tgmm(gathered, rhs, group_sizes, out_dtype=out_dtype)
    if not rhs_sums:
        return out
    dummy, row0 = jnp.zeros((1, 1), rhs.dtype), jnp.zeros((rhs.shape[0],), jnp.int32)
    sums = pallas_triton.tgmm(dummy, rhs, group_sizes, lhs_row_index=row0, rhs_sums=True)[1]
    return out, sums


BACKEND = backends.Backend(
    name="mosaic_gpu",
    gmm=gmm,
    tgmm=backends.rhs_as_stored(tgmm),
    combine=pallas_triton.combine,
    glu_backward=pallas_triton.glu_backward,
    supports=supports,
    auto_supports=auto_supports,
    available=available,
)
