"""Every backend against the float64 oracle, through the seam (`moe_pallas.backends`): the gmm
contract (row gather, transposed rhs, bias, GLU, row scale, zero rows past the groups), the tgmm
contract (row gather, per-group sums, empty groups exact zeros) and the fused expert block's
forward and gradients under each `implementation=`. Small shapes with ragged groups, an empty
group, a hot group and tails; kernels run in interpret mode on CPU."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moe_pallas import backends, moe_experts
from tests.test_fused import GRAD_TOL, TOL, _loss_and_grads, _problem, _reference64
from tests.test_fused import _rel_err as rel_err_finite
from tests.test_kernels_gmm import gmm64, rel_err, tgmm64

BF16 = jnp.bfloat16
GMM_BACKENDS = ["pallas_triton", "mosaic_gpu", "xla"]
TGMM_BACKENDS = ["pallas_triton", "mosaic_gpu", "cublas_slab", "xla"]
SIZES = [30, 0, 50, 13]  # ragged, an empty group, 3 rows past the groups (stored as zeros)


@pytest.mark.parametrize("backend", GMM_BACKENDS)
@pytest.mark.parametrize("variant", ["plain", "gather", "transposed", "swiglu", "gptoss"])
def test_gmm_contract(backend, variant):
    rng = np.random.default_rng(len(variant))
    num_rows, k, n, g = sum(SIZES) + 3, 64, 128, len(SIZES)
    transpose = variant == "transposed"
    activation = variant if variant in ("swiglu", "gptoss") else None
    lhs = jnp.asarray(rng.standard_normal((num_rows if variant != "gather" else 20, k)), BF16)
    shape = (g, n, k) if transpose else (g, k, n)
    rhs = jnp.asarray(rng.standard_normal(shape) * (4 if activation else 1) / np.sqrt(k), BF16)
    kwargs = {"transpose_rhs": transpose, "activation": activation}
    if variant == "gather":
        kwargs["lhs_row_index"] = jnp.asarray(rng.integers(0, 20, num_rows), jnp.int32)
    if variant in ("gather", "swiglu", "gptoss"):
        kwargs["bias"] = jnp.asarray(rng.standard_normal((g, n)), BF16)
        kwargs["row_scale"] = jnp.asarray(rng.random(num_rows) + 0.5, jnp.float32)
    sizes = jnp.asarray(SIZES, jnp.int32)
    out = backends.get(backend).gmm(lhs, rhs, sizes, out_dtype=jnp.float32, **kwargs)
    assert out.shape == (num_rows, n // (2 if activation else 1)) and out.dtype == jnp.float32
    assert rel_err(out, gmm64(lhs, rhs, SIZES, **kwargs)) < 1e-5
    assert not np.asarray(out[sum(SIZES) :]).any(), "rows past the groups are zeros"


@pytest.mark.parametrize("backend", TGMM_BACKENDS)
@pytest.mark.parametrize(
    "gather, rhs_sums, scaled_rhs",
    [(False, False, False), (True, True, False), (False, True, True)],
)
def test_tgmm_contract(backend, gather, rhs_sums, scaled_rhs):
    """scaled_rhs: rhs's rows gathered from 20 token rows and scaled (the train step's
    dy = row_weight ⊙ dout[row_token]); the rows past the groups point at a NaN token row."""
    rng = np.random.default_rng(2 + gather + 2 * scaled_rhs)
    num_rows, k, n = sum(SIZES) + 3, 64, 32
    rhs_np = rng.standard_normal((20 if scaled_rhs else num_rows, n))
    rhs_np[-3:] = np.nan  # rows past every group (or the tokens they point at) reach nothing
    rhs = jnp.asarray(rhs_np, BF16)
    rhs_kwargs = {}
    if scaled_rhs:
        rhs_index = np.concatenate([rng.integers(0, 17, sum(SIZES)), [17, 18, 19]])
        rhs_kwargs = {
            "rhs_row_index": jnp.asarray(rhs_index, jnp.int32),
            "rhs_row_scale": jnp.asarray(rng.uniform(0.1, 2, num_rows), jnp.float32),
        }
    lhs = jnp.asarray(rng.standard_normal((20 if gather else num_rows, k)), BF16)
    index = jnp.asarray(rng.integers(0, 20, num_rows), jnp.int32) if gather else None
    got = backends.get(backend).tgmm(
        lhs,
        rhs,
        jnp.asarray(SIZES, jnp.int32),
        lhs_row_index=index,
        out_dtype=jnp.float32,
        rhs_sums=rhs_sums,
        **rhs_kwargs,
    )
    out, sums = got if rhs_sums else (got, None)
    # The oracle's rhs: the rows as every backend rounds them (one bf16 rounding of w · row).
    rhs = backends.scaled_rows(
        rhs, rhs_kwargs.get("rhs_row_index"), rhs_kwargs.get("rhs_row_scale")
    )
    assert out.shape == (len(SIZES), k, n)
    assert rel_err(out, tgmm64(lhs, rhs, SIZES, lhs_row_index=index)) < 1e-5
    assert not np.asarray(out[1]).any(), "an empty group gives exact zeros"
    if rhs_sums:
        rows = np.asarray(rhs, np.float64)
        ends = np.cumsum(SIZES)
        want = np.stack([rows[e - s : e].sum(0) for s, e in zip(SIZES, ends)])
        assert rel_err(sums, want) < 1e-5


@pytest.mark.parametrize("implementation", ["pallas_triton", "mosaic_gpu", "xla"])
@pytest.mark.parametrize("activation,mode", [("gptoss", "masked"), ("swiglu", "empty")])
def test_expert_block_matches_reference(implementation, activation, mode):
    """The expert block, forward and gradients, under each implementation: bf16, H and I
    multiples of 64 (Mosaic GPU tiles them), M = 39 rows (not a multiple of the 8-row TMA boxes),
    ids out of range or experts left empty. The oracle rounds h to bf16 like the kernels."""
    rng = np.random.default_rng(len(activation) + len(implementation))
    x, idx, w, params = _problem(rng, activation, 13, 128, 64, 8, 3, BF16, mode)
    cotangent = jnp.asarray(rng.standard_normal(x.shape), jnp.float32)
    layer = lambda x, w, p: moe_experts(
        x, idx, w, p, activation=activation, implementation=implementation
    )
    out = jax.jit(layer)(x, w, params)
    _, grads = jax.jit(lambda *a: _loss_and_grads(layer, *a, cotangent))(x, w, params)
    h_dtype = None if implementation == "xla" else BF16
    ref, ref_grads = _reference64(activation, x, idx, w, params, cotangent, h_dtype=h_dtype)
    assert out.dtype == x.dtype and rel_err_finite(out, ref) < TOL[BF16]
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
        assert rel_err_finite(got, want) < GRAD_TOL[BF16]
    if mode == "masked":  # slots with an out-of-range expert get exactly zero gradient
        assert np.all(np.asarray(grads[1])[np.asarray(idx) >= 8] == 0)
