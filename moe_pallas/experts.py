"""`moe_experts`: the expert block of an MoE layer, with a choice of backend.

    out[t] = sum_j topk_weight[t, j] * (act(x[t] @ w_gate_up[e] + b_gate_up[e]) @ w_down[e] + b_down[e])
    with e = topk_idx[t, j]

Backends (`moe_pallas.backends`): "xla" (jax.lax.ragged_dot, differentiated by JAX),
"pallas_triton" (the fused kernels of `moe_pallas.fused`, one custom_vjp over the block) and
"mosaic_gpu" (the same block with its matmuls on Hopper's Mosaic GPU kernels); "auto" is xla off
GPU and the fused block on a GPU, each matmul on the backend the tuning table names for its shape.
Numerics on every backend: matmuls accumulate in float32; the activation is stored in x's dtype
(as the fused kernels do); bias and routing weight are applied in float32; each token sums its k
rows in float32 (the fused path rounds each weighted row to x's dtype first); out has x's dtype.
Expert ids outside [0, E) contribute zero (use `moe_pallas.debug_checks()` to make them an error).
"""

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from moe_pallas import backends, debug, fused, ops, parallel, quant
from moe_pallas.activations import ACTIVATIONS, Activation
from moe_pallas.backends import Implementation

_PARAM_NAMES = ("w_gate_up", "w_down", "b_gate_up", "b_down")


def _param_dict(params: Any) -> dict[str, jax.Array]:
    """Accept a mapping, a `moe_pallas.MoE` layer (its `expert_params()`), or any object with the
    parameter attributes (e.g. a pytree dataclass)."""
    if callable(getattr(params, "expert_params", None)):
        params = params.expert_params()
    if isinstance(params, Mapping):
        unknown = set(params) - set(_PARAM_NAMES)
        if unknown:
            raise ValueError(f"params has unknown keys {sorted(unknown)}; expected {_PARAM_NAMES}.")
        out = {k: v for k, v in params.items() if v is not None}
    else:
        out = {k: getattr(params, k) for k in _PARAM_NAMES if getattr(params, k, None) is not None}
    for required in ("w_gate_up", "w_down"):
        if required not in out:
            raise ValueError(f"params is missing {required!r} (keys needed: w_gate_up, w_down).")
    # numpy arrays become jax arrays by x's rule (jnp.asarray: float64 is float32 unless
    # jax_enable_x64), so all-numpy inputs of one dtype stay of one dtype.
    return {k: jnp.asarray(v) if isinstance(v, (np.ndarray, list)) else v for k, v in out.items()}


def validate(x, topk_idx, topk_weight, params, activation) -> dict[str, jax.Array]:
    """Check shapes and dtypes of a `moe_experts` call; return params as a dict."""
    params = _param_dict(params)
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation={activation!r} is not supported; use one of {ACTIVATIONS}.")
    if x.ndim != 2 or not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(
            f"x must be a floating [T, H] array, got {x.dtype}{list(x.shape)}; "
            "reshape leading batch dimensions into T."
        )
    if topk_idx.ndim != 2 or not jnp.issubdtype(topk_idx.dtype, jnp.integer):
        raise TypeError(
            f"topk_idx must be an integer [T, k] array, got {topk_idx.dtype}{list(topk_idx.shape)}."
        )
    if topk_weight.shape != topk_idx.shape or not jnp.issubdtype(topk_weight.dtype, jnp.floating):
        raise TypeError(
            f"topk_weight must be a floating array shaped like topk_idx {list(topk_idx.shape)}, "
            f"got {topk_weight.dtype}{list(topk_weight.shape)}."
        )
    if topk_idx.shape[0] != x.shape[0]:
        raise ValueError(f"topk_idx has {topk_idx.shape[0]} tokens but x has T={x.shape[0]}.")
    if topk_idx.size >= 2**31:  # the (token, slot) rows are numbered in int32
        raise ValueError(
            f"topk_idx has T*k = {topk_idx.size} >= 2^31 (token, slot) pairs; call moe_experts on "
            "chunks of the tokens."
        )
    w_gate_up, w_down = params["w_gate_up"], params["w_down"]
    if w_gate_up.ndim != 3 or w_down.ndim != 3:
        raise ValueError("params['w_gate_up'] must be [E, H, 2I] and params['w_down'] [E, I, H].")
    num_experts, hidden, two_inter = w_gate_up.shape
    if hidden != x.shape[1]:
        raise ValueError(f"params['w_gate_up'] is [E, H={hidden}, 2I] but x has H={x.shape[1]}.")
    if two_inter % 2:
        raise ValueError(
            f"params['w_gate_up'] has an odd last dimension {two_inter}; it must be 2I."
        )
    if w_down.shape != (num_experts, two_inter // 2, hidden):
        raise ValueError(
            f"params['w_down'] must be [E, I, H]={[num_experts, two_inter // 2, hidden]} to match "
            f"w_gate_up, got {list(w_down.shape)}."
        )
    expected_bias = {"b_gate_up": (num_experts, two_inter), "b_down": (num_experts, hidden)}
    for name, shape in expected_bias.items():
        if name in params and params[name].shape != shape:
            raise ValueError(
                f"params[{name!r}] must be {list(shape)}, got {list(params[name].shape)}."
            )
    for name, value in params.items():
        if not jnp.issubdtype(value.dtype, jnp.floating):
            raise TypeError(f"params[{name!r}] must be floating, got {value.dtype}.")
    for name in ("w_gate_up", "w_down"):
        if params[name].dtype != x.dtype:
            raise TypeError(
                f"params[{name!r}] is {params[name].dtype} but x is {x.dtype}; cast one of them "
                "(e.g. jax.tree.map(lambda p: p.astype(x.dtype), params))."
            )
    return params


def moe_experts(
    x: jax.Array,
    topk_idx: jax.Array,
    topk_weight: jax.Array,
    params: Mapping[str, jax.Array] | Any,
    *,
    activation: Activation,
    implementation: Implementation = "auto",
    mesh: jax.sharding.Mesh | None = None,
    expert_axis: str = "expert",
    exchange: str = "auto",
    capacity_factor: float | None = None,
    return_stats: bool = False,
    fp8_training: bool = False,
) -> jax.Array | tuple[jax.Array, dict]:
    """Apply each token's top-k experts and sum them with the routing weights.

    Args:
      x: tokens `[T, H]` (bfloat16 or float32; float64 under jax_enable_x64 on "xla" only).
        numpy arrays here and in params become jax arrays by `jnp.asarray` (float64 is float32
        unless jax_enable_x64 is on).
      topk_idx: expert ids `[T, k]`, integer; ids outside [0, E) contribute zero.
      topk_weight: routing weights `[T, k]`, floating.
      params: `w_gate_up [E, H, 2I]`, `w_down [E, I, H]` (x's dtype), optional `b_gate_up [E, 2I]`,
        `b_down [E, H]`; the weights may be `moe_pallas.QuantizedWeight`s (`quantize_experts`;
        forward and gradients of x and topk_weight, none of the weights); a mapping, a
        `moe_pallas.MoE` layer (its `expert_params()`), or an object with these attributes.
      activation: "swiglu" (gate = first I columns of gate_up) or "gptoss" (gate = even columns,
        clamped GLU with alpha 1.702, limit 7).
      implementation: "auto" (best for the platform), "xla", "pallas_triton", "mosaic_gpu".
      mesh: a `jax.sharding.Mesh` (e.g. `moe_pallas.expert_mesh()`) to run expert-parallel in
        `jax.shard_map`: experts split over `expert_axis`, tokens over every mesh axis; same
        global arrays in and out. None: one device. See `moe_pallas.parallel`.
      expert_axis: the mesh axis the experts are split over.
      exchange: "auto" (= "all_to_all"), "all_to_all" (fixed capacity, any platform) or
        "ragged" (`jax.lax.ragged_all_to_all`, GPU; slow in jax 0.11.2, see moe_pallas.parallel).
      capacity_factor: receive buffer per device in units of its balanced load; None (default)
        never drops (all_to_all: a 1.25x first round, and a second round only when a pair
        overflows it; ragged: a worst-case buffer). Dropped rows contribute zero, are counted in
        the stats, and raise under `moe_pallas.debug_checks()`.
      return_stats: also return `{"dropped_rows", "rows_per_shard", "capacity_rows",
        "spilled_rows"}` (see `moe_pallas.parallel`).
      fp8_training: run the forward's matmuls and the backward's products with wᵀ (dx and the
        GLU's input gradient) on the FP8 tensor cores, DeepSeek-V3's recipe: the dense weights
        quantised each call to e4m3 per 128 x 128 block, activations and output gradients per
        row and 128 values of K; the weight gradients are the dense ones' (straight through),
        from products in x's dtype. The weights must be dense. See `moe_pallas.fused`.
    Returns:
      `out [T, H]` in x's dtype; `(out, stats)` if return_stats.
    """
    x, topk_idx, topk_weight = jnp.asarray(x), jnp.asarray(topk_idx), jnp.asarray(topk_weight)
    params = validate(x, topk_idx, topk_weight, params, activation)
    policy = backends.resolve(implementation)
    ops.check_kernel_dtype("x", x, policy)
    if fp8_training:
        quantised = [k for k in ("w_gate_up", "w_down") if quant.is_quantized(params[k])]
        if quantised:
            raise ValueError(
                f"fp8_training quantises dense weights at each call, but {quantised} are "
                "QuantizedWeights already: pass the dense weights (dequantize_experts), or drop "
                "fp8_training and set fp8_activations on them (forward and gradients of x only)."
            )
    params = {k: quant.guard_gradients(v) for k, v in params.items()}
    for name in ("w_gate_up", "w_down"):
        debug.check_weight(f"params[{name!r}]", params[name])
        if fp8_training:
            debug.check_quantisable(f"params[{name!r}]", params[name])
    if mesh is not None or return_stats:  # (parallel checks routing itself, mesh-wide)
        out, stats = parallel.moe_experts_parallel(
            x,
            topk_idx,
            topk_weight,
            params,
            activation=activation,
            implementation=implementation,
            mesh=mesh,
            expert_axis=expert_axis,
            exchange=exchange,
            capacity_factor=capacity_factor,
            fp8_training=fp8_training,
        )
        return (out, stats) if return_stats else out
    debug.check_routing(x, topk_idx, topk_weight, params["w_gate_up"].shape[0])
    return fused.expert_block(x, topk_idx, topk_weight, params, activation, policy, fp8_training)
