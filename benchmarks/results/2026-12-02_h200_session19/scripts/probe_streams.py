"""Session 19 probe: the backward's weight gradients on other CUDA streams than dx's gmm.

After `dlhs` three large pieces of the backward are independent: d w_down (writes [E, I, H]),
d w_gate_up (writes [E, H, 2I]) and dx = dh @ w_gate_upᵀ (reads [E, H, 2I]). On one stream they
run one after another, the weight gradients writing at 3.3-3.5 TB/s and dx's gmm reading at
~3.9. jax's `compute_on("gpu_stream:N")` puts a region on stream N, so XLA can run it beside the
main stream's work. Variants (--streams):
  none  the committed `fused._fused_bwd` (everything on the main stream)
  one   both weight gradients on stream 1, one after the other; dx on the main stream
  two   d w_down on stream 1, d w_gate_up on stream 2; dx on the main stream
Runs `benchmarks.run` (its arguments after --) with `fused._fused`'s backward replaced, or with
--check compares the gradients of the variants on CPU (Pallas interpret mode, small shapes).
"""

import argparse
import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import core
from jax.experimental.compute_on import compute_on

from moe_pallas import fused as F
from moe_pallas.ops import tgmm_on_backend

COMMITTED_BWD = F._fused_bwd


def _eval_inlined(jaxpr, consts, *args):
    """`core.eval_jaxpr` with every nested jit (and custom_jvp/vjp call) evaluated in place: XLA
    finds no execution stream for a call nested inside a stream-annotated region (call 3a)."""
    env = {}
    read = lambda v: v.val if isinstance(v, core.Literal) else env[v]
    for v, x in zip(jaxpr.constvars, consts):
        env[v] = x
    for v, x in zip(jaxpr.invars, args):
        env[v] = x
    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]
        inner = None
        if eqn.primitive.name in ("pjit", "jit"):
            inner = eqn.params["jaxpr"]
        elif eqn.primitive.name in ("custom_jvp_call", "custom_vjp_call"):
            inner = eqn.params["call_jaxpr"]
        if inner is not None:
            outs = _eval_inlined(inner.jaxpr, inner.consts, *invals)
        else:
            with eqn.ctx.manager:
                outs = eqn.primitive.bind(*invals, **eqn.primitive.get_bind_params(eqn.params))
            outs = outs if eqn.primitive.multiple_results else [outs]
        for v, x in zip(eqn.outvars, outs):
            env[v] = x
    return [read(v) for v in jaxpr.outvars]


def _on_stream(stream, fn, *args):
    closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*args)
    tree = jax.tree.structure(out_shape)
    flat = lambda *a: _eval_inlined(closed.jaxpr, closed.consts, *jax.tree.leaves(a))
    outs = compute_on(
        flat, compute_type=f"gpu_stream:{stream}", out_memory_spaces=core.MemorySpace.Device
    )(*args)
    return jax.tree.unflatten(tree, outs)


def streamed_bwd(streams, activation, backend, residuals, dout):
    x, topk_idx, topk_weight, params, d, row_expert, row_weight, h = residuals
    num_tokens, top_k = topk_idx.shape
    num_experts = params["w_gate_up"].shape[0]
    dout = dout.astype(x.dtype)
    dh, a, dw_rows = F.dlhs(activation, backend, dout, params["w_down"], h, d, row_weight)
    dy = (dout[d.row_token].astype(jnp.float32) * row_weight[:, None]).astype(x.dtype)

    def weight_grad(name, lhs, rhs, group_sizes, row_index):
        out = tgmm_on_backend(
            backend,
            lhs,
            rhs,
            group_sizes,
            lhs_row_index=row_index,
            out_dtype=params[f"w_{name}"].dtype,
            rhs_sums=f"b_{name}" in params,
        )
        return out if isinstance(out, tuple) else (out,)

    down = functools.partial(weight_grad, "down")
    gate_up = functools.partial(weight_grad, "gate_up")
    if streams == "one":
        both = lambda a, dy, x, dh, sizes, rows: (
            down(a, dy, sizes, None),
            gate_up(x, dh, sizes, rows),
        )
        outs = _on_stream(1, both, a, dy, x, dh, d.group_sizes, d.row_token)
    else:
        outs = (
            _on_stream(1, lambda a, dy, s: down(a, dy, s, None), a, dy, d.group_sizes),
            _on_stream(2, gate_up, x, dh, d.group_sizes, d.row_token),
        )
    grads = {}
    for name, out in zip(("down", "gate_up"), outs):
        grads[f"w_{name}"] = out[0]
        if f"b_{name}" in params:
            grads[f"b_{name}"] = out[1].astype(params[f"b_{name}"].dtype)
    if "b_down" in params:
        bias_dot = jnp.einsum(
            "th,eh->te",
            dout,
            params["b_down"],
            preferred_element_type=jnp.float32,
            precision=F._precision(dout.dtype),
        )
        row_valid = row_expert < num_experts
        dw_rows = dw_rows + jnp.where(
            row_valid, bias_dot[d.row_token, jnp.where(row_valid, row_expert, 0)], 0
        )
    dx_rows = F.gmm_on_backend(backend, dh, params["w_gate_up"], d.group_sizes, transpose_rhs=True)
    dx = F.combine(dx_rows, d.pair_row.reshape(num_tokens, top_k), out_dtype=x.dtype)
    d_topk_weight = dw_rows[d.pair_row].reshape(num_tokens, top_k).astype(topk_weight.dtype)
    return dx, None, d_topk_weight, grads


def use(streams):
    bwd = COMMITTED_BWD if streams == "none" else functools.partial(streamed_bwd, streams)
    F._fused.defvjp(F._forward, bwd)


def check():
    """Gradients of every variant equal the committed backward's, bit for bit (CPU, interpret)."""
    t, h, i, e, k = 48, 64, 32, 8, 2
    keys = jax.random.split(jax.random.key(0), 6)
    x = jax.random.normal(keys[0], (t, h), jnp.float32)
    idx = jax.random.randint(keys[1], (t, k), 0, e, jnp.int32)
    w = jax.random.uniform(keys[2], (t, k), jnp.float32)
    params = {
        "w_gate_up": jax.random.normal(keys[3], (e, h, 2 * i)) * 0.1,
        "w_down": jax.random.normal(keys[4], (e, i, h)) * 0.1,
        "b_gate_up": jax.random.normal(keys[5], (e, 2 * i)) * 0.1,
        "b_down": jnp.zeros((e, h)),
    }
    loss = lambda x, w, p: F.fused_experts(x, idx, w, p, "gptoss").sum()
    results = {}
    for streams in ("none", "one", "two"):
        use(streams)
        grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
        results[streams] = jax.tree.leaves(grad(x, w, params))
    for streams in ("one", "two"):
        for ref, got in zip(results["none"], results[streams]):
            np.testing.assert_array_equal(np.asarray(ref), np.asarray(got))
    print("check: the streamed backwards' gradients equal the committed one's bit for bit")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", choices=("none", "one", "two"), default="none")
    parser.add_argument("--check", action="store_true")
    args, rest = parser.parse_known_args()
    if args.check:
        check()
        return
    use(args.streams)
    from benchmarks import run

    run.main([a for a in rest if a != "--"])


if __name__ == "__main__":
    sys.exit(main())
