"""The cublas_slab backend's weight gradient (a batched matmul over capacity slabs, what "auto" runs
on the H200 at more than 16 rows per group) against the float64 oracle, with groups above
capacity (the Triton overflow path), and the fused layer's gradients through it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moe_pallas import backends, fused, ops
from moe_pallas.backends import cublas_slab
from tests.helpers import FULL_SHAPES, as_if_h200
from tests.test_fused import GRAD_TOL, _loss_and_grads, _problem, _reference64
from tests.test_fused import _rel_err as _rel_err_finite
from tests.test_kernels_gmm import rel_err, tgmm64

TOL = {jnp.float32: 1e-5, jnp.bfloat16: 1e-2}


@pytest.mark.parametrize(
    "dtype, cap, gather, rhs_sums",
    [
        (jnp.float32, 16, True, True),  # groups of 20 and 40 rows overflow
        (jnp.bfloat16, 16, False, True),
        (jnp.float32, 64, True, False),  # every group fits
    ],
)
def test_matches_oracle(monkeypatch, dtype, cap, gather, rhs_sums):
    rng = np.random.default_rng(cap + gather)
    sizes = np.array([3, 0, 40, 9, 1, 20], np.int32)
    m, k, n = int(sizes.sum()) + 4, 40, 24
    rhs_np = rng.standard_normal((m, n))
    rhs_np[m - 4 :] = np.nan  # rows past every group must not reach any product or sum
    rhs = jnp.asarray(rhs_np, dtype)
    index = jnp.asarray(rng.integers(0, 30, m), jnp.int32) if gather else None
    lhs = jnp.asarray(rng.standard_normal((30 if gather else m, k)), dtype)
    monkeypatch.setattr(cublas_slab, "capacity", lambda num_rows, num_groups: cap)
    got = cublas_slab.tgmm(lhs, rhs, jnp.asarray(sizes), lhs_row_index=index, rhs_sums=rhs_sums)
    out, sums = got if rhs_sums else (got, None)
    assert out.shape == (6, k, n) and out.dtype == dtype
    assert rel_err(out, tgmm64(lhs, rhs, sizes, lhs_row_index=index)) < TOL[dtype]
    assert not np.asarray(out[1]).any(), "an empty group gives exact zeros"
    if rhs_sums:
        rows = np.asarray(rhs, np.float64)
        ends = np.cumsum(sizes)
        want = np.stack([rows[e - s : e].sum(0) for s, e in zip(sizes, ends)])
        assert sums.dtype == jnp.float32 and rel_err(sums, want) < TOL[dtype]


def _problem_of(lhs, rhs, num_groups):
    return backends.Problem(
        "tgmm",
        (lhs.dtype, rhs.dtype),
        lhs.dtype,
        lhs.shape[1],
        rhs.shape[1],
        rhs.shape[0],
        num_groups,
        False,
        False,
    )


def test_auto_takes_it_above_decode_sizes(monkeypatch):
    """On an H200 the table sends 16-bit weight gradients at more than 16 rows per group here;
    float32 operands, decode sizes and devices the table does not name stay on Triton."""
    bf = jnp.zeros((2, 8), jnp.bfloat16)
    select = lambda m, dtype=jnp.bfloat16: (
        backends.select("auto", _problem_of(bf, jnp.zeros((m, 8), dtype), 128)).name
    )
    assert select(4096) == "pallas_triton"  # off GPU: not available
    as_if_h200(monkeypatch)
    assert select(4096) == "cublas_slab"  # 32 rows per group
    assert select(65536) == "cublas_slab"  # 512
    assert select(256) == "pallas_triton"  # 2: decode
    assert select(4096, jnp.float32) == "pallas_triton"
    monkeypatch.setattr("moe_pallas.tuning.device_name", lambda: "NVIDIA A100-SXM4-80GB")
    assert select(4096) == "pallas_triton"  # measured choices apply on their device only
    assert [cublas_slab.capacity(m, 128) for m in (4096, 8192, 16384, 65536)] == [64, 96, 192, 608]


def test_auto_backend_routes_here(monkeypatch):
    calls = []
    as_if_h200(monkeypatch, spy=lambda name, op: calls.append((name, op)))
    rng = np.random.default_rng(3)
    lhs = jnp.asarray(rng.standard_normal((64, 16)), jnp.bfloat16)
    rhs = jnp.asarray(rng.standard_normal((64, 32)), jnp.bfloat16)
    sizes = jnp.array([30, 34], jnp.int32)
    out = backends.tgmm("auto", lhs, rhs, sizes)
    assert calls == [("cublas_slab", "tgmm")]
    assert rel_err(out, tgmm64(lhs, rhs, np.asarray(sizes))) < TOL[jnp.bfloat16]
    # the backend is chosen while tracing: the calls below are traced only (no output compared)
    jax.eval_shape(lambda: backends.tgmm("pallas_triton", lhs, rhs, sizes))
    assert len(calls) == 1, "explicit Pallas backends keep the Triton tgmm"
    # moe_pallas.tgmm's "auto" on a GPU
    jax.eval_shape(lambda: ops._tgmm_vjp(lhs, rhs, sizes, jnp.bfloat16, "auto"))
    # ragged_dot's backward under "auto" consults the same policy as the fused layer
    w = jnp.asarray(rng.standard_normal((2, 16, 32)), jnp.bfloat16)
    dot = lambda w: ops._ragged_dot_vjp(lhs, w, sizes, jnp.bfloat16, "auto")
    jax.eval_shape(jax.grad(lambda w: jnp.sum(dot(w).astype(jnp.float32))), w)
    assert calls == [("cublas_slab", "tgmm")] * 3


@pytest.mark.parametrize("activation, mode", [("gptoss", "hot"), ("swiglu", "masked")])
def test_layer_grads_through_it(monkeypatch, activation, mode):
    """The fused layer under "auto" (Triton gmm in interpret mode here) with a capacity of 16
    rows, so the hot expert's rows go through the overflow path; bf16 against float64."""
    monkeypatch.setattr(cublas_slab, "capacity", lambda num_rows, num_groups: 16)
    calls = []
    as_if_h200(monkeypatch, spy=lambda name, op: calls.append(name))
    rng = np.random.default_rng(7)
    x, idx, w, params = _problem(rng, activation, 24, 64, 32, 4, 3, jnp.bfloat16, mode)
    cotangent = jnp.asarray(rng.standard_normal(x.shape), jnp.float32)
    layer = lambda x, w, p: fused.expert_block(x, idx, w, p, activation, "auto")
    _, grads = jax.jit(lambda *a: _loss_and_grads(layer, *a, cotangent))(x, w, params)
    assert calls == ["cublas_slab"] * 2  # 18 rows per group: both weight gradients
    _, ref_grads = _reference64(activation, x, idx, w, params, cotangent, h_dtype=jnp.bfloat16)
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
        assert _rel_err_finite(got, want) < GRAD_TOL[jnp.bfloat16]


@FULL_SHAPES
@pytest.mark.gpu
@pytest.mark.parametrize(
    "activation, t, h, i, e, k",
    [("gptoss", 1024, 2880, 2880, 128, 4), ("swiglu", 1024, 4096, 2048, 256, 8)],
)
def test_full_shapes_auto_gpu(activation, t, h, i, e, k):
    """implementation="auto" at 32 rows per expert, where the weight gradients run on cuBLAS, with
    one expert taking every token's first slot (far above capacity: the overflow path): every
    gradient against the float32 by-expert oracle, and a rerun gives the same bits."""
    from moe_pallas import moe_experts
    from moe_pallas.reference import moe_experts_by_expert
    from tests.test_fused import _rel_err_on_device

    rng = np.random.default_rng(2)
    x, idx, w, params = _problem(rng, activation, t, h, i, e, k, jnp.bfloat16, "hot")
    cotangent = jnp.asarray(rng.standard_normal(x.shape), jnp.float32)
    layer = lambda x, w, p: moe_experts(x, idx, w, p, activation=activation, implementation="auto")
    step = jax.jit(lambda *a: _loss_and_grads(layer, *a, cotangent))
    _, grads = step(x, w, params)
    oracle = lambda x, w, p: moe_experts_by_expert(
        x, idx, w, p, activation=activation, h_dtype=jnp.bfloat16
    )
    _, ref_grads = jax.jit(lambda *a: _loss_and_grads(oracle, *a, cotangent))(x, w, params)
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
        assert _rel_err_on_device(got, want) < GRAD_TOL[jnp.bfloat16]
    del ref_grads, got, want  # the rerun's gradients take their place in memory
    _, again = step(x, w, params)
    for got, rerun in zip(jax.tree.leaves(grads), jax.tree.leaves(again)):
        assert bool(jnp.array_equal(got, rerun))
