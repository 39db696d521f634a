"""Input handling of the public ops under non-default settings and odd inputs
(docs/reliability.md): jax_enable_x64, meshes from `jax.make_mesh`, NaN in expert weights,
array-likes and numpy inputs, and error messages that name the user's argument.

Tests that need x64 enable it for their own body only (`jax.enable_x64` is a context manager
in jax 0.11.2 and part of jit's cache key), so the rest of the suite keeps 32-bit defaults.
"""

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moe_pallas import moe_experts, ragged_dot, tgmm
from moe_pallas.reference import moe_experts_reference
from tests.helpers import make_params, random_routing

F32, F64, I32 = jnp.float32, jnp.float64, jnp.int32


def rel_err(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert np.isfinite(got).all()
    return np.linalg.norm(got - want) / np.linalg.norm(want)


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield
    assert not jax.config.jax_enable_x64


# --- jax_enable_x64 ----------------------------------------------------------------------------


@pytest.mark.parametrize("impl", ["pallas_triton", "xla"])
def test_ops_and_grads_under_x64_with_float32_operands(x64, impl):
    """float32 operands and int32 group sizes under x64: the kernels' index arithmetic stays
    int32 (a Python int next to an int32 value would be int64 there)."""
    rng = np.random.default_rng()
    lhs = jnp.asarray(rng.standard_normal((20, 16)), F32)
    rhs = jnp.asarray(rng.standard_normal((3, 16, 24)), F32)
    rows = jnp.asarray(rng.standard_normal((20, 24)), F32)
    sizes = jnp.asarray([7, 0, 11], I32)
    lhs64, rhs64, rows64 = (np.asarray(a, np.float64) for a in (lhs, rhs, rows))
    ends = np.cumsum([0, 7, 0, 11])
    want_dot = np.zeros((20, 24))
    want_tgmm = np.zeros((3, 16, 24))
    for g in range(3):
        r = slice(ends[g], ends[g + 1])
        want_dot[r] = lhs64[r] @ rhs64[g]
        want_tgmm[g] = lhs64[r].T @ rows64[r]
    # float32 dots run in TF32 on a GPU's tensor cores (unit roundoff 2^-11); exact on CPU.
    tol = 5e-3 if jax.default_backend() == "gpu" and impl != "xla" else 1e-5
    dot = lambda a, b: ragged_dot(a, b, sizes, implementation=impl)
    got_dot = jax.jit(dot)(lhs, rhs)
    assert got_dot.dtype == F32 and rel_err(got_dot, want_dot) < tol
    got_tgmm = jax.jit(lambda a, r: tgmm(a, r, sizes, implementation=impl))(lhs, rows)
    assert got_tgmm.dtype == F32 and rel_err(got_tgmm, want_tgmm) < tol
    d_lhs, d_rhs = jax.jit(jax.grad(lambda a, b: jnp.sum(dot(a, b) * rows), (0, 1)))(lhs, rhs)
    assert rel_err(d_rhs, want_tgmm) < tol
    d_lhs_t, d_rows = jax.jit(
        jax.grad(lambda a, r: jnp.sum(tgmm(a, r, sizes, implementation=impl) * rhs), (0, 1))
    )(lhs, rows)
    assert d_lhs.shape == d_lhs_t.shape == lhs.shape and d_rows.shape == rows.shape


@pytest.mark.parametrize("impl, activation", [("pallas_triton", "gptoss"), ("xla", "swiglu")])
def test_moe_experts_under_x64_with_float32_inputs(x64, impl, activation):
    rng = np.random.default_rng()
    tokens, hidden, inter, experts, top_k = 12, 16, 24, 4, 2
    params = make_params(rng, experts, hidden, inter, biases=activation == "gptoss")
    params = {k: jnp.asarray(v) for k, v in params.items()}
    idx, w = (jnp.asarray(a) for a in random_routing(rng, tokens, experts, top_k))
    x = jnp.asarray(rng.standard_normal((tokens, hidden)), F32)
    cot = jnp.asarray(rng.standard_normal((tokens, hidden)), F32)
    f = lambda x, w, p: moe_experts(x, idx, w, p, activation=activation, implementation=impl)
    ref = lambda x, w, p: moe_experts_reference(x, idx, w, p, activation=activation, dtype=F64)

    @jax.jit(static_argnums=0)  # one program each (eagerly, every op compiled on its own)
    def out_and_grads(fn, args, cot):
        out, vjp = jax.vjp(fn, *args)
        return out, vjp(cot)

    out, got_grads = out_and_grads(f, (x, w, params), cot)
    want, want_grads = out_and_grads(
        ref, jax.tree.map(lambda a: a.astype(F64), (x, w, params)), cot.astype(F64)
    )
    tf32 = jax.default_backend() == "gpu" and impl != "xla"  # TF32 tensor-core dots on a GPU
    assert out.dtype == F32 and rel_err(out, want) < (5e-3 if tf32 else 1e-4)
    for got, want in zip(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads)):
        assert got.dtype == F32 and rel_err(got, want) < (1e-2 if tf32 else 1e-3)


def test_mosaic_gpu_kernels_under_x64(x64):
    """The Mosaic GPU gmm and tgmm (interpret mode) on bf16 with int32 sizes under x64."""
    from moe_pallas.kernels import gmm_mgpu, tgmm_mgpu

    rng = np.random.default_rng()
    lhs = jnp.asarray(rng.standard_normal((64, 64)), jnp.bfloat16)
    rhs = jnp.asarray(rng.standard_normal((2, 64, 64)) / 8, jnp.bfloat16)
    sizes = jnp.asarray([20, 44], I32)
    a, b = np.asarray(lhs, np.float64), np.asarray(rhs, np.float64)
    want = np.concatenate([a[:20] @ b[0], a[20:] @ b[1]])
    assert rel_err(gmm_mgpu.gmm(lhs, rhs, sizes, out_dtype=F32), want) < 1e-5
    want_t = np.stack([a[:20].T @ a[:20], a[20:].T @ a[20:]])
    assert rel_err(tgmm_mgpu.tgmm(lhs, lhs, sizes, out_dtype=F32), want_t) < 1e-5


def test_float64_under_x64_runs_on_xla_and_is_refused_by_the_kernels(x64):
    rng = np.random.default_rng()
    lhs = jnp.asarray(rng.standard_normal((10, 8)), F64)
    rhs = jnp.asarray(rng.standard_normal((2, 8, 4)), F64)
    sizes = jnp.asarray([4, 6], I32)
    out = ragged_dot(lhs, rhs, sizes, implementation="xla")
    want = np.concatenate([np.asarray(lhs[:4]) @ np.asarray(rhs[0]), np.asarray(lhs[4:]) @ rhs[1]])
    assert out.dtype == F64 and rel_err(out, want) < 1e-12
    for impl in ("pallas_triton", "mosaic_gpu"):
        with pytest.raises(TypeError, match="lhs is float64.*implementation='xla'"):
            ragged_dot(lhs, rhs, sizes, implementation=impl)
        with pytest.raises(TypeError, match="lhs is float64"):
            tgmm(lhs, lhs, sizes, implementation=impl)
    params = {k: jnp.asarray(v, F64) for k, v in make_params(rng, 2, 8, 4, biases=False).items()}
    idx, w = (jnp.asarray(a) for a in random_routing(rng, 10, 2, 1))
    out = moe_experts(lhs, idx, w, params, activation="swiglu", implementation="xla")
    want = moe_experts_reference(lhs, idx, w, params, activation="swiglu", dtype=F64)
    assert out.dtype == F64 and rel_err(out, want) < 1e-12
    with pytest.raises(TypeError, match="x is float64"):
        moe_experts(lhs, idx, w, params, activation="swiglu", implementation="pallas_triton")


# --- meshes from jax.make_mesh -----------------------------------------------------------------

MAKE_MESH_CASE = """
import os
# the device count added to the flags the test inherits (tests/conftest.py's on CPU)
flags = os.environ.get("XLA_FLAGS", "")
os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count=2"
os.environ["JAX_PLATFORMS"] = "cpu"  # two host devices, also on a machine with one GPU
import jax, jax.numpy as jnp, numpy as np
import moe_pallas
from moe_pallas.reference import moe_experts_reference
rng = np.random.default_rng()
x = jnp.asarray(rng.standard_normal((6, 16)), jnp.float32)
idx = jnp.asarray(rng.integers(0, 4, (6, 2)), jnp.int32)
w = jnp.asarray(rng.random((6, 2)) + 0.1, jnp.float32)
p = {"w_gate_up": jnp.asarray(rng.standard_normal((4, 16, 32)) / 4, jnp.float32),
     "w_down": jnp.asarray(rng.standard_normal((4, 16, 16)) / 4, jnp.float32)}
mesh = jax.make_mesh((2,), ("expert",))
assert mesh.axis_types == (jax.sharding.AxisType.Explicit,)
loss = lambda x, w, p: jnp.sum(moe_pallas.moe_experts(
    x, idx, w, p, activation="swiglu", implementation="xla", mesh=mesh) ** 2)
with jax.enable_x64(True):
    ref = lambda x, w, p: jnp.sum(moe_experts_reference(
        x, idx, w, p, activation="swiglu", dtype=jnp.float64) ** 2)
    args64 = jax.tree.map(lambda a: a.astype(jnp.float64), (x, w, p))
    want = jax.jit(jax.grad(ref, (0, 1, 2)))(*args64)  # the oracle jitted, the tested call not
    want = jax.tree.map(np.asarray, want)
got = jax.grad(loss, (0, 1, 2))(x, w, p)  # outside jit and outside any mesh context
errs = [np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want))]
print("ERRS", max(errs))
"""


def test_grad_with_a_make_mesh_mesh_outside_jit():
    """`jax.make_mesh` gives Explicit axes in jax 0.11; moe_experts runs them as Auto outside a
    mesh context, so jax.grad works as with `moe_pallas.expert_mesh()` (2 CPU devices, in a
    subprocess: the device count is fixed when jax starts)."""
    run = subprocess.run(
        [sys.executable, "-c", MAKE_MESH_CASE],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    err = float(run.stdout.split("ERRS")[-1])
    assert err < 1e-4, err


# --- memory of the layer's construction --------------------------------------------------------


def _layer_init(experts, hidden, inter):
    from flax import nnx

    from moe_pallas import MoE

    def init(key):
        layer = MoE(
            hidden,
            inter,
            experts,
            4,
            activation="gptoss",
            param_dtype=jnp.bfloat16,
            rngs=nnx.Rngs(key),
        )
        return nnx.state(layer)

    return init


def test_layer_construction_peak_memory_is_about_the_parameters():
    """The expert weights are drawn one expert at a time: XLA's planned temporaries plus outputs
    of the jitted constructor stay within 1.5x the parameter bytes (drawing [E, H, 2I] at once
    in float32 needed 7.7x here, 8x at gpt-oss size)."""
    init = _layer_init(32, 256, 256)
    key = jax.random.key(0)
    param_bytes = sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(jax.eval_shape(init, key)))
    memory = jax.jit(init).lower(key).compile().memory_analysis()
    used = memory.temp_size_in_bytes + memory.output_size_in_bytes
    assert used <= 1.5 * param_bytes, (used, param_bytes)


def test_expert_weights_keep_the_fan_in_truncated_normal_law():
    """Per expert: truncated normal on ±2 sigma, variance 1 / fan_in (fan_in = H for w_gate_up,
    I for w_down), each expert drawn from its own key, drawn in float32 and rounded to bf16.
    Bounds in standard errors of the mean (sigma * 0.88 / sqrt(n), n >= 2**20 values): 0.006
    sigma is over 6 of them, and drawing in bf16 would put the mean at -0.018 sigma."""
    state = _layer_init(8, 512, 256)(jax.random.key(int(np.random.default_rng().integers(2**31))))
    for name, fan_in in (("w_gate_up", 512), ("w_down", 256)):
        w = np.asarray(state[name][...], np.float64)
        sigma = np.sqrt(1 / fan_in)
        assert abs(w.std() / sigma - 1) < 0.01, (name, w.std())
        assert np.abs(w).max() <= 2 * sigma / 0.87962566103423978 * 1.01
        assert abs(w.mean()) < 0.006 * sigma, (name, w.mean() / sigma)
        assert len(np.unique(w[0])) > 1000, name  # not 128 values from 8-bit uniforms
        assert not np.array_equal(w[0], w[1])  # distinct experts


# --- NaN in one expert's weights ---------------------------------------------------------------


@pytest.mark.parametrize("impl", ["xla", "pallas_triton"])
def test_nan_expert_weight_reaches_exactly_that_experts_tokens(impl):
    """NaN in w_gate_up[3]: exactly the tokens routed to expert 3 are NaN, the others bitwise
    unchanged. (An Inf there may legitimately give finite outputs: gpt-oss clamps h at 7.)"""
    rng = np.random.default_rng()
    tokens, experts = 10, 5
    params = make_params(rng, experts, 16, 16, biases=True)
    params = {k: jnp.asarray(v) for k, v in params.items()}
    idx, w = random_routing(rng, tokens, experts, 2)
    idx[:3, 0] = 3  # at least three tokens use expert 3, and some do not
    idx[3:, :] = np.where(idx[3:] == 3, 4, idx[3:])
    idx[3:, 1] = np.where(idx[3:, 0] == 4, 0, idx[3:, 1])
    idx[:3, 1] = np.where(idx[:3, 1] == 3, 1, idx[:3, 1])
    routed_to_3 = (idx == 3).any(axis=1)
    assert 0 < routed_to_3.sum() < tokens
    x = jnp.asarray(rng.standard_normal((tokens, 16)), F32)
    bad_params = dict(params, w_gate_up=params["w_gate_up"].at[3, 5, 7].set(jnp.nan))
    f = jax.jit(
        lambda p: moe_experts(
            x, jnp.asarray(idx), jnp.asarray(w), p, activation="gptoss", implementation=impl
        )
    )
    clean, out = np.asarray(f(params)), np.asarray(f(bad_params))
    assert not np.isfinite(out[routed_to_3]).all(axis=1).any()  # every such token sees it
    np.testing.assert_array_equal(out[~routed_to_3], clean[~routed_to_3])


# --- error messages ----------------------------------------------------------------------------


def test_layer_names_the_dtype_and_the_users_shape():
    from flax import nnx

    from moe_pallas import MoE

    layer = MoE(8, 16, 4, 2, activation="swiglu", rngs=nnx.Rngs(0))
    with pytest.raises(TypeError, match=r"x must be floating.*got int32\[2, 3, 8\]") as info:
        layer(jnp.zeros((2, 3, 8), I32))
    assert "[6, 8]" not in str(info.value) and "reshape" not in str(info.value)


def test_all_numpy_float64_inputs_follow_one_rule():
    """numpy x and params both become jax arrays by jnp.asarray: float32 without x64."""
    rng = np.random.default_rng()
    params = make_params(rng, 4, 16, 16, biases=True, dtype=np.float64)
    idx, w = random_routing(rng, 6, 4, 2)
    x = rng.standard_normal((6, 16))
    out = moe_experts(
        x, idx, w.astype(np.float64), params, activation="swiglu", implementation="xla"
    )
    want = moe_experts_reference(x, idx, w, params, activation="swiglu", dtype=F32)
    assert out.dtype == F32 and rel_err(out, want) < 1e-5


@pytest.mark.parametrize("impl", ["xla", "pallas_triton"])
def test_ops_take_array_likes(impl):
    """Lists and numpy arrays, as jnp.asarray takes them (jax.lax.ragged_dot takes numpy only)."""
    rng = np.random.default_rng()
    lhs, rhs = rng.standard_normal((18, 8)), rng.standard_normal((4, 8, 4))
    got = ragged_dot(lhs.tolist(), rhs, [5, 0, 9, 4], implementation=impl)
    ends = np.cumsum([0, 5, 0, 9, 4])
    want = np.concatenate([lhs[ends[g] : ends[g + 1]] @ rhs[g] for g in range(4)])
    assert rel_err(got, want) < 1e-5
    got_t = tgmm(lhs, lhs[:, :4], [5, 0, 9, 4], implementation=impl)
    assert rel_err(got_t[2], lhs[5:14].T @ lhs[5:14, :4]) < 1e-5


def test_debug_checks_raise_the_value_error_under_jit():
    import moe_pallas

    lhs, rhs = jnp.ones((18, 4), F32), jnp.ones((4, 4, 2), F32)
    f = jax.jit(lambda g: ragged_dot(lhs, rhs, g, implementation="xla"))
    with (
        pytest.raises(ValueError, match="group_sizes has negative entries") as info,
        moe_pallas.debug_checks(),
    ):
        jax.block_until_ready(f(jnp.asarray([-3, 9, 4, 2], I32)))
    assert isinstance(info.value.__cause__, jax.errors.JaxRuntimeError)
    with moe_pallas.debug_checks():  # a valid call inside the context still runs
        jax.block_until_ready(f(jnp.asarray([3, 9, 4, 2], I32)))
