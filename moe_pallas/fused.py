"""The fused expert block on the Pallas kernels: one `jax.custom_vjp`, forward and backward.

Rows m in [0, M = T·k) are the (token, slot) pairs sorted by expert (`dispatch.dispatch`):
row_token[m] is the source token, row_weight[m] its routing weight, pair_row[t, j] the row of
token t's slot j; rows with an out-of-range expert id sort last, past every group, and give zero.

Forward under jax.grad (4 kernels and one XLA elementwise pass):
    h   = gmm(x, w_gate_up, lhs_row_index=row_token, bias=b_gate_up)      [M, 2I]  x's dtype
    a   = glu(h) (XLA, float32 math)                                         [M, I]   x's dtype
    y   = gmm(a, w_down, bias=b_down, row_scale=row_weight)                  [M, H]   x's dtype
    out = combine(y, pair_row)          out[t] = Σ_j y[pair_row[t, j]], float32, j ascending
Without a gradient (the custom_vjp primal) the first two steps are one kernel, gmm's GLU epilogue
(`a = gmm(x, w_gate_up, ..., activation=)`), so h never hits memory; the forward rule under
jax.grad keeps h, the backward's residual. On the H200 at T = 2048 the two are equally fast within
2% (two runs, benchmarks/results/2026-11-30_h200_session2/: gpt-oss 1.750 and 1.590 ms for the
epilogue vs 1.783 and 1.560 for gmm → h + XLA glu; SwiGLU 3.037 and 2.802 vs 3.066 and 2.824);
the epilogue wins on memory (no [M, 2I] h).

Residuals, chosen for memory: h [M, 2I] in x's dtype and the int32 routing metadata; x, the params
and topk_weight are inputs the caller keeps anyway. Not saved: a (recomputed from h in the
backward), y (d topk_weight comes from g·a below). Saving a and recomputing h instead would cost a
2·M·H·2I-FLOP matmul, 2/9 of the whole fwd+bwd arithmetic.

Backward (e the row's expert):
    g[m]         = gmm(dout, w_downᵀ, lhs_row_index=row_token)    [M, I] float32 (a temporary)
    dh, a, dw[m] = glu'(h)·(w·g), glu(h), ⟨g, a⟩     one pass over g and h (kernels/glu_bwd.py)
    dy[m]        = row_weight[m] · dout[row_token[m]]                      [M, H]
    d_w_down     = tgmm(a, dy)                      d_b_down[e]    = Σ_{m in e} dy[m]  (same kernel)
    d_w_gate_up  = tgmm(x[row_token], dh)           d_b_gate_up[e] = Σ_{m in e} dh[m]  (same kernel)
    dx           = combine(gmm(dh, w_gate_upᵀ), pair_row)
    d_topk_weight[t, j] = dw[m] + ⟨dout[t], b_down[e]⟩,  m = pair_row[t, j]
g is not fused with the GLU derivative: a Triton kernel doing both (gmm_t's loop, the derivative in
its epilogue) was slower on the H200 than gmm_t at its wide tiles plus the elementwise pass, whose
extra traffic (g written and read once in float32) is small next to the weights. T = 2048, bf16,
2026-11-30 session 4: gpt-oss 1.070 ms fused (best of 7 tiles 1.045) vs 0.784 split; SwiGLU
1.691 (1.591) vs 1.362 (benchmarks/results/2026-11-30_h200_session4/). The elementwise pass is a
Triton kernel reading h and g once: XLA's fusions of it took three kernels, 0.23 ms at gpt-oss
T = 2048 (2026-12-01 trace), for ~330 MB of traffic (~0.07 ms at 4.8 TB/s).
dx's gmm and d_w_gate_up's tgmm read the same dh rows, but one kernel doing both (a program per
(k-tile, expert) holding x's tile, each dh tile loaded once for both products) was slower on the
H200 with the routing's ragged groups, whose 128-row tiles are half empty at T = 2048: gpt-oss
2.95 ms against 1.63 + 1.12, SwiGLU 6.01 against 3.13 + 2.20 (faster only on equal 64-row groups,
2.26 against 2.51; benchmarks/results/2026-12-01_h200_session10/).
Per-expert bias sums come out of the weight gradients' tgmm calls (a ones column in lhs, see
`kernels.tgmm`): no scatter atomics anywhere, so forward and backward are bitwise reproducible run
to run. Under "auto" at more than 16 rows per expert both weight gradients run as one batched
cuBLAS matmul over capacity slabs instead (`kernels.tgmm_padded`, via `ops.tgmm_on_backend`),
faster on the H200 (our tgmm's loads and stores barely overlap; train step 4-19% faster); the
Triton kernel that builds the slabs (`kernels.slab`) sums the bias gradients on the way.

Backends: "pallas_triton" runs every kernel above in Triton. "mosaic_gpu" runs the matmuls (both
gmm, both tgmm, dx's gmm) on the Mosaic GPU kernels where wgmma takes the operands (one 16-bit
dtype), reading an XLA-gathered copy of x: Hopper's TMA cannot gather rows, and the Mosaic GPU
gmm's cp.async gather, exact, ran 1.1-2.1x slower than the copy (`ops.gmm_on_backend`); combine
and the bias sums stay Triton.

Precision: matmuls accumulate in float32; h, a, y and the backward's row tensors are stored in x's
dtype (so float32 inputs keep a float32 h). bf16 inputs: relative error of out about 3e-3 against
a float32 oracle (measured on the H200 at full gpt-oss/SwiGLU shapes, T = 1..256). float32 inputs
run the Pallas dots in TF32 on GPU tensor cores (unit roundoff 2^-11): about 1e-3, within the
`gpu` tests' 5e-3 at full shapes on the H200; gpt-oss gradients of x and w_gate_up can be ~7e-3
off the exact ones, where TF32-rounded operands move a pre-activation across the clamp at ±7
(docs/reliability.md, Fuzzing). On CPU (interpret mode) float32 is exact float32 arithmetic.
"""

import functools

import jax
import jax.numpy as jnp

from moe_pallas import dispatch as _dispatch
from moe_pallas.activations import glu, split_gate_up
from moe_pallas.kernels.combine import combine
from moe_pallas.kernels.glu_bwd import glu_backward
from moe_pallas.ops import gmm_on_backend, tgmm_on_backend


def _routing(topk_idx, topk_weight, num_experts):
    """Sorted-row metadata: (dispatch, row_expert [M] with E for masked rows, row_weight [M] f32)."""
    d = _dispatch.dispatch(topk_idx, num_experts)
    row_valid = jnp.arange(d.row_pair.shape[0], dtype=jnp.int32) < d.group_offsets[num_experts]
    row_expert = jnp.where(row_valid, topk_idx.reshape(-1)[d.row_pair], num_experts)
    row_weight = jnp.where(row_valid, topk_weight.reshape(-1)[d.row_pair].astype(jnp.float32), 0)
    return d, row_expert, row_weight


def _precision(dtype):
    """HIGHEST keeps float32 operands off TF32; for bf16 (exact products) it would make XLA upcast
    the operands to float32 copies."""
    return jax.lax.Precision.HIGHEST if jnp.dtype(dtype).itemsize >= 4 else None


def dlhs(activation, backend, dout, w_down, h, d, row_weight):
    """(dh, a, dw) of the module docstring's backward, dh and a in h's dtype, dw float32 [M]."""
    g = gmm_on_backend(
        backend,
        dout,
        w_down,
        d.group_sizes,
        lhs_row_index=d.row_token,
        transpose_rhs=True,
        out_dtype=jnp.float32,
    )
    return glu_backward(h, g, row_weight, activation)


def _forward(activation, backend, x, topk_idx, topk_weight, params, keep_h=True):
    """(out, residuals for `_fused_bwd`); without keep_h the GLU runs in gmm's epilogue, no h."""
    d, row_expert, row_weight = _routing(topk_idx, topk_weight, params["w_gate_up"].shape[0])
    gate_up = functools.partial(
        gmm_on_backend,
        backend,
        x,
        params["w_gate_up"],
        d.group_sizes,
        lhs_row_index=d.row_token,
        bias=params.get("b_gate_up"),
    )
    if keep_h:
        h = gate_up()
        a = glu(*split_gate_up(h.astype(jnp.float32), activation), activation).astype(x.dtype)
    else:
        h, a = None, gate_up(activation=activation)
    y = gmm_on_backend(
        backend,
        a,
        params["w_down"],
        d.group_sizes,
        bias=params.get("b_down"),
        row_scale=row_weight,
    )
    out = combine(y, d.pair_row.reshape(topk_idx.shape), out_dtype=x.dtype)
    return out, (x, topk_idx, topk_weight, params, d, row_expert, row_weight, h)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _fused(activation, backend, x, topk_idx, topk_weight, params):
    return _forward(activation, backend, x, topk_idx, topk_weight, params, keep_h=False)[0]


def _fused_bwd(activation, backend, residuals, dout):
    x, topk_idx, topk_weight, params, d, row_expert, row_weight, h = residuals
    num_tokens, top_k = topk_idx.shape
    num_experts = params["w_gate_up"].shape[0]
    dout = dout.astype(x.dtype)
    dh, a, dw_rows = dlhs(activation, backend, dout, params["w_down"], h, d, row_weight)
    dy = (dout[d.row_token].astype(jnp.float32) * row_weight[:, None]).astype(x.dtype)
    grads = {}
    # Bias gradients: the per-expert sums of dy and dh, from the tgmm calls that read them.
    for name, lhs, rhs, row_index in (
        ("down", a, dy, None),
        ("gate_up", x, dh, d.row_token),
    ):
        out = tgmm_on_backend(
            backend,
            lhs,
            rhs,
            d.group_sizes,
            lhs_row_index=row_index,
            out_dtype=params[f"w_{name}"].dtype,
            rhs_sums=f"b_{name}" in params,
        )
        if f"b_{name}" in params:
            out, sums = out
            grads[f"b_{name}"] = sums.astype(params[f"b_{name}"].dtype)
        grads[f"w_{name}"] = out
    if "b_down" in params:
        # <dout[t], b_down[e]> for every (token, expert), then picked per row.
        bias_dot = jnp.einsum(
            "th,eh->te",
            dout,
            params["b_down"],
            preferred_element_type=jnp.float32,
            precision=_precision(dout.dtype),
        )
        row_valid = row_expert < num_experts
        dw_rows = dw_rows + jnp.where(
            row_valid, bias_dot[d.row_token, jnp.where(row_valid, row_expert, 0)], 0
        )
    dx_rows = gmm_on_backend(backend, dh, params["w_gate_up"], d.group_sizes, transpose_rhs=True)
    dx = combine(dx_rows, d.pair_row.reshape(num_tokens, top_k), out_dtype=x.dtype)
    d_topk_weight = dw_rows[d.pair_row].reshape(num_tokens, top_k).astype(topk_weight.dtype)
    return dx, None, d_topk_weight, grads


_fused.defvjp(_forward, _fused_bwd)


def fused_experts(x, topk_idx, topk_weight, params, activation, backend="pallas_triton"):
    """`moe_experts` on the Pallas kernels of `backend` ("pallas_triton", "mosaic_gpu" or "auto",
    see `ops.gmm_on_backend`; arguments already validated; params a dict)."""
    return _fused(activation, backend, x, topk_idx, topk_weight, params)
