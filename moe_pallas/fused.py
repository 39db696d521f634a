"""The fused expert block on the Pallas backends: one `jax.custom_vjp`, forward and backward.

Rows m in [0, M = T·k) are the (token, slot) pairs sorted by expert (`dispatch.dispatch`):
row_token[m] is the source token, row_weight[m] its routing weight, pair_row[t, j] the row of
token t's slot j; rows with an out-of-range expert id sort last, past every group, and give zero.
Every grouped matmul below goes through `moe_pallas.backends` (`gmm`, `tgmm`), so the policy of
`implementation=` picks its backend per call.

Forward under jax.grad (4 kernels and one XLA elementwise pass):
    h   = gmm(x, w_gate_up, lhs_row_index=row_token, bias=b_gate_up)      [M, 2I]  x's dtype
    a   = glu(h) (XLA, float32 math)                                         [M, I]   x's dtype
    y   = gmm(a, w_down, bias=b_down, row_scale=row_weight)                  [M, H]   x's dtype
    out = combine(y, pair_row)          out[t] = Σ_j y[pair_row[t, j]], float32, j ascending
Without a gradient (the custom_vjp primal) the first two steps are one kernel, gmm's GLU epilogue
(`a = gmm(x, w_gate_up, ..., activation=)`), so h never hits memory; the forward rule under
jax.grad keeps h, the backward's residual. The two are equally fast; the epilogue saves the
[M, 2I] h.

Residuals, chosen for memory: h [M, 2I] in x's dtype and the int32 routing metadata; x, the params
and topk_weight are inputs the caller keeps anyway. Not saved: a (recomputed from h in the
backward), y (d topk_weight comes from g·a below). Saving a and recomputing h instead would cost a
2·M·H·2I-FLOP matmul, 2/9 of the whole fwd+bwd arithmetic.

Backward (e the row's expert):
    g[m]         = gmm(dout, w_downᵀ, lhs_row_index=row_token)    [M, I] float32 (a temporary)
    dh, a, dw[m] = glu'(h)·(w·g), glu(h), ⟨g, a⟩     one pass over g and h (kernels/glu_bwd.py)
    dy[m]        = row_weight[m] · dout[row_token[m]]      [M, H], built inside the tgmm's loads
    d_w_down     = tgmm(a, dy)                      d_b_down[e]    = Σ_{m in e} dy[m]  (same call)
    d_w_gate_up  = tgmm(x[row_token], dh)           d_b_gate_up[e] = Σ_{m in e} dh[m]  (same call)
    dx           = combine(gmm(dh, w_gate_upᵀ), pair_row)
    d_topk_weight[t, j] = dw[m] + ⟨dout[t], b_down[e]⟩,  m = pair_row[t, j]
g is not fused with the GLU derivative, and dx's gmm not with d_w_gate_up's tgmm although both
read dh: each fusion was slower on the H200 at the routing's ragged groups (docs/decisions.md).
The GLU pass is one Triton kernel reading h and g once (XLA's fusions of it read them three
times). Per-expert bias sums come out of the weight gradients' tgmm calls (no scatter atomics
anywhere), so forward and backward are bitwise reproducible run to run.

Precision: matmuls accumulate in float32; h, a, y and the backward's row tensors are stored in x's
dtype (so float32 inputs keep a float32 h). bf16 inputs: relative error of out about 3e-3 against
a float32 oracle at full gpt-oss/SwiGLU shapes. float32 inputs run the Pallas dots in TF32 on GPU
tensor cores (unit roundoff 2^-11): about 1e-3; gpt-oss gradients of x and w_gate_up can be
~7e-3 off the exact ones, where TF32-rounded operands move a pre-activation across the clamp at
±7 (docs/reliability.md). On CPU (interpret mode) float32 is exact float32 arithmetic.

Quantised weights (`moe_pallas.quant.QuantizedWeight`): the forward's gmm calls stream them as
stored, and so do the backward's products with wᵀ (g and dx; `kernels.gmm_quant_t`, where it
takes them, else dequantised per call: `moe_pallas.backends`);
their weight gradients are None (asking for them is refused at the API, `quant.guard_gradients`)
and the bias gradients are per-expert segment sums of dy and dh.

FP8 training (`fp8_training`, from `moe_experts(..., fp8_training=True)`), DeepSeek-V3's recipe on
dense weights: each call quantises w_gate_up and w_down to e4m3 per 128 x 128 block
(`quant.fp8_training_weights`), and every product above but the weight gradients runs on the FP8
tensor cores, its lhs quantised per row and 128 values of K (`quant.quantize_rows`), q(·) below:
    h, y         = the forward's gmm calls on q(x) and q(a) with q(w_gate_up), q(w_down)
    g[m]         = gmm(q(dout)[row_token], q(w_down)ᵀ)
    dx           = combine(gmm(q(dh), q(w_gate_up)ᵀ), pair_row)
    d_w_down, d_w_gate_up: the tgmm calls above, in x's dtype on the unquantised a, dy, x, dh
q(w)ᵀ is the same quantisation stored the other way: a 128 x 128 block of w is one of wᵀ, so the
same values and scales serve both products, each stored in the layout its product reads (the FP8
tensor cores take both operands K-major). The weight gradients are those of the dense weights
with every q taken as the identity (straight through); their products, a third of the block's
multiply-adds, stay in x's dtype. Under differentiation the forward writes q(w) and q(w)ᵀ in one
pass over each dense weight (`kernels.fp8_blocks`: 2 bytes read and 2 written per weight value)
and keeps q(w)ᵀ as a residual for the backward (1 byte per weight value held), where quantising
again would read the dense weights a second time; without it only q(w) is written. On "xla" the
same block runs on that backend's ops (`quant.fp8_training_weight`'s jnp rule; its gmm computes
the quantised products exactly in float32), not its own `experts`.
"""

import functools

import jax
import jax.numpy as jnp

from moe_pallas import backends, quant
from moe_pallas import dispatch as _dispatch
from moe_pallas.activations import glu, split_gate_up


def _routing(topk_idx, topk_weight, num_experts):
    """Sorted-row metadata: (dispatch, row_expert [M] with E for masked rows, row_weight [M] f32)."""
    d = _dispatch.dispatch(topk_idx, num_experts)
    row_valid = d.row_expert < num_experts
    row_weight = jnp.where(row_valid, topk_weight.reshape(-1)[d.row_pair].astype(jnp.float32), 0)
    return d, d.row_expert, row_weight


def _precision(dtype):
    """HIGHEST keeps float32 operands off TF32; for bf16 (exact products) it would make XLA upcast
    the operands to float32 copies."""
    return jax.lax.Precision.HIGHEST if jnp.dtype(dtype).itemsize >= 4 else None


def dlhs(activation, policy, dout, w_down, h, d, row_weight, w_down_t=None):
    """(dh, a, dw) of the module docstring's backward, dh and a in h's dtype, dw float32 [M];
    under FP8 training g's product takes q(w_down)ᵀ as written (w_down_t)."""
    g = backends.gmm(
        policy,
        dout,
        w_down if w_down_t is None else w_down_t,
        d.group_sizes,
        lhs_row_index=d.row_token,
        transpose_rhs=w_down_t is None,
        out_dtype=jnp.float32,
    )
    return backends.block_ops(policy).glu_backward(h, g, row_weight, activation)


def _forward(activation, policy, fp8_training, x, topk_idx, topk_weight, params, keep_h=True):
    """(out, residuals for `_fused_bwd`); without keep_h the GLU runs in gmm's epilogue, no h."""
    d, row_expert, row_weight = _routing(topk_idx, topk_weight, params["w_gate_up"].shape[0])
    weights = {name: params[name] for name in ("w_gate_up", "w_down")}
    weights_t = None
    if fp8_training:  # this call's quantisation of the dense weights (module docstring)
        pairs = {
            name: quant.fp8_training_weights(w, both=keep_h, kernel=policy != "xla")
            for name, w in weights.items()
        }
        weights = {name: pair[0] for name, pair in pairs.items()}
        weights_t = {name: pair[1] for name, pair in pairs.items()} if keep_h else None
    gate_up = functools.partial(
        backends.gmm,
        policy,
        x,
        weights["w_gate_up"],
        d.group_sizes,
        lhs_row_index=d.row_token,
        bias=params.get("b_gate_up"),
    )
    if keep_h:
        h = gate_up()
        a = glu(*split_gate_up(h.astype(jnp.float32), activation), activation).astype(x.dtype)
    else:
        h, a = None, gate_up(activation=activation)
    y = backends.gmm(
        policy,
        a,
        weights["w_down"],
        d.group_sizes,
        bias=params.get("b_down"),
        row_scale=row_weight,
    )
    combine = backends.block_ops(policy).combine
    out = combine(y, d.pair_row.reshape(topk_idx.shape), out_dtype=x.dtype)
    return out, (x, topk_idx, topk_weight, params, d, row_expert, row_weight, h, weights_t)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _fused(activation, policy, fp8_training, x, topk_idx, topk_weight, params):
    return _forward(activation, policy, fp8_training, x, topk_idx, topk_weight, params, False)[0]


def _fused_bwd(activation, policy, fp8_training, residuals, dout):
    x, topk_idx, topk_weight, params, d, row_expert, row_weight, h, weights_t = residuals
    w_t = weights_t or {}
    num_tokens, top_k = topk_idx.shape
    num_experts = params["w_gate_up"].shape[0]
    dout = dout.astype(x.dtype)
    dh, a, dw_rows = dlhs(
        activation, policy, dout, params["w_down"], h, d, row_weight, w_t.get("w_down")
    )
    grads = {}
    # Bias gradients: the per-expert sums of dy and dh, from the tgmm calls that read them. dy's
    # rows are gathered from dout and scaled where the tgmm reads them (rhs_row_index, _scale).
    for name, lhs, lhs_index, rhs, rhs_index, rhs_scale in (
        ("down", a, None, dout, d.row_token, row_weight),
        ("gate_up", x, d.row_token, dh, None, None),
    ):
        if quant.is_quantized(params[f"w_{name}"]):  # no weight gradient (quant.guard_gradients)
            grads[f"w_{name}"] = None
            if f"b_{name}" in params:
                rows = backends.scaled_rows(rhs, rhs_index, rhs_scale)
                sums = jax.ops.segment_sum(
                    rows.astype(jnp.float32), row_expert, num_segments=num_experts + 1
                )[:num_experts]
                grads[f"b_{name}"] = sums.astype(params[f"b_{name}"].dtype)
            continue
        out = backends.tgmm(
            policy,
            lhs,
            rhs,
            d.group_sizes,
            lhs_row_index=lhs_index,
            rhs_row_index=rhs_index,
            rhs_row_scale=rhs_scale,
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
    w_gate_up_t = w_t.get("w_gate_up")
    dx_rows = backends.gmm(
        policy,
        dh,
        params["w_gate_up"] if w_gate_up_t is None else w_gate_up_t,
        d.group_sizes,
        transpose_rhs=w_gate_up_t is None,
    )
    dx = backends.block_ops(policy).combine(
        dx_rows, d.pair_row.reshape(num_tokens, top_k), out_dtype=x.dtype
    )
    d_topk_weight = dw_rows[d.pair_row].reshape(num_tokens, top_k).astype(topk_weight.dtype)
    return dx, None, d_topk_weight, grads


_fused.defvjp(_forward, _fused_bwd)


def expert_block(x, topk_idx, topk_weight, params, activation, policy, fp8_training=False):
    """The single-device expert block under a resolved policy (`backends.resolve`): the policy's
    own block where its policy has one (xla) and no FP8 training is asked for, else the fused
    custom_vjp above. Arguments are validated (`moe_pallas.experts.validate`); params a dict."""
    if x.shape[0] == 0:
        return jnp.zeros_like(x)
    own = None if policy == "auto" or fp8_training else backends.get(policy).experts
    if own is not None:
        return own(x, topk_idx, topk_weight, params, activation)
    return _fused(activation, policy, fp8_training, x, topk_idx, topk_weight, params)
