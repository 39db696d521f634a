"""The xla backend: `jax.lax.ragged_dot` and plain JAX, on every platform.

On CPU this is what "auto" runs. On a GPU XLA lowers `ragged_dot` to a dense masked matmul (every
row times every expert): slow, and out of memory at large T; the Pallas backends exist for that.

The expert block here is its own function (`experts`), differentiated by JAX: matmuls accumulate
in float32 (float64 inputs keep float64, for gradient checks), bias, activation and routing
weight in float32, the activation stored in x's dtype as the fused kernels store it, each token's
k rows summed in float32.

Quantised weights (`moe_pallas.quant.QuantizedWeight`) are dequantised to their logical dtype at
each call: the dense weights are materialised here (the Pallas backend streams them as stored).
A weight with `fp8_activations` multiplies activations taken through e4m3 and back
(`quant.fp8_rows`), the values the FP8 tensor cores multiply on the Pallas backend, both operands
exact in float32, so the two backends compute the same product up to summation order.

With FP8 training (`moe_experts(..., fp8_training=True)`) the block is `moe_pallas.fused`'s
custom_vjp on this backend's gmm, tgmm, combine and `glu_backward` below, so that its backward
quantises the same operands as the Pallas backends'.
"""

import jax
import jax.numpy as jnp

from moe_pallas import backends, dispatch, quant
from moe_pallas.activations import glu, glu_bwd, split_gate_up


def _grouped_dot(lhs, rhs, group_sizes, acc, row_group, routed):
    """`jax.lax.ragged_dot(lhs, rhs, group_sizes)` whose non-finite weights reach only their own
    group's rows, as on the Pallas backends. XLA lowers ragged_dot densely off TPU (each row times
    every group's weights, masked by multiplying with zero rows): a NaN or Inf in rhs[g] would
    make 0 · NaN in every row. So rhs is multiplied with its non-finite entries zeroed, and the
    columns of rhs[g] that held one are NaN in the rows of g: out[m, n] is NaN exactly when
    rhs[g(m), :, n] holds a non-finite value. row_group `[M]` is g(m), in range where `routed`."""
    finite = jnp.isfinite(rhs)
    out = jax.lax.ragged_dot(
        lhs, jnp.where(finite, rhs, 0), group_sizes, preferred_element_type=acc
    )
    bad_columns = ~jnp.all(finite, axis=1)  # [G, N]
    row_bad = routed[:, None] & bad_columns[jnp.where(routed, row_group, 0)]
    return jnp.where(row_bad, jnp.nan, out)


def gmm(
    lhs,
    rhs,
    group_sizes,
    *,
    lhs_row_index=None,
    transpose_rhs=False,
    bias=None,
    activation=None,
    row_scale=None,
    out_dtype=None,
):
    out_dtype = jnp.dtype(out_dtype or lhs.dtype)
    if quant.is_quantized(rhs):  # a dense copy per call (module docstring)
        fp8 = rhs.fp8_activations and not transpose_rhs
        lhs = quant.fp8_rows(lhs, jnp.float32) if fp8 else lhs
        rhs = rhs.dequantize(jnp.float32 if fp8 else None)
    if lhs_row_index is not None:
        lhs = lhs[lhs_row_index]
    rhs = jnp.swapaxes(rhs, 1, 2) if transpose_rhs else rhs
    ends = jnp.cumsum(group_sizes.astype(jnp.int32))
    row_group = jnp.searchsorted(ends, jnp.arange(lhs.shape[0]), side="right")
    routed = row_group < rhs.shape[0]
    if bias is None and activation is None and row_scale is None:
        return _grouped_dot(lhs, rhs, group_sizes, out_dtype, row_group, routed)
    acc = jnp.promote_types(out_dtype, jnp.float32)
    out = _grouped_dot(lhs, rhs, group_sizes, acc, row_group, routed)
    if bias is not None:
        out = out + jnp.where(routed[:, None], bias.astype(acc)[row_group], 0)
    if activation is not None:
        out = glu(*split_gate_up(out, activation), activation)
    if row_scale is not None:
        out = out * row_scale[: lhs.shape[0]].astype(acc)[:, None]
    return jnp.where(routed[:, None], out, 0).astype(out_dtype)


def tgmm(lhs, rhs, group_sizes, *, lhs_row_index=None, out_dtype=None, rhs_sums=False):
    out_dtype = jnp.dtype(out_dtype or jnp.promote_types(lhs.dtype, rhs.dtype))
    if lhs_row_index is not None:
        lhs = lhs[lhs_row_index]
    dims = jax.lax.RaggedDotDimensionNumbers(
        dot_dimension_numbers=(([0], [0]), ([], [])),
        lhs_ragged_dimensions=[0],
        rhs_group_dimensions=[],
    )
    out = jax.lax.ragged_dot_general(
        lhs, rhs, group_sizes, dims, preferred_element_type=out_dtype
    ).astype(out_dtype)
    if not rhs_sums:
        return out
    ones = jnp.ones((rhs.shape[0], 1), rhs.dtype)
    sums = jax.lax.ragged_dot_general(
        ones, rhs, group_sizes, dims, preferred_element_type=jnp.float32
    )[:, 0]
    return out, sums


def combine(rows, pair_row, *, out_dtype=None):
    """out[t] = Σ_j rows[pair_row[t, j]] in float32, j ascending; a negative entry adds nothing."""
    out = jnp.zeros((pair_row.shape[0], rows.shape[1]), jnp.float32)
    for j in range(pair_row.shape[1]):
        r = pair_row[:, j]
        out += jnp.where((r >= 0)[:, None], rows[jnp.maximum(r, 0)], 0).astype(jnp.float32)
    return out.astype(out_dtype or rows.dtype)


def glu_backward(h, g, row_weight, activation):
    """`kernels.glu_bwd.glu_backward`'s contract in plain JAX: (dh and a in h's dtype, dw
    float32 [M]); the math in float32 (float64 for float64 h)."""
    acc = jnp.promote_types(h.dtype, jnp.float32)
    gate, up = split_gate_up(h.astype(acc), activation)
    g = g.astype(acc)
    a = glu(gate, up, activation)
    d_gate, d_up = glu_bwd(gate, up, g * row_weight.astype(acc)[:, None], activation)
    if activation == "gptoss":  # (gate, up) pairs interleaved, as h's columns
        dh = jnp.stack([d_gate, d_up], axis=-1).reshape(h.shape)
    else:
        dh = jnp.concatenate([d_gate, d_up], axis=-1)
    dw = jnp.sum(g * a, axis=1).astype(jnp.float32)
    return dh.astype(h.dtype), a.astype(h.dtype), dw


def experts(x, topk_idx, topk_weight, params, activation):
    """The expert block (`moe_pallas.moe_experts`) in plain JAX; arguments validated."""
    fp8 = {k: quant.is_quantized(v) and v.fp8_activations for k, v in params.items()}
    params = {  # a dense copy per call (module docstring)
        k: v.dequantize(jnp.float32 if fp8[k] else None) if quant.is_quantized(v) else v
        for k, v in params.items()
    }
    through = lambda name, rows: quant.fp8_rows(rows, jnp.float32) if fp8[name] else rows
    num_tokens, top_k = topk_idx.shape
    num_experts = params["w_gate_up"].shape[0]
    d = dispatch.dispatch(topk_idx, num_experts)
    x_sorted = through("w_gate_up", x)[d.row_token]
    acc = jnp.promote_types(x.dtype, jnp.float32)  # float64 inputs keep float64 (gradient checks)
    row_valid = d.row_expert < num_experts
    row_expert = jnp.where(row_valid, d.row_expert, 0)
    h = _grouped_dot(x_sorted, params["w_gate_up"], d.group_sizes, acc, row_expert, row_valid)
    if "b_gate_up" in params:
        h = h + params["b_gate_up"].astype(acc)[row_expert]
    a = glu(*split_gate_up(h, activation), activation).astype(x.dtype)
    y = _grouped_dot(
        through("w_down", a), params["w_down"], d.group_sizes, acc, row_expert, row_valid
    )
    if "b_down" in params:
        y = y + params["b_down"].astype(acc)[row_expert]
    row_weight = jnp.where(row_valid, topk_weight.reshape(-1)[d.row_pair].astype(acc), 0)
    y = jnp.where(row_valid[:, None], y * row_weight[:, None], 0)
    out = jnp.sum(y[d.pair_row].reshape(num_tokens, top_k, -1), axis=1)
    return out.astype(x.dtype)


BACKEND = backends.Backend(
    name="xla",
    gmm=gmm,
    tgmm=backends.rhs_as_stored(tgmm),
    combine=combine,
    glu_backward=glu_backward,
    experts=experts,
)
