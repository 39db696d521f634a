"""Differentiable grouped matmuls: `ragged_dot` (drop-in for jax.lax.ragged_dot) and `tgmm`.

Both take the policy by `implementation` ("auto", "pallas_triton", "mosaic_gpu", "xla"; see
`moe_pallas.backends`). Off "xla", a custom VJP built from the same two ops, each call on the
backend the policy selects for it:

    ragged_dot: out[m] = lhs[m] @ rhs[g(m)]        d_lhs = gmm(d_out, rhs, transpose_rhs)
                                                   d_rhs = tgmm(lhs, d_out)
    tgmm:       out[g] = Σ_{m in g} lhs[m]ᵀ rhs[m]  d_lhs = gmm(rhs, d_out, transpose_rhs)
                                                   d_rhs = gmm(lhs, d_out)

Under "xla", `ragged_dot` is `jax.lax.ragged_dot` with its own VJP; `tgmm` keeps the custom VJP,
as `jax.lax.ragged_dot_general` has none in its ragged-contracting mode.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from moe_pallas import backends, debug, quant
from moe_pallas.kernels._common import clamp_group_sizes


def _check_floating(name: str, x: jax.Array) -> None:
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"{name} must be a floating-point array, got dtype {x.dtype}.")


def _as_array(a):
    """numpy arrays and lists as jax arrays (`jnp.asarray`, as moe_experts takes x); jax arrays
    and other array types pass unchanged."""
    return jnp.asarray(a) if isinstance(a, (np.ndarray, list, tuple)) else a


def check_kernel_dtype(name: str, x: jax.Array, policy: str) -> None:
    """The Pallas kernels multiply 16- and 32-bit floats (float32 accumulation); float64 (under
    `jax_enable_x64`) runs on the xla backend only, which keeps it in float64."""
    if policy != "xla" and jnp.dtype(x.dtype) == jnp.float64:
        raise TypeError(
            f"{name} is float64, which the Pallas kernels (implementation={policy!r}) do not "
            "multiply; pass implementation='xla' (float64 throughout) or cast the operands to "
            "float32."
        )


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


def _zero_cotangent(group_sizes):
    return np.zeros(group_sizes.shape, jax.dtypes.float0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _ragged_dot_vjp(lhs, rhs, group_sizes, out_dtype, policy):
    return backends.gmm(policy, lhs, rhs, group_sizes, out_dtype=out_dtype)


def _ragged_dot_fwd(lhs, rhs, group_sizes, out_dtype, policy):
    return _ragged_dot_vjp(lhs, rhs, group_sizes, out_dtype, policy), (lhs, rhs, group_sizes)


def _ragged_dot_bwd(out_dtype, policy, res, d_out):
    lhs, rhs, group_sizes = res
    d_lhs = backends.gmm(policy, d_out, rhs, group_sizes, transpose_rhs=True, out_dtype=lhs.dtype)
    if quant.is_quantized(rhs):  # no weight gradient (quant.guard_gradients)
        return d_lhs, None, _zero_cotangent(group_sizes)
    d_rhs = backends.tgmm(policy, lhs, d_out, group_sizes, out_dtype=rhs.dtype)
    return d_lhs, d_rhs, _zero_cotangent(group_sizes)


_ragged_dot_vjp.defvjp(_ragged_dot_fwd, _ragged_dot_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _tgmm_vjp(lhs, rhs, group_sizes, out_dtype, policy):
    return backends.tgmm(policy, lhs, rhs, group_sizes, out_dtype=out_dtype)


def _tgmm_fwd(lhs, rhs, group_sizes, out_dtype, policy):
    return _tgmm_vjp(lhs, rhs, group_sizes, out_dtype, policy), (lhs, rhs, group_sizes)


def _tgmm_bwd(out_dtype, policy, res, d_out):
    lhs, rhs, group_sizes = res
    d_lhs = backends.gmm(policy, rhs, d_out, group_sizes, transpose_rhs=True, out_dtype=lhs.dtype)
    d_rhs = backends.gmm(policy, lhs, d_out, group_sizes, out_dtype=rhs.dtype)
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
    M, see `moe_pallas.debug_checks` to make them errors); array-likes (lists, numpy) are taken
    through `jnp.asarray`. Returns `[M, N]` in `preferred_element_type` (default: the promoted
    input dtype), accumulating in float32. rhs may be a `moe_pallas.QuantizedWeight` (its logical
    dtype counts): streamed as stored on the Pallas backends, dequantised per call on "xla";
    differentiable in lhs only.
    """
    policy = backends.resolve(implementation)
    lhs, rhs, group_sizes = (_as_array(a) for a in (lhs, rhs, group_sizes))
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
    check_kernel_dtype("lhs", lhs, policy)
    check_kernel_dtype("rhs", rhs, policy)
    group_sizes = _check_group_sizes(group_sizes, rhs.shape[0], lhs.shape[0])
    out_dtype = _out_dtype(lhs, rhs, preferred_element_type)
    rhs = quant.guard_gradients(rhs)
    debug.check_weight("rhs", rhs)
    if policy == "xla" and quant.is_quantized(rhs):  # a dense copy per call
        if rhs.fp8_activations:  # the products the FP8 tensor cores compute, exactly
            lhs, rhs = quant.fp8_rows(lhs, jnp.float32), rhs.dequantize(jnp.float32)
            out = jax.lax.ragged_dot(lhs, rhs, group_sizes, preferred_element_type=jnp.float32)
            return out.astype(out_dtype)
        rhs = rhs.dequantize()
    if policy == "xla":
        return jax.lax.ragged_dot(lhs, rhs, group_sizes, preferred_element_type=out_dtype)
    return _ragged_dot_vjp(lhs, rhs, group_sizes, out_dtype, policy)


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
    policy = backends.resolve(implementation)
    lhs, rhs, group_sizes = (_as_array(a) for a in (lhs, rhs, group_sizes))
    if lhs.ndim != 2 or rhs.ndim != 2:
        raise ValueError(f"lhs and rhs must be 2-D ([M, K], [M, N]), got {lhs.shape}, {rhs.shape}.")
    if lhs.shape[0] != rhs.shape[0]:
        raise ValueError(
            f"lhs [M={lhs.shape[0]}, K] and rhs [M={rhs.shape[0]}, N] must have the same rows: "
            "tgmm contracts over them."
        )
    _check_floating("lhs", lhs)
    _check_floating("rhs", rhs)
    check_kernel_dtype("lhs", lhs, policy)
    check_kernel_dtype("rhs", rhs, policy)
    if group_sizes.ndim != 1:
        raise ValueError(f"group_sizes must be 1-D [G], got shape {group_sizes.shape}.")
    group_sizes = _check_group_sizes(group_sizes, group_sizes.shape[0], lhs.shape[0])
    out_dtype = _out_dtype(lhs, rhs, preferred_element_type)
    return _tgmm_vjp(lhs, rhs, group_sizes, out_dtype, policy)
