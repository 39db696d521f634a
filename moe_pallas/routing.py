"""Routers: logits[T, E] -> (topk_idx[T, k] int32, topk_weight[T, k] float32, aux).

Methods (all compute in float32; ties go to the lower expert id, as `jax.lax.top_k` does):
  - "softmax_topk"       p = softmax(logits); top-k of p; optionally renormalised to sum 1
                         (Mixtral, Qwen3-MoE `norm_topk_prob`).
  - "topk_softmax"       top-k of logits; softmax over the k selected logits (gpt-oss).
  - "sigmoid_group_topk" s = sigmoid(logits); selection on s + correction_bias, limited to the
                         `topk_group` best of `n_group` expert groups (a group scores the sum of its
                         two best biased scores); weights are the unbiased s of the chosen experts,
                         optionally renormalised, times `routed_scaling_factor` (DeepSeek-V3).
aux: "load_balancing_loss" (E * sum_e f_e * P_e, f_e the fraction of the T*k assignments that
went to e, P_e the mean routing probability of e), "z_loss" (mean logsumexp(logits)^2) and
"expert_counts" (int32 [E], assignments per expert).
"""

from typing import Literal

import jax
import jax.numpy as jnp

RouterMethod = Literal["softmax_topk", "topk_softmax", "sigmoid_group_topk"]
ROUTER_METHODS: tuple[str, ...] = ("softmax_topk", "topk_softmax", "sigmoid_group_topk")


def _check(logits, top_k, method, n_group, topk_group, correction_bias):
    if method not in ROUTER_METHODS:
        raise ValueError(f"method={method!r} is not a router; use one of {ROUTER_METHODS}.")
    if logits.ndim != 2 or not jnp.issubdtype(logits.dtype, jnp.floating):
        raise TypeError(
            f"logits must be a floating [T, E] array, got {logits.dtype}{list(logits.shape)}; "
            "flatten leading batch dimensions first."
        )
    num_experts = logits.shape[1]
    if not isinstance(top_k, int) or not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k={top_k!r} must be an int in [1, E={num_experts}].")
    if method == "sigmoid_group_topk":
        if n_group is None or topk_group is None:
            raise ValueError("method='sigmoid_group_topk' needs n_group and topk_group (ints).")
        if n_group < 1 or num_experts % n_group:
            raise ValueError(
                f"n_group={n_group} must divide the number of experts E={num_experts}."
            )
        if not 1 <= topk_group <= n_group:
            raise ValueError(f"topk_group={topk_group} must be in [1, n_group={n_group}].")
        if top_k > topk_group * (num_experts // n_group):
            raise ValueError(
                f"top_k={top_k} exceeds the experts in the topk_group={topk_group} chosen groups "
                f"({topk_group * (num_experts // n_group)}); raise topk_group."
            )
        if correction_bias is not None and correction_bias.shape != (num_experts,):
            raise ValueError(
                f"correction_bias must have shape [E]=({num_experts},), "
                f"got {tuple(correction_bias.shape)}."
            )
    elif n_group is not None or topk_group is not None or correction_bias is not None:
        raise ValueError(
            "n_group, topk_group and correction_bias only apply to method='sigmoid_group_topk'."
        )


def _group_limited_topk(choice, top_k, n_group, topk_group):
    num_tokens, num_experts = choice.shape
    grouped = choice.reshape(num_tokens, n_group, num_experts // n_group)
    group_score = jnp.sum(jax.lax.top_k(grouped, min(2, grouped.shape[-1]))[0], axis=-1)
    _, top_groups = jax.lax.top_k(group_score, topk_group)
    group_mask = (
        jnp.zeros((num_tokens, n_group), bool)
        .at[jnp.arange(num_tokens)[:, None], top_groups]
        .set(True)
    )
    masked = jnp.where(group_mask[:, :, None], grouped, -jnp.inf).reshape(num_tokens, num_experts)
    return jax.lax.top_k(masked, top_k)[1]


def route(
    logits: jax.Array,
    top_k: int,
    *,
    method: RouterMethod,
    renormalize: bool = False,
    correction_bias: jax.Array | None = None,
    n_group: int | None = None,
    topk_group: int | None = None,
    routed_scaling_factor: float = 1.0,
) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
    """Pick `top_k` experts per token from router `logits[T, E]`; see the module doc."""
    logits = jnp.asarray(logits)
    _check(logits, top_k, method, n_group, topk_group, correction_bias)
    logits = logits.astype(jnp.float32)
    num_tokens, num_experts = logits.shape

    if method == "softmax_topk":
        probs = jax.nn.softmax(logits, axis=-1)
        topk_weight, topk_idx = jax.lax.top_k(probs, top_k)
    elif method == "topk_softmax":
        probs = jax.nn.softmax(logits, axis=-1)
        top_logits, topk_idx = jax.lax.top_k(logits, top_k)
        topk_weight = jax.nn.softmax(top_logits, axis=-1)
    else:
        scores = jax.nn.sigmoid(logits)
        probs = scores / jnp.sum(scores, axis=-1, keepdims=True)
        choice = scores if correction_bias is None else scores + correction_bias.astype(jnp.float32)
        topk_idx = _group_limited_topk(choice, top_k, n_group, topk_group)
        topk_weight = jnp.take_along_axis(scores, topk_idx, axis=-1)
    if renormalize and method != "topk_softmax":
        topk_weight = topk_weight / (jnp.sum(topk_weight, axis=-1, keepdims=True) + 1e-20)
    topk_weight = topk_weight * routed_scaling_factor

    counts = jnp.zeros((num_experts,), jnp.int32).at[topk_idx.reshape(-1)].add(1)
    fraction = counts.astype(jnp.float32) / max(num_tokens * top_k, 1)
    mean_prob = jnp.mean(probs, axis=0) if num_tokens else jnp.zeros((num_experts,))
    z = jax.nn.logsumexp(logits, axis=-1)
    aux = {
        "load_balancing_loss": num_experts * jnp.sum(jax.lax.stop_gradient(fraction) * mean_prob),
        "z_loss": jnp.mean(z**2) if num_tokens else jnp.zeros(()),
        "expert_counts": counts,
    }
    return topk_idx.astype(jnp.int32), topk_weight, aux
