"""Expert-parallel cases on 8 simulated CPU devices, run by tests/test_parallel.py in a subprocess.

`python tests/ep_cases.py` sets XLA_FLAGS before importing jax, runs every case and prints one JSON
object {case: {metric: value}} as its last line; the assertions live in test_parallel.py.
XLA:CPU has no ragged_all_to_all, so the "ragged" cases first check that the real collective traces
and lowers (forward and backward), then run with `jax.lax.ragged_all_to_all` replaced by an
emulation built from all_to_all that follows its documented semantics.
"""

import functools
import json
import os
import sys
from functools import partial

# The cases are small and many: compiling them dominates, and XLA:CPU's backend optimisations cost
# more than they save here (90 -> 69 s for the whole file on 2 cores).
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "")
    + " --xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0"
)
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import jax
import jax.numpy as jnp
import numpy as np

import moe_pallas
from moe_pallas.reference import moe_experts_reference

H, I = 16, 8


def emulated_ragged_all_to_all(
    operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, *, axis_name
):
    """`jax.lax.ragged_all_to_all` (one slice per peer) from all_to_all, gather and scatter."""
    num_peers, rows = jax.lax.axis_size(axis_name), operand.shape[0]
    r = jnp.arange(rows)
    tail = (1,) * (operand.ndim - 1)
    src = jnp.clip(input_offsets[:, None] + r[None], 0, rows - 1)
    chunks = jnp.where(
        (r[None] < send_sizes[:, None]).reshape(num_peers, rows, *tail), operand[src], 0
    )
    received = jax.lax.all_to_all(chunks, axis_name, 0, 0, tiled=True)
    offsets = jax.lax.all_to_all(output_offsets, axis_name, 0, 0, tiled=True)
    dst = jnp.where(r[None] < recv_sizes[:, None], offsets[:, None] + r[None], output.shape[0])
    return output.at[dst.reshape(-1)].set(received.reshape(-1, *operand.shape[1:]), mode="drop")


def make_inputs(
    seed, T, E, k, dtype=jnp.float32, bias=False, invalid=0, hot=None, hidden=H, inter=I
):
    """numpy arrays: jax.random's ops, run eagerly, would compile a program per op and shape,
    and device arrays would be sliced onto each case's mesh by more compiles (together a sixth of
    this script's time)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((T, hidden), np.float32)
    scores = rng.standard_normal((T, E), np.float32)
    idx = np.argsort(-scores, axis=1, kind="stable")[:, :k].astype(np.int32)  # top k
    if hot is not None:  # the first slot of `hot` of the tokens goes to expert 0
        idx[:hot, 0] = np.where((idx[:hot] == 0).any(1), idx[:hot, 0], 0)
    if invalid:
        idx[:invalid, -1] = -1
    w = rng.uniform(0.1, 1.0, (T, k)).astype(np.float32)
    params = {
        "w_gate_up": rng.standard_normal((E, hidden, 2 * inter)) / hidden**0.5,
        "w_down": rng.standard_normal((E, inter, hidden)) / inter**0.5,
    }
    if bias:
        params["b_gate_up"] = 0.1 * rng.standard_normal((E, 2 * inter))
        params["b_down"] = 0.1 * rng.standard_normal((E, hidden))
    params = {n: p.astype(np.float32).astype(dtype) for n, p in params.items()}
    return x.astype(dtype), idx, w, params


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def cotangent(x):
    """A fixed random cotangent for x's output."""
    return np.random.default_rng(99).standard_normal(x.shape, np.float32).astype(x.dtype)


@functools.cache
def layer(activation, implementation="xla", mesh=None, **options):
    """`moe_experts` with these options, one function object per set of them: the cases that run
    it at the same shapes share `_fwd_and_grads`'s compile."""
    return partial(
        moe_pallas.moe_experts,
        activation=activation,
        implementation=implementation,
        mesh=mesh,
        **options,
    )


@partial(jax.jit, static_argnums=0)
def _fwd_and_grads(fn, x, idx, w, params, cot):
    def out_and_stats(x, w, p):
        result = fn(x, idx, w, p)
        return result if isinstance(result, tuple) else (result, None)

    out, vjp, stats = jax.vjp(out_and_stats, x, w, params, has_aux=True)
    return out, vjp(cot), stats


@partial(jax.jit, static_argnums=0)
def forward(fn, x, idx, w, params):
    """fn(x, idx, w, params), jitted once per fn (`layer`) and shapes."""
    return fn(x, idx, w, params)


def fwd_and_grads(fn, x, idx, w, params):
    """out, the gradients of <out, cot> w.r.t. (x, w, params) and fn's stats if it returns them
    (else None), in one jit. Every array is an argument: numpy arrays closed over become
    constants that XLA folds through the routing at compile time."""
    return _fwd_and_grads(fn, x, idx, w, params, cotangent(x))


def compare(ep_fn, x, idx, w, params, activation, grads=True):
    """ep_fn against the single-device layer ("xla"); with grads, also ep_fn's stats if any."""
    single = layer(activation)
    if not grads:
        out = forward(ep_fn, x, idx, w, params)
        ref = forward(single, x, idx, w, params)
        exact = jax.jit(partial(moe_experts_reference, activation=activation))(x, idx, w, params)
        return {"fwd": rel(out, ref), "fwd_vs_f32_reference": rel(out, exact)}
    out, g, stats = fwd_and_grads(ep_fn, x, idx, w, params)
    ref, g_ref, _ = fwd_and_grads(single, x, idx, w, params)
    leaves, ref_leaves = jax.tree.leaves(g), jax.tree.leaves(g_ref)
    result = {"fwd": rel(out, ref), "grad": max(rel(a, b) for a, b in zip(leaves, ref_leaves))}
    return (result, stats) if stats is not None else result


def ep_layer(mesh, activation="swiglu", implementation="xla", **options):
    """`moe_experts` on `mesh` with these expert-parallel options (`layer`)."""
    return layer(activation, implementation, mesh, **options)


def expected_kept(idx, E, S, num_devices, exchange, capacity):
    """The pairs each exchange computes, from its definition (tokens blocked over devices)."""
    idx = np.asarray(idx)
    T, k = idx.shape
    t_loc, e_loc = T // num_devices, E // S
    kept = np.zeros((T, k), bool)
    for group in range(num_devices // S):
        filled = np.zeros(S, int)  # ragged: rows earlier sources sent to each destination
        for s in range(S):
            block = slice((group * S + s) * t_loc, (group * S + s + 1) * t_loc)
            flat = idx[block].reshape(-1)
            valid = (flat >= 0) & (flat < E)
            order = np.argsort(np.where(valid, flat, E), kind="stable")
            rank, counts = np.zeros(S, int), np.bincount(flat[valid] // e_loc, minlength=S)
            kept_block = np.zeros(flat.shape, bool)
            for p in order[: valid.sum()]:
                d = flat[p] // e_loc
                limit = capacity if exchange == "all_to_all" else capacity - filled[d]
                kept_block[p] = rank[d] < limit
                rank[d] += 1
            filled += counts
            kept[block] = kept_block.reshape(-1, k)
    return kept


def drop_case(exchange, S, data, capacity_factor, seed):
    E, k, T = 16, 4, 64
    x, idx, w, params = make_inputs(seed, T, E, k, hot=48)
    mesh = moe_pallas.expert_mesh(S, data)
    fn = ep_layer(mesh, exchange=exchange, capacity_factor=capacity_factor, return_stats=True)
    out, stats = forward(fn, x, idx, w, params)
    kept = expected_kept(idx, E, S, mesh.size, exchange, stats["capacity_rows"])
    valid = np.asarray((idx >= 0) & (idx < E))
    ref = forward(layer("swiglu"), x, np.where(kept, idx, -1), w, params)
    return {
        "fwd": rel(out, ref),
        "dropped": int(stats["dropped_rows"]),
        "expected_dropped": int((valid & ~kept).sum()),
        "rows_computed": int(stats["rows_per_shard"].sum()),
        "expected_rows": int(kept.sum()),
    }


def spill_case(balanced):
    """Dropless all_to_all (capacity_factor=None) on 2 expert shards x 4: a routing that loads
    every (source, destination) pair exactly evenly stays in the first round; one hot expert
    overflows it into the second. Forward and gradients against one device, and the stats."""
    x, idx, w, params = make_inputs(11, 64, 16, 2)
    t = np.arange(64)[:, None]
    idx = ((t + np.array([0, 8])) % 16).astype(np.int32) if balanced else idx
    if not balanced:
        idx[:, 0] = 3
    # (both routings share one compile of the layer with its stats, and one of the reference)
    fn = ep_layer(moe_pallas.expert_mesh(2, 4), exchange="all_to_all", return_stats=True)
    result, stats = compare(fn, x, idx, w, params, "swiglu")
    result.update(
        spilled=int(stats["spilled_rows"]),
        dropped=int(stats["dropped_rows"]),
        rows_computed=int(stats["rows_per_shard"].sum()),
    )
    return result


def ragged_lowers():
    """The real ragged_all_to_all path traces and lowers, forward and backward (no CPU run)."""
    x, idx, w, params = make_inputs(7, 32, 16, 2)
    mesh = moe_pallas.expert_mesh(4, 2)
    fn = ep_layer(mesh, exchange="ragged")
    loss = lambda x, w, p: jnp.sum(fn(x, idx, w, p) ** 2)
    text = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(x, w, params).as_text()
    return {"ragged_ops": text.count("ragged_all_to_all")}


def debug_raises():
    """Under debug_checks, drops and bad expert ids raise (on every device: no stranded peer)."""
    x, idx, w, params = make_inputs(3, 32, 16, 4, hot=32)
    mesh = moe_pallas.expert_mesh(8)
    raised = {}
    bad = idx.copy()
    bad[3, 1] = 99
    for name, ids, factor in [("drop", idx, 0.5), ("bad_id", bad, None)]:
        with moe_pallas.debug_checks():
            fn = jax.jit(ep_layer(mesh, exchange="all_to_all", capacity_factor=factor))
            try:
                jax.block_until_ready(fn(x, ids, w, params))
                raised[name] = ""
            except jax.errors.JaxRuntimeError as e:  # wraps the callback's ValueError
                raised[name] = str(e)
    return raised


def quantized_case(fmt, implementation, seed, fp8_activations=False):
    """Quantised expert weights (`quantize_experts`, with fp8 activations if asked) split over a
    4 x 2 mesh: forward and the gradients of x and the routing weights against the same weights on
    one device; gradients of the weights are refused with the single-device error. H = I = 64
    (mxfp4: K % 64 == 0)."""
    x, idx, w, dense = make_inputs(seed, 29, 16, 4, jnp.bfloat16, bias=True, hidden=64, inter=64)
    params = moe_pallas.quantize_experts(dense, fmt, fp8_activations=fp8_activations)
    single = partial(moe_pallas.moe_experts, activation="gptoss", implementation=implementation)
    ep = partial(single, mesh=moe_pallas.expert_mesh(4, 2), exchange="all_to_all")

    @jax.jit
    def run(x, idx, w, params, cot):  # (arguments, not constants: see fwd_and_grads)
        outs = []
        for fn in (ep, single):
            out, vjp = jax.vjp(lambda x, w, fn=fn: fn(x, idx, w, params), x, w)
            outs.append((out, vjp(cot)))
        return outs

    (out, grads), (ref, ref_grads) = run(x, idx, w, params, cotangent(x))
    try:
        jax.grad(lambda p: jnp.sum(ep(x, idx, w, p).astype(jnp.float32)))(params)
        weight_grad = ""
    except TypeError as e:
        weight_grad = str(e)
    return {
        "fwd": rel(out, ref),
        "grad": max(rel(a, b) for a, b in zip(grads, ref_grads)),
        "weight_grad": weight_grad,
    }


def fp8_training_case(implementation, seed):
    """FP8 training (`moe_experts(..., fp8_training=True)`) over a 4 x 2 mesh against the same on
    one device: forward and the gradients of x, the routing weights and the dense weights and
    biases (each shard quantises its own experts' 128 x 128 blocks, as one device does)."""
    x, idx, w, params = make_inputs(seed, 29, 16, 4, jnp.bfloat16, bias=True, hidden=64, inter=64)
    single = partial(
        moe_pallas.moe_experts,
        activation="gptoss",
        implementation=implementation,
        fp8_training=True,
    )
    ep = partial(single, mesh=moe_pallas.expert_mesh(4, 2), exchange="all_to_all")
    out, (dx, dw, dparams), _ = fwd_and_grads(ep, x, idx, w, params)
    ref, (ref_dx, ref_dw, ref_dparams), _ = fwd_and_grads(single, x, idx, w, params)
    leaves, ref_leaves = jax.tree.leaves(dparams), jax.tree.leaves(ref_dparams)
    return {
        "fwd": rel(out, ref),
        "grad": max(rel(dx, ref_dx), rel(dw, ref_dw)),
        "param_grad": max(rel(a, b) for a, b in zip(leaves, ref_leaves)),
        "param_grads": len(leaves),
    }


def errors():
    x, idx, w, params = make_inputs(0, 8, 12, 2)
    messages = {}
    for name, kwargs in {
        "indivisible_experts": {"mesh": moe_pallas.expert_mesh(8)},
        "bad_axis": {"mesh": moe_pallas.expert_mesh(8), "expert_axis": "experts"},
    }.items():
        try:
            moe_pallas.moe_experts(x, idx, w, params, activation="swiglu", **kwargs)
            messages[name] = ""
        except ValueError as e:
            messages[name] = str(e)
    return messages


def main():
    results = {"ragged_lowers": ragged_lowers()}
    jax.lax.ragged_all_to_all = emulated_ragged_all_to_all

    x, idx, w, params = make_inputs(1, 64, 16, 4)
    results["a2a_ep8"] = compare(
        ep_layer(moe_pallas.expert_mesh(8), activation="swiglu", exchange="all_to_all"),
        x,
        idx,
        w,
        params,
        "swiglu",
    )
    x, idx, w, params = make_inputs(2, 37, 16, 4, bias=True, invalid=5)
    results["a2a_ep4_data2_gptoss_tail"] = compare(
        ep_layer(moe_pallas.expert_mesh(4, 2), activation="gptoss", exchange="all_to_all"),
        x,
        idx,
        w,
        params,
        "gptoss",
    )
    x, idx, w, params = make_inputs(3, 64, 16, 4, dtype=jnp.bfloat16)
    results["a2a_ep2_data4_bf16"] = compare(
        ep_layer(moe_pallas.expert_mesh(2, 4), activation="swiglu", exchange="all_to_all"),
        x,
        idx,
        w,
        params,
        "swiglu",
        grads=False,
    )
    x, idx, w, params = make_inputs(4, 16, 16, 1)
    idx = np.full_like(idx, 3)  # one hot expert: shard 1 gets every row, the others none
    results["a2a_one_hot_expert"] = compare(
        ep_layer(moe_pallas.expert_mesh(8), activation="swiglu", exchange="all_to_all"),
        x,
        idx,
        w,
        params,
        "swiglu",
    )
    x, idx, w, params = make_inputs(5, 40, 16, 2)
    results["ragged_ep8_emulated"] = compare(
        ep_layer(moe_pallas.expert_mesh(8), activation="swiglu", exchange="ragged"),
        x,
        idx,
        w,
        params,
        "swiglu",
    )
    x, idx, w, params = make_inputs(6, 1, 8, 2)
    results["explicit_mesh_T1"] = compare(
        ep_layer(
            jax.make_mesh((2, 4), ("data", "expert")), activation="swiglu", exchange="all_to_all"
        ),
        x,
        idx,
        w,
        params,
        "swiglu",
        grads=False,
    )
    # The Pallas kernels (interpret mode here) inside shard_map: the GPU's default path.
    x, idx, w, params = make_inputs(10, 12, 8, 2, bias=True)
    results["a2a_ep2_pallas_gptoss"] = compare(
        ep_layer(
            moe_pallas.expert_mesh(2, 4),
            activation="gptoss",
            implementation="pallas_triton",
            exchange="all_to_all",
        ),
        x,
        idx,
        w,
        params,
        "gptoss",
    )
    results["a2a_ep4_data2_fp8_block_pallas"] = quantized_case("fp8_block", "pallas_triton", 11)
    results["a2a_ep4_data2_fp8_block_a8_pallas"] = quantized_case(
        "fp8_block", "pallas_triton", 14, fp8_activations=True
    )
    results["a2a_ep4_data2_mxfp4_pallas"] = quantized_case("mxfp4", "pallas_triton", 12)
    results["a2a_ep4_data2_fp8_xla"] = quantized_case("fp8", "xla", 13)
    results["a2a_ep4_data2_fp8_training_pallas"] = fp8_training_case("pallas_triton", 15)
    results["a2a_dropless_balanced"] = spill_case(balanced=True)
    results["a2a_dropless_spill"] = spill_case(balanced=False)
    results["a2a_drop"] = drop_case("all_to_all", 8, 1, 1.0, 8)
    results["ragged_drop_emulated"] = drop_case("ragged", 4, 2, 1.0, 9)
    results["debug_raises"] = debug_raises()
    results["errors"] = errors()
    print(json.dumps(results))


if __name__ == "__main__":
    main()
