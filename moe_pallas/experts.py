"""`moe_experts`: the expert block of an MoE layer, with a choice of backend.

    out[t] = sum_j topk_weight[t, j] * (act(x[t] @ w_gate_up[e] + b_gate_up[e]) @ w_down[e] + b_down[e])
    with e = topk_idx[t, j]

Backends: "xla" (jax.lax.ragged_dot), "pallas_triton" (the fused kernels of `moe_pallas.fused`,
with one custom_vjp over the block) and "mosaic_gpu" (the same block with its matmuls on Hopper's
Mosaic GPU kernels); "auto" is xla off GPU and the fused block on a GPU, with Mosaic GPU where its
measured table says so on Hopper (`resolve_implementation`).
Numerics on every backend: matmuls accumulate in float32; the activation is stored in x's dtype
(as the fused kernels do); bias and routing weight are applied in float32; each token sums its k
rows in float32 (the fused path rounds each weighted row to x's dtype first); out has x's dtype.
Expert ids outside [0, E) contribute zero (use `moe_pallas.debug_checks()` to make them an error).
"""

from collections.abc import Mapping
from typing import Any, Literal

import jax
import jax.numpy as jnp

from moe_pallas import _backend, debug, fused
from moe_pallas.activations import ACTIVATIONS, Activation, glu, split_gate_up

Implementation = Literal["auto", "xla", "pallas_triton", "mosaic_gpu"]
IMPLEMENTATIONS: tuple[str, ...] = ("auto", "xla", "pallas_triton", "mosaic_gpu")
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
    return out


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


def resolve_implementation(implementation: str) -> str:
    """Map "auto" to the best backend of this platform: xla off GPU; on a GPU pallas_triton, or
    on Hopper "auto" itself (each grouped matmul on Triton or, where `kernels.gmm_mgpu.AUTO_TABLE`
    names its shape, on Mosaic GPU).

    An explicit "pallas_triton" off GPU runs the kernels in interpret mode (slow; tests, notebooks).
    """
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation={implementation!r}; use one of {IMPLEMENTATIONS}.")
    return _backend.resolve(implementation)


def sort_by_expert(topk_idx: jax.Array, num_experts: int):
    """Stable sort of the T*k (token, slot) pairs by expert; out-of-range ids go last, in no group.

    Returns (order [M], group_sizes [E]): sorted row r holds flat pair order[r] = t*k + j.
    """
    flat = topk_idx.reshape(-1).astype(jnp.int32)
    valid = (flat >= 0) & (flat < num_experts)
    order = jnp.argsort(jnp.where(valid, flat, num_experts), stable=True).astype(jnp.int32)
    group_sizes = (
        jnp.zeros((num_experts,), jnp.int32).at[flat].add(valid.astype(jnp.int32), mode="drop")
    )
    return order, group_sizes


def _experts_xla(x, topk_idx, topk_weight, params, activation):
    num_tokens, top_k = topk_idx.shape
    num_experts = params["w_gate_up"].shape[0]
    order, group_sizes = sort_by_expert(topk_idx, num_experts)
    x_sorted = x[order // top_k]
    acc = jnp.promote_types(x.dtype, jnp.float32)  # float64 inputs keep float64 (gradient checks)
    h = jax.lax.ragged_dot(x_sorted, params["w_gate_up"], group_sizes, preferred_element_type=acc)
    row_expert = topk_idx.reshape(-1)[order]
    row_valid = (row_expert >= 0) & (row_expert < num_experts)
    row_expert = jnp.where(row_valid, row_expert, 0)
    if "b_gate_up" in params:
        h = h + params["b_gate_up"].astype(acc)[row_expert]
    a = glu(*split_gate_up(h, activation), activation).astype(x.dtype)
    y = jax.lax.ragged_dot(a, params["w_down"], group_sizes, preferred_element_type=acc)
    if "b_down" in params:
        y = y + params["b_down"].astype(acc)[row_expert]
    row_weight = jnp.where(row_valid, topk_weight.reshape(-1)[order].astype(acc), 0)
    y = jnp.where(row_valid[:, None], y * row_weight[:, None], 0)
    pair_row = jnp.zeros_like(order).at[order].set(jnp.arange(order.shape[0], dtype=jnp.int32))
    out = jnp.sum(y[pair_row].reshape(num_tokens, top_k, -1), axis=1)
    return out.astype(x.dtype)


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
) -> jax.Array | tuple[jax.Array, dict]:
    """Apply each token's top-k experts and sum them with the routing weights.

    Args:
      x: tokens `[T, H]` (bfloat16 or float32).
      topk_idx: expert ids `[T, k]`, integer; ids outside [0, E) contribute zero.
      topk_weight: routing weights `[T, k]`, floating.
      params: `w_gate_up [E, H, 2I]`, `w_down [E, I, H]` (x's dtype), optional `b_gate_up [E, 2I]`,
        `b_down [E, H]`; a mapping, a `moe_pallas.MoE` layer (its `expert_params()`), or an
        object with these attributes.
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
    Returns:
      `out [T, H]` in x's dtype; `(out, stats)` if return_stats.
    """
    x, topk_idx, topk_weight = jnp.asarray(x), jnp.asarray(topk_idx), jnp.asarray(topk_weight)
    params = validate(x, topk_idx, topk_weight, params, activation)
    backend = resolve_implementation(implementation)
    if mesh is not None or return_stats:  # (parallel checks routing itself, mesh-wide)
        from moe_pallas.parallel import moe_experts_parallel  # parallel imports this module

        out, stats = moe_experts_parallel(
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
        )
        return (out, stats) if return_stats else out
    debug.check_routing(x, topk_idx, topk_weight, params["w_gate_up"].shape[0])
    if x.shape[0] == 0:
        return jnp.zeros_like(x)
    if backend == "xla":
        return _experts_xla(x, topk_idx, topk_weight, params, activation)
    return fused.fused_experts(x, topk_idx, topk_weight, params, activation, backend)
