"""Differentiable grouped matmuls: `ragged_dot` (drop-in for jax.lax.ragged_dot) and `tgmm`.

Both take the backend by `implementation` ("auto", "pallas_triton", "xla", "mosaic_gpu"), see
`moe_pallas._backend.resolve`. The Pallas path has a custom VJP built from the same two kernels
(with "mosaic_gpu", each of them, forward or gradient, runs the Mosaic GPU kernel when its
operands share one 16-bit dtype, e.g. a bf16 cotangent of bf16 operands, and the Triton kernel
otherwise; with "auto" on Hopper, each gmm runs on Mosaic GPU where `kernels.gmm_mgpu.AUTO_TABLE`
names its shape):

    ragged_dot: out[m] = lhs[m] @ rhs[g(m)]        d_lhs = gmm(d_out, rhs, transpose_rhs)
                                                   d_rhs = tgmm(lhs, d_out)
    tgmm:       out[g] = Σ_{m in g} lhs[m]ᵀ rhs[m]  d_lhs = gmm(rhs, d_out, transpose_rhs)
                                                   d_rhs = gmm(lhs, d_out)
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from moe_pallas import _backend, debug
from moe_pallas.kernels import gmm as _gmm
from moe_pallas.kernels import gmm_mgpu as _gmm_mgpu
from moe_pallas.kernels import tgmm as _tgmm
from moe_pallas.kernels import tgmm_mgpu as _tgmm_mgpu
from moe_pallas.kernels import tgmm_padded as _tgmm_padded
from moe_pallas.kernels.gmm import clamp_group_sizes


def _check_floating(name: str, x: jax.Array) -> None:
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"{name} must be a floating-point array, got dtype {x.dtype}.")


def _check_group_sizes(group_sizes: jax.Array, num_groups: int, num_rows: int) -> jax.Array:
    """Validated group sizes; invalid values (negative, summing past num_rows) are clamped as the
    kernels clamp them, so both backends agree, and raise under `moe_pallas.debug_checks()`."""
    if not jnp.issubdtype(group_sizes.dtype, jnp.integer):
        raise TypeError(
            f"group_sizes must be integer, got dtype {group_sizes.dtype}; "
            "pass e.g. group_sizes.astype(jnp.int32)."
        )
    if group_sizes.shape != (num_groups,):
        raise ValueError(
            f"group_sizes must have shape ({num_groups},), one entry per group, "
            f"got {group_sizes.shape}."
        )
    debug.check_group_sizes(group_sizes, num_rows)
    return clamp_group_sizes(group_sizes, num_rows)


def _out_dtype(lhs, rhs, preferred_element_type):
    return jnp.dtype(preferred_element_type or jnp.promote_types(lhs.dtype, rhs.dtype))


def _mosaic(backend: str, *operands: jax.Array) -> bool:
    """Whether a "mosaic_gpu" kernel takes these operands: wgmma reads one 16-bit dtype."""
    return backend == "mosaic_gpu" and _gmm_mgpu.accepts(*operands)


def _mosaic_gmm(backend, lhs, rhs, plain: bool, out_dtype):
    """(whether a gmm runs on Mosaic GPU, its config or None for the default): every call wgmma
    takes under "mosaic_gpu"; under "auto" (Hopper) a plain gmm (no row gather, no GLU, rhs not
    transposed) whose shape and output dtype are in AUTO_TABLE, with the table's config."""
    if _mosaic(backend, lhs, rhs):
        return True, None
    if backend == "auto" and plain and _gmm_mgpu.accepts(lhs, rhs):
        num_groups, k_dim, n_dim = rhs.shape
        config = _gmm_mgpu.auto_config(
            lhs.shape[0], num_groups, k_dim, n_dim, jnp.dtype(out_dtype or lhs.dtype)
        )
        return config is not None, config
    return False, None


def _zero_cotangent(group_sizes):
    return np.zeros(group_sizes.shape, jax.dtypes.float0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _ragged_dot_pallas(lhs, rhs, group_sizes, out_dtype, backend):
    return gmm_on_backend(backend, lhs, rhs, group_sizes, out_dtype=out_dtype)


def _ragged_dot_fwd(lhs, rhs, group_sizes, out_dtype, backend):
    return _ragged_dot_pallas(lhs, rhs, group_sizes, out_dtype, backend), (lhs, rhs, group_sizes)


def _ragged_dot_bwd(out_dtype, backend, res, d_out):
    lhs, rhs, group_sizes = res
    if not _mosaic(backend, lhs, rhs, d_out):  # one dtype for all three, or Triton for both
        backend = "pallas_triton"
    d_lhs = gmm_on_backend(
        backend, d_out, rhs, group_sizes, transpose_rhs=True, out_dtype=lhs.dtype
    )
    d_rhs = tgmm_on_backend(backend, lhs, d_out, group_sizes, out_dtype=rhs.dtype)
    return d_lhs, d_rhs, _zero_cotangent(group_sizes)


_ragged_dot_pallas.defvjp(_ragged_dot_fwd, _ragged_dot_bwd)


def gmm_on_backend(backend, lhs, rhs, group_sizes, *, lhs_row_index=None, **kwargs):
    """`kernels.gmm` on Mosaic GPU where `backend` is "mosaic_gpu" and wgmma takes the operands,
    else on Triton. With a row index, Mosaic GPU reads an XLA-gathered copy of lhs: Hopper's TMA
    cannot gather rows, and gmm_mgpu's own gather (cp.async, `kernels.row_gather_mgpu`) gave the
    same bits 1.1-2.1x slower than the copy + TMA at the layer's gate_up and dlhs shapes on the
    H200 (benchmarks/results/2026-12-02_h200_session16/). Under "auto", only the shapes of
    `kernels.gmm_mgpu.AUTO_TABLE` run on Mosaic GPU."""
    plain = (
        lhs_row_index is None and not kwargs.get("activation") and not kwargs.get("transpose_rhs")
    )
    mosaic, config = _mosaic_gmm(backend, lhs, rhs, plain, kwargs.get("out_dtype"))
    if mosaic:
        lhs = lhs if lhs_row_index is None else lhs[lhs_row_index]
        return _gmm_mgpu.gmm(lhs, rhs, group_sizes, config=config, **kwargs)
    return _gmm(lhs, rhs, group_sizes, lhs_row_index=lhs_row_index, **kwargs)


def tgmm_on_backend(
    backend, lhs, rhs, group_sizes, *, lhs_row_index=None, out_dtype=None, rhs_sums=False
):
    """`kernels.tgmm` on Mosaic GPU or Triton, chosen as in `gmm_on_backend`, or under "auto" at
    more than 16 rows per group `kernels.tgmm_padded` (a batched cuBLAS matmul); with rhs_sums also
    the [G, N] float32 per-group sums of rhs (Triton: in the same kernel; Mosaic GPU: the sums of
    a Triton tgmm whose lhs is one dummy column, so its own [G, 1, N] product is negligible)."""
    kwargs = {"lhs_row_index": lhs_row_index, "out_dtype": out_dtype, "rhs_sums": rhs_sums}
    if backend == "auto" and _tgmm_padded.applies(lhs, rhs, group_sizes.shape[0]):
        return _tgmm_padded.tgmm(lhs, rhs, group_sizes, **kwargs)
    if _mosaic(backend, lhs, rhs):
        lhs = lhs if lhs_row_index is None else lhs[lhs_row_index]
        out = _tgmm_mgpu.tgmm(lhs, rhs, group_sizes, out_dtype=out_dtype)
        if not rhs_sums:
            return out
        dummy, row0 = jnp.zeros((1, 1), rhs.dtype), jnp.zeros((rhs.shape[0],), jnp.int32)
        return out, _tgmm(dummy, rhs, group_sizes, lhs_row_index=row0, rhs_sums=True)[1]
    return _tgmm(lhs, rhs, group_sizes, **kwargs)


def _gmm_any(backend, lhs, rhs, group_sizes, out_dtype, transpose_rhs=False):
    if backend == "xla":
        rhs = jnp.swapaxes(rhs, 1, 2) if transpose_rhs else rhs
        return jax.lax.ragged_dot(lhs, rhs, group_sizes, preferred_element_type=out_dtype)
    return gmm_on_backend(
        backend, lhs, rhs, group_sizes, transpose_rhs=transpose_rhs, out_dtype=out_dtype
    )


# jax.lax.ragged_dot_general has no VJP in this ragged-contracting mode, so both backends use ours.
@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _tgmm_vjp(lhs, rhs, group_sizes, out_dtype, backend):
    if backend == "xla":
        dims = jax.lax.RaggedDotDimensionNumbers(
            dot_dimension_numbers=(([0], [0]), ([], [])),
            lhs_ragged_dimensions=[0],
            rhs_group_dimensions=[],
        )
        out = jax.lax.ragged_dot_general(
            lhs, rhs, group_sizes, dims, preferred_element_type=out_dtype
        )
        return out.astype(out_dtype)
    return tgmm_on_backend(backend, lhs, rhs, group_sizes, out_dtype=out_dtype)


def _tgmm_fwd(lhs, rhs, group_sizes, out_dtype, backend):
    return _tgmm_vjp(lhs, rhs, group_sizes, out_dtype, backend), (lhs, rhs, group_sizes)


def _tgmm_bwd(out_dtype, backend, res, d_out):
    lhs, rhs, group_sizes = res
    d_lhs = _gmm_any(backend, rhs, d_out, group_sizes, lhs.dtype, transpose_rhs=True)
    d_rhs = _gmm_any(backend, lhs, d_out, group_sizes, rhs.dtype)
    return d_lhs, d_rhs, _zero_cotangent(group_sizes)


_tgmm_vjp.defvjp(_tgmm_fwd, _tgmm_bwd)


def ragged_dot(
    lhs: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    *,
    preferred_element_type=None,
    implementation: str = "auto",
) -> jax.Array:
    """`out[m] = lhs[m] @ rhs[g]` for the rows m of group g; same semantics as jax.lax.ragged_dot.

    lhs `[M, K]`, rhs `[G, K, N]`, group_sizes `[G]` integer (consecutive row counts, summing to
    at most M; rows past the sum are zero; negative sizes count as 0 and a sum past M is cut at
    M, see `moe_pallas.debug_checks` to make them errors). Returns `[M, N]` in `preferred_element_type`
    (default: the promoted input dtype), accumulating in float32.
    """
    backend = _backend.resolve(implementation)
    if lhs.ndim != 2:
        raise ValueError(f"lhs must be 2-D [M, K], got shape {lhs.shape}.")
    if rhs.ndim != 3:
        raise ValueError(
            f"rhs must be 3-D [G, K, N] (one [K, N] matrix per group), got {rhs.shape}."
        )
    if lhs.shape[1] != rhs.shape[1]:
        raise ValueError(
            f"lhs [M, K={lhs.shape[1]}] and rhs [G, K={rhs.shape[1]}, N] disagree on K; "
            "the contraction runs over lhs's last and rhs's middle axis."
        )
    _check_floating("lhs", lhs)
    _check_floating("rhs", rhs)
    group_sizes = _check_group_sizes(group_sizes, rhs.shape[0], lhs.shape[0])
    out_dtype = _out_dtype(lhs, rhs, preferred_element_type)
    if backend == "xla":
        return jax.lax.ragged_dot(lhs, rhs, group_sizes, preferred_element_type=out_dtype)
    return _ragged_dot_pallas(lhs, rhs, group_sizes, out_dtype, backend)


def tgmm(
    lhs: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    *,
    preferred_element_type=None,
    implementation: str = "auto",
) -> jax.Array:
    """`out[g] = lhs[rows of g]ᵀ @ rhs[rows of g]`, the weight gradient of `ragged_dot`.

    lhs `[M, K]`, rhs `[M, N]`, group_sizes `[G]` integer. Returns `[G, K, N]`; empty groups are
    zero.
    """
    backend = _backend.resolve(implementation)
    if lhs.ndim != 2 or rhs.ndim != 2:
        raise ValueError(f"lhs and rhs must be 2-D ([M, K], [M, N]), got {lhs.shape}, {rhs.shape}.")
    if lhs.shape[0] != rhs.shape[0]:
        raise ValueError(
            f"lhs [M={lhs.shape[0]}, K] and rhs [M={rhs.shape[0]}, N] must have the same rows: "
            "tgmm contracts over them."
        )
    _check_floating("lhs", lhs)
    _check_floating("rhs", rhs)
    if group_sizes.ndim != 1:
        raise ValueError(f"group_sizes must be 1-D [G], got shape {group_sizes.shape}.")
    group_sizes = _check_group_sizes(group_sizes, group_sizes.shape[0], lhs.shape[0])
    out_dtype = _out_dtype(lhs, rhs, preferred_element_type)
    return _tgmm_vjp(lhs, rhs, group_sizes, out_dtype, backend)
