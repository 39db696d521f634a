"""Pure-jnp oracle of the expert layer, for tests, the demo and benchmarks.

    out[t] = sum_j topk_weight[t, j] * expert_{topk_idx[t, j]}(x[t])
    expert_e(x) = act(x @ w_gate_up[e] + b_gate_up[e]) @ w_down[e] + b_down[e]

Three independent formulations, computed in `dtype` (float32 by default; float64 where x64 is
enabled) at HIGHEST matmul precision:
  - `moe_experts_reference`: the MoE way: stable sort of the T*k (token, slot) pairs by expert,
    one expert application per sorted row, un-sort, weighted sum of each token's k rows.
  - `moe_experts_loop`: a plain loop over tokens and their k slots.
  - `moe_experts_by_expert`: the dense way: each expert on every row, rows routed elsewhere
    weighted zero, summed over the experts.
Expert ids outside [0, E) contribute zero (the library's documented behaviour).
The first two walk rows in chunks of `chunk` gathered expert weights, so full-size workloads fit
on a GPU; their gradients scatter each chunk's weight gradients into [E, H, 2I]. The third reads
each expert's weights once and its gradient writes them by expert, without a scatter.
"""

import jax
import jax.numpy as jnp

from moe_pallas.activations import Activation, glu, split_gate_up

_HI = jax.lax.Precision.HIGHEST


def _cast_params(params, dtype) -> dict:
    return {name: jnp.asarray(value).astype(dtype) for name, value in params.items()}


def expert_apply(
    params: dict, expert: jax.Array, x_rows: jax.Array, activation: Activation, h_dtype=None
):
    """`expert_{expert[r]}(x_rows[r])` for each row r; ids out of range give zero rows.

    `h_dtype` rounds the gate_up pre-activation h to that dtype (value only: the rounding passes
    gradients straight through), as kernels that store h in bfloat16 do: the gpt-oss clamps then
    decide, and differentiate, at the same h they see.
    """
    num_experts = params["w_gate_up"].shape[0]
    valid = (expert >= 0) & (expert < num_experts)
    e = jnp.where(valid, expert, 0)
    y = _mlp({name: value[e] for name, value in params.items()}, x_rows, activation, h_dtype, "r")
    return jnp.where(valid[:, None], y, 0)


def _mlp(params: dict, x_rows, activation: Activation, h_dtype, weight_rows: str):
    """act(x_rows @ w_gate_up + b_gate_up) @ w_down + b_down, with one weight matrix per row
    (weight_rows="r": params gathered per row) or one for all rows (weight_rows="")."""
    r = weight_rows
    h = jnp.einsum(f"rh,{r}hn->rn", x_rows, params["w_gate_up"], precision=_HI)
    if "b_gate_up" in params:
        h = h + params["b_gate_up"]
    if h_dtype is not None:
        h = h + jax.lax.stop_gradient(h.astype(h_dtype).astype(h.dtype) - h)
    a = glu(*split_gate_up(h, activation), activation)
    y = jnp.einsum(f"ri,{r}ih->rh", a, params["w_down"], precision=_HI)
    return y + params["b_down"] if "b_down" in params else y


def _chunked_rows(fn, rows: int, chunk: int, *operands):
    """Apply `fn` to `chunk` rows of each operand at a time (bounded memory), concatenate.

    Each chunk is rematerialised under jax.grad: otherwise the backward would keep every chunk's
    gathered weights (rows x H x 2I floats: 68 GB at gpt-oss T = 256).
    """
    pad = -rows % chunk
    padded = [jnp.pad(o, [(0, pad)] + [(0, 0)] * (o.ndim - 1)) for o in operands]
    batched = [o.reshape(-1, chunk, *o.shape[1:]) for o in padded]
    out = jax.lax.map(jax.checkpoint(lambda args: fn(*args)), batched)
    return out.reshape(-1, *out.shape[2:])[:rows]


def moe_experts_reference(
    x,
    topk_idx,
    topk_weight,
    params,
    *,
    activation: Activation,
    dtype=jnp.float32,
    chunk=8,
    h_dtype=None,
) -> jax.Array:
    """The MoE-way oracle: sort by expert, apply each row's expert, un-sort, weighted sum.

    `h_dtype`: round h to it, as the fused kernels' bf16 h is (see `expert_apply`)."""
    params = _cast_params(params, dtype)
    x = jnp.asarray(x).astype(dtype)
    num_tokens, top_k = topk_idx.shape
    num_experts = params["w_gate_up"].shape[0]
    flat_idx = topk_idx.reshape(-1).astype(jnp.int32)
    sort_key = jnp.where((flat_idx >= 0) & (flat_idx < num_experts), flat_idx, num_experts)
    order = jnp.argsort(sort_key, stable=True)
    row_expert = flat_idx[order]
    row_token = order // top_k
    y_sorted = _chunked_rows(
        lambda e, rows: expert_apply(params, e, rows, activation, h_dtype),
        order.shape[0],
        chunk,
        row_expert,
        x[row_token],
    )
    y_pairs = jnp.zeros_like(y_sorted).at[order].set(y_sorted)
    w = topk_weight.astype(dtype).reshape(num_tokens, top_k, 1)
    return jnp.sum(y_pairs.reshape(num_tokens, top_k, -1) * w, axis=1)


def moe_experts_loop(
    x, topk_idx, topk_weight, params, *, activation: Activation, dtype=jnp.float32, chunk=8
) -> jax.Array:
    """The per-token oracle: for each token, sum its k weighted expert outputs."""
    params = _cast_params(params, dtype)
    x = jnp.asarray(x).astype(dtype)
    top_k = topk_idx.shape[1]

    def token_rows(idx_rows, w_rows, x_rows):
        out = jnp.zeros(x_rows.shape, dtype)
        for j in range(top_k):
            out = out + w_rows[:, j, None] * expert_apply(
                params, idx_rows[:, j], x_rows, activation
            )
        return out

    return _chunked_rows(
        token_rows, x.shape[0], chunk, topk_idx.astype(jnp.int32), topk_weight.astype(dtype), x
    )


def moe_experts_by_expert(
    x, topk_idx, topk_weight, params, *, activation: Activation, dtype=jnp.float32, h_dtype=None
) -> jax.Array:
    """The dense oracle: out[t] = sum_e sum_j [topk_idx[t, j] == e] topk_weight[t, j] expert_e(x[t]).

    A scan over the experts, each applied to all T*k rows (T*k*E expert rows of arithmetic; the
    scan body is rematerialised under jax.grad, so memory stays at one expert's [T*k, 2I]). Each
    expert's weights are cast to `dtype` inside the body: cast up front, the float32 copies of all
    weights and their float32 gradients took 41 GiB of temporaries at SwiGLU-256's full shapes
    (more than an H100's pool beside the weights), where an expert's gradient, computed whole in
    its own step, rounds to the weights' dtype the same either way.
    `h_dtype` as in `expert_apply`.
    """
    x = jnp.asarray(x).astype(dtype)
    num_tokens, top_k = topk_idx.shape
    num_experts = params["w_gate_up"].shape[0]
    flat_idx = topk_idx.reshape(-1).astype(jnp.int32)
    row_weight = topk_weight.astype(dtype).reshape(-1)
    x_rows = jnp.repeat(x, top_k, axis=0)  # row t*k + j holds x[t]

    @jax.checkpoint
    def add_expert(y, expert_and_params):
        e, expert_params = expert_and_params
        y_e = _mlp(_cast_params(expert_params, dtype), x_rows, activation, h_dtype, "")
        return y + jnp.where(flat_idx == e, row_weight, 0)[:, None] * y_e, None

    y0 = jnp.zeros(x_rows.shape, dtype)
    y, _ = jax.lax.scan(add_expert, y0, (jnp.arange(num_experts), params))
    return jnp.sum(y.reshape(num_tokens, top_k, -1), axis=1)
