"""The expert layer for a few tokens, without sorting: two kernels, Pallas Triton lowering.

Math (as `moe_pallas.moe_experts`): for tokens x[T, H] and their k expert slots,

    a[t·k + j]  = act(x[t] @ w_gate_up[e] + b_gate_up[e])                e = topk_idx[t, j]
    out[t]      = Σ_j topk_weight[t, j] · (a[t·k + j] @ w_down[e] + b_down[e])

Slots whose expert id lies outside [0, E) give a zero row `a` and contribute nothing; their
expert's weights are never read.

Why a separate path: at decode sizes (a few tokens) the sorted path is ~10 small launches (sort,
group offsets, tile schedule, combine) around its two matmuls, each a few microseconds, against a
speed of light of ~40-80 us for the weights. Here the routing is read inside the kernels.

Tiling. `gate_up`: a grid over (slot p = t·k + j, column tile); each program streams expert e's
[H, 2·block_n] weight slab (gate and up columns, in the activation's layout) in block_k steps
against the one row x[t]. `down`: a grid over (token, column tile); each program walks the
token's k slots in order, streaming [I, block_n] of each slot's expert, and sums the weighted
rows in float32 in slot order (deterministic, no atomics), rounding once. A single row is below
the 16-row minimum of Triton's dot, so each step is a broadcast product accumulated per (k,
column) in float32 on CUDA cores and reduced over k once at the end (the kernels are bandwidth
bound). An expert hit by several tokens is read once per token: meant for T·k up to a few dozen
rows (top-k ids differ within a token).

Status: correct on CPU (interpret mode) and lowers for the H200; not yet compiled or timed on a
GPU, so the layer does not route to it yet: `benchmarks` times it as "moe_pallas:decode" next to
the sorted path, and the measured crossover will decide where `moe_experts` uses it.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from moe_pallas import _backend
from moe_pallas.activations import glu
from moe_pallas.kernels import config as _config
from moe_pallas.kernels.gmm import _and, check_int32_sizes
from moe_pallas.kernels.gmm import _load as _masked_load


def _row_times_slab(rows_ref, row, w_ref, e, k_dim, c0, width, bk, c_mask):
    """float32 [width]: rows_ref[row, 0:K] @ w_ref[e, 0:K, c0:c0+width], in block_k steps;
    c_mask [width] (or None) masks the column tail."""

    def body(i, acc):
        ks = i * bk + jnp.arange(bk, dtype=jnp.int32)
        k_mask = ks < k_dim if k_dim % bk else None
        x = _masked_load(rows_ref.at[row, pl.ds(i * bk, bk)], k_mask).astype(jnp.float32)
        w_mask = _and(
            None if k_mask is None else k_mask[:, None], None if c_mask is None else c_mask[None, :]
        )
        w = _masked_load(w_ref.at[e, pl.ds(i * bk, bk), pl.ds(c0, width)], w_mask)
        return acc + x[:, None] * w.astype(jnp.float32)

    # Products accumulate per (k, column) in registers; one reduction over k at the end, not a
    # cross-thread reduction every step.
    acc = jax.lax.fori_loop(0, pl.cdiv(k_dim, bk), body, jnp.zeros((bk, width), jnp.float32))
    return jnp.sum(acc, axis=0)


def _gate_up_kernel(
    idx_ref, x_ref, w_ref, *rest, top_k, num_experts, k_dim, n_out, bn, bk, activation
):
    b_ref, a_ref = rest if len(rest) == 2 else (None, rest[0])
    p, n0 = pl.program_id(0), pl.program_id(1) * bn
    e = idx_ref[p]
    cols = n0 + jnp.arange(bn, dtype=jnp.int32)
    n_mask = cols < n_out if n_out % bn else None
    out_ref = a_ref.at[p, pl.ds(n0, bn)]

    @pl.when((e < 0) | (e >= num_experts))
    def _masked_slot():
        plgpu.store(out_ref, jnp.zeros((bn,), a_ref.dtype), mask=n_mask)

    @pl.when((e >= 0) & (e < num_experts))
    def _slot():
        # gpt-oss interleaves gate/up: one [K, 2·bn] slab; SwiGLU: the gate and the up half.
        if activation == "gptoss":
            pair_cols = 2 * n0 + jnp.arange(2 * bn, dtype=jnp.int32)
            blocks = ((2 * n0, 2 * bn, None if n_mask is None else pair_cols < 2 * n_out),)
        else:
            blocks = ((n0, bn, n_mask), (n_out + n0, bn, n_mask))
        accs = [
            _row_times_slab(x_ref, p // top_k, w_ref, e, k_dim, c0, w, bk, m) for c0, w, m in blocks
        ]
        if b_ref is not None:
            accs = [
                acc + _masked_load(b_ref.at[e, pl.ds(c0, w)], m).astype(jnp.float32)
                for acc, (c0, w, m) in zip(accs, blocks)
            ]
        if activation == "gptoss":
            accs = jnp.unstack(accs[0].reshape(bn, 2), axis=-1)  # (gate, up)
        plgpu.store(out_ref, glu(accs[0], accs[1], activation).astype(a_ref.dtype), mask=n_mask)


def _down_kernel(
    idx_ref, weight_ref, a_ref, w_ref, *rest, top_k, num_experts, k_dim, n_out, bn, bk
):
    b_ref, out_ref = rest if len(rest) == 2 else (None, rest[0])
    t, n0 = pl.program_id(0), pl.program_id(1) * bn
    cols = n0 + jnp.arange(bn, dtype=jnp.int32)
    n_mask = cols < n_out if n_out % bn else None
    acc = jnp.zeros((bn,), jnp.float32)
    for j in range(top_k):  # fixed slot order: the float32 sum is reproducible
        p = t * top_k + j
        e = idx_ref[p]
        valid = (e >= 0) & (e < num_experts)
        e_read = jnp.where(valid, e, 0)  # masked slots: a zero row, skipped below, never summed
        y = _row_times_slab(a_ref, p, w_ref, e_read, k_dim, n0, bn, bk, n_mask)
        if b_ref is not None:
            y = y + _masked_load(b_ref.at[e_read, pl.ds(n0, bn)], n_mask).astype(jnp.float32)
        acc = acc + jnp.where(valid, weight_ref[p].astype(jnp.float32) * y, 0.0)
    plgpu.store(out_ref.at[t, pl.ds(n0, bn)], acc.astype(out_ref.dtype), mask=n_mask)


def _column_block(block_n: int, programs_per_block: int, n_out: int) -> int:
    """Halve block_n (down to 16) until the grid has a few programs per SM."""
    bn = min(block_n, max(16, 1 << max(n_out - 1, 0).bit_length()))
    while bn > 16 and programs_per_block * pl.cdiv(n_out, bn) < _config._MIN_PROGRAMS:
        bn //= 2
    return bn


def decode_experts(
    x: jax.Array,
    topk_idx: jax.Array,
    topk_weight: jax.Array,
    params: dict[str, jax.Array],
    activation: str,
    *,
    block_k: int = 128,
    block_n: int = 64,
    num_warps: int = 4,
) -> jax.Array:
    """`moe_experts` forward for a few tokens (module docstring): x `[T, H]`, topk_idx/weight
    `[T, k]`, params as in `moe_experts` (arguments already validated); returns `[T, H]` in x's
    dtype."""
    num_tokens, top_k = topk_idx.shape
    w_gate_up, w_down = params["w_gate_up"], params["w_down"]
    num_experts, hidden, two_inter = w_gate_up.shape
    inter = two_inter // 2
    check_int32_sizes("decode_experts", x=x.shape, w_gate_up=w_gate_up.shape)
    if num_tokens == 0 or top_k == 0:
        return jnp.zeros((num_tokens, hidden), x.dtype)
    idx = topk_idx.reshape(-1).astype(jnp.int32)
    params_gu = [params["b_gate_up"]] if "b_gate_up" in params else []
    bn = _column_block(block_n, num_tokens * top_k, inter)
    a = pl.pallas_call(
        functools.partial(
            _gate_up_kernel,
            top_k=top_k,
            num_experts=num_experts,
            k_dim=hidden,
            n_out=inter,
            bn=bn,
            bk=block_k,
            activation=activation,
        ),
        out_shape=jax.ShapeDtypeStruct((num_tokens * top_k, inter), x.dtype),
        grid=(num_tokens * top_k, pl.cdiv(inter, bn)),
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=3),
        interpret=_backend.interpret_mode(),
        name="moe_decode_gate_up",
    )(idx, x, w_gate_up, *params_gu)
    params_d = [params["b_down"]] if "b_down" in params else []
    bn = _column_block(block_n, num_tokens, hidden)
    return pl.pallas_call(
        functools.partial(
            _down_kernel,
            top_k=top_k,
            num_experts=num_experts,
            k_dim=inter,
            n_out=hidden,
            bn=bn,
            bk=2 * block_k,
        ),
        out_shape=jax.ShapeDtypeStruct((num_tokens, hidden), x.dtype),
        grid=(num_tokens, pl.cdiv(hidden, bn)),
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=3),
        interpret=_backend.interpret_mode(),
        name="moe_decode_down",
    )(idx, topk_weight.reshape(-1), a, w_down, *params_d)
