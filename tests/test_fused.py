"""The fused expert block (`implementation="pallas_triton"`) against the float64 reference.

On CPU the kernels run in interpret mode at reduced sizes; the `gpu` tests use the full workload
shapes. Interpret mode fills outputs with NaN before a kernel runs, and `_rel_err` rejects NaN, so
the tests also prove every output element is written.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moe_pallas import backends, moe_experts
from moe_pallas.kernels.combine import combine
from moe_pallas.reference import moe_experts_by_expert, moe_experts_reference
from tests.helpers import FULL_SHAPES, device_expert_params, device_normal

ON_GPU = jax.default_backend() == "gpu"
# Relative error bounds (‖out − ref‖ / ‖ref‖). float32 runs the dots in TF32 on GPU.
TOL = {jnp.float32: 5e-3 if ON_GPU else 1e-5, jnp.bfloat16: 2e-2}
GRAD_TOL = {jnp.float32: 5e-3 if ON_GPU else 1e-4, jnp.bfloat16: 4e-2}


def _rel_err(x, ref) -> float:
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    assert np.isfinite(x).all(), "output holds NaN/Inf (an element was never written?)"
    return float(np.linalg.norm(x - ref) / max(np.linalg.norm(ref), 1e-30))


@jax.jit
def _slice_sums(x, ref):
    x, ref = x.astype(jnp.float32), ref.astype(jnp.float32)
    return jnp.sum(jnp.square(x - ref)), jnp.sum(ref * ref), jnp.isfinite(x).all()


def _rel_err_on_device(x, ref, elements_per_slice: int = 2**26) -> float:
    """`_rel_err` where the arrays live (full-shape gradients are billions of elements: float64
    host copies took longer than the test's kernels), in float32 sums over slices of the leading
    axis, added in float64: one jitted sum over a whole SwiGLU weight gradient asked XLA for a
    40.84 GiB float32 copy of both operands."""
    rows = max(1, elements_per_slice // max(1, x[0].size))
    diff = norm = 0.0
    for start in range(0, x.shape[0], rows):
        d, r, finite = _slice_sums(x[start : start + rows], ref[start : start + rows])
        if not bool(finite):
            return float("inf")
        diff, norm = diff + float(d), norm + float(r)
    return float(np.sqrt(diff) / max(np.sqrt(norm), 1e-30))


def test_rel_err_on_device_matches_the_float64_one():
    """The sliced float32 sums give `_rel_err`'s figure, for 2-D and 3-D arrays in one slice and
    in several, and a NaN in the output (an unwritten element) fails it."""
    rng = np.random.default_rng(5)
    for shape, per_slice in itertools.product([(7, 5), (3, 4, 6)], [2**26, 10]):
        ref = rng.standard_normal(shape)
        x = ref + 1e-2 * rng.standard_normal(shape)
        x_bf16 = jnp.asarray(x, jnp.bfloat16)
        got = _rel_err_on_device(x_bf16, jnp.asarray(ref, jnp.float32), per_slice)
        want = _rel_err(np.asarray(x_bf16, np.float64), ref)
        assert abs(got - want) <= 1e-3 * want
        x[-1, ...] = np.nan
        assert _rel_err_on_device(jnp.asarray(x), jnp.asarray(ref), per_slice) == np.inf


def _problem(rng, activation, tokens, hidden, inter, experts, top_k, dtype, mode="random"):
    """Random inputs; `mode` shapes the routing: random / empty (2 experts used) / hot (every
    token sends slot 0 to one expert) / masked (some ids out of range)."""
    idx = rng.integers(0, experts, (tokens, top_k))
    if mode == "empty":
        idx = rng.choice([1, experts - 2], (tokens, top_k))
    elif mode == "hot":
        idx[:, 0] = experts // 2
    elif mode == "masked":
        idx[rng.random((tokens, top_k)) < 0.2] = experts + 3
    # gpt-oss: biases large enough that the clamps at ±7 bite sometimes
    bias_scales = (3.0, 1.0) if activation == "gptoss" else None
    params = device_expert_params(rng, experts, hidden, inter, dtype, bias_scales)
    return (
        device_normal(rng, (tokens, hidden), dtype),
        jnp.asarray(idx, jnp.int32),
        jnp.asarray(rng.random((tokens, top_k)) + 0.1, jnp.float32),
        params,
    )


def _loss_and_grads(fn, x, topk_weight, params, cotangent):
    loss = lambda x, w, p: jnp.sum(fn(x, w, p).astype(cotangent.dtype) * cotangent)
    return jax.value_and_grad(loss, argnums=(0, 1, 2))(x, topk_weight, params)


def _pallas(activation, topk_idx):
    return lambda x, w, p: moe_experts(
        x, topk_idx, w, p, activation=activation, implementation="pallas_triton"
    )


def _reference64(activation, x, topk_idx, topk_weight, params, cotangent, h_dtype=None):
    """(out, grads) of the float64 reference at the same (rounded) input values; `h_dtype` rounds
    its h like kernels that store h in that dtype."""
    with jax.enable_x64(True):
        up = lambda a: jnp.asarray(np.asarray(a, np.float64))
        fn = lambda x, w, p: moe_experts_reference(
            x, topk_idx, w, p, activation=activation, dtype=jnp.float64, h_dtype=h_dtype
        )
        args = (up(x), up(topk_weight), jax.tree.map(up, params))
        # one jit (eagerly, every op of the oracle and its gradient compiled on its own)
        run = jax.jit(lambda *a: (fn(*a[:3]), _loss_and_grads(fn, *a)[1]))
        out, grads = run(*args, up(cotangent))
        return np.asarray(out), jax.tree.map(np.asarray, grads)


def test_auto_is_xla_on_cpu_and_per_op_on_gpu():
    assert backends.resolve("auto") == ("auto" if ON_GPU else "xla")
    assert backends.resolve("pallas_triton") == "pallas_triton"
    with pytest.raises(ValueError, match="implementation"):
        backends.resolve("triton")


@pytest.mark.parametrize("dtype,hidden", [(jnp.float32, 40), (jnp.bfloat16, 64)])
def test_combine_sums_slots_in_order(dtype, hidden):
    rng = np.random.default_rng(0)
    rows = jnp.asarray(rng.standard_normal((50, hidden)), dtype)
    pair_row = rng.integers(0, 50, (21, 3)).astype(np.int32)  # T tail; repeated rows
    pair_row[rng.random(pair_row.shape) < 0.3] = -1  # slots that add nothing
    out = combine(rows, jnp.asarray(pair_row), out_dtype=jnp.float32, block_t=16, block_h=32)
    picked = np.asarray(rows, np.float64)[np.maximum(pair_row, 0)]  # H tail at 40
    ref = np.where((pair_row >= 0)[..., None], picked, 0).sum(axis=1)
    assert out.shape == (21, hidden) and _rel_err(out, ref) < 1e-6


FORWARD_CASES = [  # (activation, dtype, T, H, I, E, k, mode)
    ("gptoss", jnp.float32, 13, 32, 48, 6, 4, "masked"),  # I = 48: N tails; ids out of range
    ("gptoss", jnp.bfloat16, 16, 32, 32, 6, 1, "hot"),  # k = 1: one expert takes every token
    ("swiglu", jnp.bfloat16, 16, 64, 32, 8, 2, "empty"),
    ("swiglu", jnp.float32, 1, 64, 32, 8, 3, "random"),  # T = 1
]


@pytest.mark.parametrize("activation,dtype,t,h,i,e,k,mode", FORWARD_CASES)
def test_forward_matches_reference(activation, dtype, t, h, i, e, k, mode):
    rng = np.random.default_rng(t * 31 + h + i + e + k)
    x, idx, w, params = _problem(rng, activation, t, h, i, e, k, dtype, mode)
    out = jax.jit(_pallas(activation, idx))(x, w, params)
    assert out.shape == x.shape and out.dtype == x.dtype
    with jax.enable_x64(True):
        ref = jax.jit(moe_experts_reference, static_argnames=("activation", "dtype"))(
            np.asarray(x, np.float64),
            idx,
            np.asarray(w, np.float64),
            jax.tree.map(lambda a: np.asarray(a, np.float64), params),
            activation=activation,
            dtype=jnp.float64,
        )
    assert _rel_err(out, ref) < TOL[dtype]


GRAD_CASES = [  # (activation, dtype, T, H, I, E, k, mode)
    ("gptoss", jnp.float32, 12, 32, 48, 6, 4, "masked"),
    ("swiglu", jnp.bfloat16, 8, 64, 32, 8, 2, "empty"),
    ("gptoss", jnp.bfloat16, 1, 32, 32, 4, 3, "hot"),  # T = 1, odd k
]


@pytest.mark.parametrize("activation,dtype,t,h,i,e,k,mode", GRAD_CASES)
def test_grad_matches_reference(activation, dtype, t, h, i, e, k, mode):
    rng = np.random.default_rng(t * 17 + h + i + e + k)
    x, idx, w, params = _problem(rng, activation, t, h, i, e, k, dtype, mode)
    cotangent = jnp.asarray(rng.standard_normal(x.shape), jnp.float32)
    step = jax.jit(lambda *a: _loss_and_grads(_pallas(activation, idx), *a, cotangent))
    _, grads = step(x, w, params)
    _, ref_grads = _reference64(activation, x, idx, w, params, cotangent)
    names = ["x", "topk_weight"] + [f"params[{n!r}]" for n in sorted(params)]
    for name, got, want, like in zip(
        names, jax.tree.leaves(grads), jax.tree.leaves(ref_grads), jax.tree.leaves((x, w, params))
    ):
        assert got.shape == like.shape and got.dtype == like.dtype, name
        assert _rel_err(got, want) < GRAD_TOL[dtype], name
    if mode == "masked":  # slots with an out-of-range expert get exactly zero gradient
        assert np.all(np.asarray(grads[1])[np.asarray(idx) >= e] == 0)
    # Determinism: a second run gives the same bits (fixed-order combine, no atomics).
    _, again = step(x, w, params)
    for got, rerun in zip(jax.tree.leaves(grads), jax.tree.leaves(again)):
        assert np.array_equal(np.asarray(got), np.asarray(rerun))


@FULL_SHAPES
@pytest.mark.gpu
@pytest.mark.parametrize(
    "activation,dtype,t,h,i,e,k",
    [
        ("gptoss", jnp.bfloat16, 256, 2880, 2880, 128, 4),
        ("gptoss", jnp.float32, 64, 2880, 2880, 128, 4),
        ("swiglu", jnp.bfloat16, 128, 4096, 2048, 256, 8),
    ],
)
def test_full_shapes_gpu(activation, dtype, t, h, i, e, k):
    """Full workload shapes: out and gradients vs the float32 dense oracle (HIGHEST precision;
    bf16 runs round its h like the kernels'). The row-gathering oracle's gradient scatters into
    [E, H, 2I] per chunk: with it the SwiGLU case did not finish in 100 s on the H200."""
    rng = np.random.default_rng(0)
    x, idx, w, params = _problem(rng, activation, t, h, i, e, k, dtype, "hot")
    cotangent = jnp.asarray(rng.standard_normal(x.shape), jnp.float32)
    out = jax.jit(_pallas(activation, idx))(x, w, params)
    ref = moe_experts_reference(x, idx, w, params, activation=activation)
    assert _rel_err(out, ref) < TOL[dtype]
    step = jax.jit(lambda *a: _loss_and_grads(_pallas(activation, idx), *a, cotangent))
    _, grads = step(x, w, params)
    h_dtype = None if dtype == jnp.float32 else dtype
    oracle = lambda x, w, p: moe_experts_by_expert(
        x, idx, w, p, activation=activation, h_dtype=h_dtype
    )
    _, ref_grads = jax.jit(lambda *a: _loss_and_grads(oracle, *a, cotangent))(x, w, params)
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
        assert _rel_err_on_device(got, want) < GRAD_TOL[dtype]
    del ref_grads, got, want  # the rerun's gradients take their place in memory
    _, again = step(x, w, params)
    for got, rerun in zip(jax.tree.leaves(grads), jax.tree.leaves(again)):
        assert bool(jnp.array_equal(got, rerun))


@FULL_SHAPES
@pytest.mark.gpu
@pytest.mark.parametrize(
    "activation,t,h,i,e,k",
    [
        ("gptoss", 1, 2880, 2880, 128, 4),
        ("gptoss", 16, 2880, 2880, 128, 4),
        ("gptoss", 256, 2880, 2880, 128, 4),
        ("swiglu", 1, 4096, 2048, 256, 8),
        ("swiglu", 128, 4096, 2048, 256, 8),
    ],
)
def test_mosaic_gpu_full_shapes_gpu(activation, t, h, i, e, k):
    """implementation="mosaic_gpu" at full workload shapes, decode (its own tile config) and
    prefill: interpret mode cannot show a misaligned TMA box (16- and 32-column decode tiles
    crashed the H200 at T = 1)."""
    rng = np.random.default_rng(1)
    x, idx, w, params = _problem(rng, activation, t, h, i, e, k, jnp.bfloat16, "hot")
    layer = lambda x, w, p: moe_experts(
        x, idx, w, p, activation=activation, implementation="mosaic_gpu"
    )
    out = jax.jit(layer)(x, w, params)
    ref = moe_experts_reference(x, idx, w, params, activation=activation)
    assert _rel_err(out, ref) < TOL[jnp.bfloat16]
