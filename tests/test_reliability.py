"""Bad input, limits and memory shape of the public ops (docs/reliability.md states the contracts).

Covered: wrong shapes and dtypes (named in the error), int32 size limits (checked at trace time,
with `jax.eval_shape`: nothing is allocated), out-of-range expert ids, negative or wrong-sum group
sizes, NaN/Inf propagation, T = 0, run-time checks under `debug_checks()`, and the jaxpr of
`moe_experts` holding no O(T·k·E) intermediate or per-row copy of expert weights.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import moe_pallas
from moe_pallas import moe_experts, ragged_dot, tgmm
from moe_pallas.kernels import gmm
from moe_pallas.kernels._common import clamp_group_sizes

IMPLS = ["pallas_triton", "xla"]
SDS = jax.ShapeDtypeStruct


def _params(rng, experts, hidden, inter, *, biases, dtype=np.float32):
    p = {
        "w_gate_up": rng.standard_normal((experts, hidden, 2 * inter)) / np.sqrt(hidden),
        "w_down": rng.standard_normal((experts, inter, hidden)) / np.sqrt(inter),
    }
    if biases:
        p |= {
            "b_gate_up": rng.standard_normal((experts, 2 * inter)),
            "b_down": rng.standard_normal((experts, hidden)),
        }
    return {k: jnp.asarray(v, dtype) for k, v in p.items()}


def _case(rng, tokens=6, hidden=16, inter=16, experts=4, top_k=2, biases=True):
    x = jnp.asarray(rng.standard_normal((tokens, hidden)), jnp.float32)
    idx = jnp.asarray(rng.integers(0, experts - 1, (tokens, top_k)), jnp.int32)  # last one unused
    w = jnp.asarray(rng.random((tokens, top_k)) + 0.1, jnp.float32)
    return x, idx, w, _params(rng, experts, hidden, inter, biases=biases)


def _experts(impl, activation="gptoss"):
    return lambda x, i, w, p: moe_experts(x, i, w, p, activation=activation, implementation=impl)


# --- wrong shapes and dtypes -------------------------------------------------------------------

F32, BF16, I32 = jnp.float32, jnp.bfloat16, jnp.int32
BAD_CALLS = [  # (op, args, error type, message fragment naming the argument)
    (
        ragged_dot,
        (SDS((8, 4), F32), SDS((2, 5, 3), F32), SDS((2,), I32)),
        ValueError,
        "disagree on K",
    ),
    (
        ragged_dot,
        (SDS((8, 4, 1), F32), SDS((2, 4, 3), F32), SDS((2,), I32)),
        ValueError,
        "lhs must",
    ),
    (ragged_dot, (SDS((8, 4), F32), SDS((4, 3), F32), SDS((2,), I32)), ValueError, "rhs must"),
    (
        ragged_dot,
        (SDS((8, 4), F32), SDS((2, 4, 3), F32), SDS((3,), I32)),
        ValueError,
        "group_sizes",
    ),
    (ragged_dot, (SDS((8, 4), F32), SDS((2, 4, 3), F32), SDS((2,), F32)), TypeError, "group_sizes"),
    (ragged_dot, (SDS((8, 4), I32), SDS((2, 4, 3), F32), SDS((2,), I32)), TypeError, "lhs"),
    (tgmm, (SDS((8, 4), F32), SDS((7, 3), F32), SDS((2,), I32)), ValueError, "same rows"),
    (tgmm, (SDS((8, 4), F32), SDS((8, 3), F32), SDS((2, 1), I32)), ValueError, "group_sizes"),
    (tgmm, (SDS((8, 4), F32), SDS((8, 3), I32), SDS((2,), I32)), TypeError, "rhs"),
]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("op, args, error, match", BAD_CALLS)
def test_bad_op_arguments_raise_naming_the_argument(op, args, error, match, impl):
    with pytest.raises(error, match=match):
        jax.eval_shape(lambda *a: op(*a, implementation=impl), *args)


def _experts_args(**override):
    args = {
        "x": SDS((6, 16), F32),
        "topk_idx": SDS((6, 2), I32),
        "topk_weight": SDS((6, 2), F32),
        "w_gate_up": SDS((4, 16, 32), F32),
        "w_down": SDS((4, 16, 16), F32),
        "b_gate_up": SDS((4, 32), F32),
        "b_down": SDS((4, 16), F32),
    }
    return args | override


BAD_EXPERTS = [  # (overrides, error type, message fragment)
    ({"x": SDS((6, 17), F32)}, ValueError, "H="),
    ({"x": SDS((6, 16), I32)}, TypeError, "x must"),
    ({"x": SDS((6, 16), BF16)}, TypeError, "w_gate_up"),  # params not in x's dtype
    ({"topk_idx": SDS((6, 2), F32)}, TypeError, "topk_idx"),
    ({"topk_idx": SDS((5, 2), I32), "topk_weight": SDS((5, 2), F32)}, ValueError, "tokens"),
    ({"topk_weight": SDS((6, 3), F32)}, TypeError, "topk_weight"),
    ({"w_down": SDS((4, 15, 16), F32)}, ValueError, "w_down"),
    ({"w_gate_up": SDS((4, 16, 31), F32)}, ValueError, "odd"),
    ({"b_gate_up": SDS((4, 31), F32)}, ValueError, "b_gate_up"),
    ({"b_down": SDS((3, 16), F32)}, ValueError, "b_down"),
]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("override, error, match", BAD_EXPERTS)
def test_bad_moe_experts_arguments_raise(override, error, match, impl):
    a = _experts_args(**override)
    params = {k: a[k] for k in ("w_gate_up", "w_down", "b_gate_up", "b_down")}
    with pytest.raises(error, match=match):
        jax.eval_shape(_experts(impl), a["x"], a["topk_idx"], a["topk_weight"], params)


# --- int32 limits ------------------------------------------------------------------------------


def test_ragged_dot_allows_2_pow_31_elements_and_refuses_2_pow_31_rows():
    """Arrays of 2^31 and more elements trace (Pallas addresses them with int64 offsets past
    4 GiB; the SwiGLU weights [256, 4096, 4096] have exactly 2^31); a dimension of 2^31 rows is
    past the kernels' int32 row ids and is refused before anything launches."""
    group_sizes = SDS((8,), I32)
    pallas_dot = lambda a, b, g: ragged_dot(a, b, g, implementation="pallas_triton")
    rows = 2**31 // 4096
    ok = jax.eval_shape(pallas_dot, SDS((rows, 64), BF16), SDS((8, 64, 4097), BF16), group_sizes)
    assert ok.shape == (rows, 4097)
    swiglu_w = SDS((256, 4096, 4096), BF16)
    assert jax.eval_shape(pallas_dot, SDS((64, 4096), BF16), swiglu_w, SDS((256,), I32)).shape == (
        64,
        4096,
    )
    with pytest.raises(ValueError, match="2\\^31"):
        jax.eval_shape(pallas_dot, SDS((2**31, 16), BF16), SDS((8, 16, 16), BF16), group_sizes)
    with pytest.raises(ValueError, match="2\\^31"):
        jax.eval_shape(
            lambda a, b, g: tgmm(a, b, g, implementation="pallas_triton"),
            SDS((2**31, 16), BF16),
            SDS((2**31, 16), BF16),
            group_sizes,
        )


def test_moe_experts_refuses_2_pow_31_pairs_only():
    # gpt-oss under jax.grad: the residual h [T*k, 2I = 5760] passes 2^31 elements at T = 93207
    # tokens (k = 4); it traces (int64 offsets past 4 GiB).
    e, h, i, k = 128, 2880, 2880, 4
    params = {"w_gate_up": SDS((e, h, 2 * i), BF16), "w_down": SDS((e, i, h), BF16)}
    tokens = 93207
    x, idx, w = SDS((tokens, h), BF16), SDS((tokens, k), I32), SDS((tokens, k), F32)
    f = lambda x, i, w, p: jnp.sum(_experts("pallas_triton")(x, i, w, p).astype(F32))
    jax.eval_shape(jax.grad(f, argnums=(0, 2, 3)), x, idx, w, params)
    # T*k itself past int32 (the row numbering of the dispatch), any backend.
    huge = (SDS((2**29, 8), BF16), SDS((2**29, 4), I32), SDS((2**29, 4), F32))
    small = {"w_gate_up": SDS((4, 8, 16), BF16), "w_down": SDS((4, 8, 8), BF16)}
    with pytest.raises(ValueError, match="T\\*k"):
        jax.eval_shape(_experts("xla", "swiglu"), *huge, small)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [32767, 32769])
def test_gmm_on_gpu_around_2_pow_31_elements(n):
    """Outputs of 2^31 - 65536 bf16 elements (int32 offsets near their top) and of 2^31 + 65536
    (int64 offsets): the first and last rows, where the offsets are smallest and largest, match
    numpy."""
    rows, k, g = 65536, 64, 4
    rng = np.random.default_rng()
    lhs = jnp.asarray(rng.standard_normal((rows, k)), BF16)
    rhs = jnp.asarray(rng.standard_normal((g, k, n)) / 8, BF16)
    sizes = jnp.asarray([rows // 4, rows // 2, 0, rows // 4], I32)
    out = gmm(lhs, rhs, sizes)
    tail = np.asarray(out[-16:], np.float64)
    want = np.asarray(lhs[-16:], np.float64) @ np.asarray(rhs[3], np.float64)
    assert np.linalg.norm(tail - want) / np.linalg.norm(want) < 1e-2
    head = np.asarray(out[:16], np.float64)
    want = np.asarray(lhs[:16], np.float64) @ np.asarray(rhs[0], np.float64)
    assert np.linalg.norm(head - want) / np.linalg.norm(want) < 1e-2


# --- out-of-range expert ids -------------------------------------------------------------------


@pytest.mark.parametrize("impl", IMPLS)
def test_out_of_range_ids_contribute_zero(impl):
    rng = np.random.default_rng()
    x, idx, w, p = _case(rng)
    bad = idx.at[0, 0].set(-1).at[2, 1].set(4).at[5, 0].set(2**30)
    masked_w = w.at[0, 0].set(0).at[2, 1].set(0).at[5, 0].set(0)
    got = jax.jit(_experts(impl))(x, bad, w, p)
    want = jax.jit(_experts(impl))(x, idx, masked_w, p)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    grads = jax.jit(jax.grad(lambda w: jnp.sum(_experts(impl)(x, bad, w, p))))(w)
    assert grads[0, 0] == grads[2, 1] == grads[5, 0] == 0


def test_debug_checks_raise_on_the_pallas_path():
    rng = np.random.default_rng()
    x, idx, w, p = _case(rng)
    with moe_pallas.debug_checks():
        f = jax.jit(_experts("pallas_triton"))
        with pytest.raises(Exception, match="outside \\[0, 4\\)"):
            jax.block_until_ready(f(x, idx.at[1, 1].set(9), w, p))
        with pytest.raises(Exception, match="topk_weight holds NaN"):
            jax.block_until_ready(f(x, idx, w.at[0, 0].set(jnp.inf), p))
        jax.block_until_ready(f(x, idx, w, p))  # valid input passes


# --- group sizes of ragged_dot / tgmm ----------------------------------------------------------

BAD_SIZES = {
    "negative": [-3, 9, 4, 2],
    "over": [5, 0, 9, 20],
    "int_max": [2**31 - 1, 2**31 - 1, 3, 0],
}


def _clamped(sizes, rows):
    """The documented meaning of invalid sizes: negatives count as 0, the sum is cut at rows."""
    ends = np.minimum(np.cumsum(np.maximum(np.asarray(sizes, np.int64), 0)), rows)
    return np.diff(ends, prepend=0)


@pytest.mark.parametrize("rows", [18, 2**30])
@pytest.mark.parametrize("kind", sorted(BAD_SIZES))
def test_clamp_group_sizes_both_paths(kind, rows):
    """Plain cumsum while groups x rows fits int32, the overflow-free saturating scan past it."""
    got = clamp_group_sizes(jnp.asarray(BAD_SIZES[kind], I32), rows)
    np.testing.assert_array_equal(np.asarray(got), _clamped(BAD_SIZES[kind], rows))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("kind", sorted(BAD_SIZES))
def test_invalid_group_sizes_are_clamped_consistently(kind, impl):
    rng = np.random.default_rng()
    lhs = jnp.asarray(rng.standard_normal((18, 16)), F32)
    rhs = jnp.asarray(rng.standard_normal((4, 16, 8)), F32)
    sizes = jnp.asarray(BAD_SIZES[kind], I32)
    want_sizes = jnp.asarray(_clamped(BAD_SIZES[kind], 18), I32)
    got = jax.jit(lambda a, b, g: ragged_dot(a, b, g, implementation=impl))(lhs, rhs, sizes)
    want = ragged_dot(lhs, rhs, want_sizes, implementation="xla")
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    rhs2 = jnp.asarray(rng.standard_normal((18, 8)), F32)
    got = tgmm(lhs, rhs2, sizes, implementation=impl)
    want = tgmm(lhs, rhs2, want_sizes, implementation="xla")
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["ragged_dot", "tgmm"])
def test_debug_checks_raise_on_invalid_group_sizes(op):
    lhs = jnp.ones((18, 16), F32)
    if op == "ragged_dot":
        f = lambda g: ragged_dot(lhs, jnp.ones((4, 16, 8), F32), g, implementation="pallas_triton")
    else:
        f = lambda g: tgmm(lhs, jnp.ones((18, 8), F32), g, implementation="pallas_triton")
    with moe_pallas.debug_checks():
        checked = jax.jit(f)
        for sizes, match in (([-3, 9, 4, 2], "negative"), ([5, 0, 9, 20], "sums to 34 > 18")):
            with pytest.raises(Exception, match=match):
                jax.block_until_ready(checked(jnp.asarray(sizes, I32)))
        jax.block_until_ready(checked(jnp.asarray([5, 0, 9, 2], I32)))  # sum < M is valid


# --- NaN / Inf ---------------------------------------------------------------------------------


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nonfinite_token_stays_in_its_row(impl, bad):
    """A NaN/Inf in x[t] makes out[t] non-finite and leaves every other token's output exact."""
    rng = np.random.default_rng()
    x, idx, w, p = _case(rng)
    f = jax.jit(_experts(impl))
    clean = np.asarray(f(x, idx, w, p))
    out = np.asarray(f(x.at[3, 5].set(bad), idx, w, p))
    assert not np.isfinite(out[3]).all()
    others = np.arange(6) != 3
    np.testing.assert_array_equal(out[others], clean[others])


@pytest.mark.parametrize("impl", IMPLS)
def test_nonfinite_weights_of_an_unused_expert_do_not_leak(impl):
    """NaN/Inf in the weights of an expert no token visits change nothing, forward or backward."""
    rng = np.random.default_rng()
    x, idx, w, p = _case(rng)  # expert 3 is never routed to
    bad = dict(
        p,
        w_down=p["w_down"].at[3, 0, 0].set(jnp.nan),
        b_gate_up=p["b_gate_up"].at[3, 1].set(jnp.inf),
    )

    @jax.jit  # one program for both (eagerly, every op compiled on its own, twice)
    def run(params):
        f = lambda x, w, p: _experts(impl)(x, idx, w, p)
        out, vjp = jax.vjp(f, x, w, params)
        return out, vjp(jnp.ones_like(out))

    (out, (dx, dw, dp)), (out_bad, (dx_bad, dw_bad, dp_bad)) = run(p), run(bad)
    np.testing.assert_array_equal(np.asarray(out_bad), np.asarray(out))
    np.testing.assert_array_equal(np.asarray(dx_bad), np.asarray(dx))
    np.testing.assert_array_equal(np.asarray(dw_bad), np.asarray(dw))
    for name in p:  # the used experts' gradients are untouched
        np.testing.assert_array_equal(np.asarray(dp_bad[name][:3]), np.asarray(dp[name][:3]))


@pytest.mark.parametrize("impl", IMPLS)
def test_nan_cotangent_stays_in_the_experts_of_its_token(impl):
    rng = np.random.default_rng()
    x, idx, w, p = _case(rng)
    idx = idx.at[1].set(jnp.asarray([0, 1]))

    @jax.jit
    def params_grads(x, w, p):
        out, vjp = jax.vjp(lambda x, w, p: _experts(impl)(x, idx, w, p), x, w, p)
        return vjp(jnp.ones_like(out).at[1, 0].set(jnp.nan))[2]

    d_params = params_grads(x, w, p)
    untouched = np.setdiff1d(np.arange(4), np.asarray(idx[1]))  # experts token 1 never visits
    for name, grad in d_params.items():
        assert np.isfinite(np.asarray(grad)[untouched]).all(), name


# --- T = 0 -------------------------------------------------------------------------------------


@pytest.mark.parametrize("impl", IMPLS)
def test_zero_tokens(impl):
    rng = np.random.default_rng()
    x, idx, w, p = _case(rng, tokens=0)
    out, vjp = jax.vjp(lambda x, w, p: _experts(impl)(x, idx, w, p), x, w, p)
    assert out.shape == (0, 16)
    dx, dw, dp = vjp(out)
    assert dx.shape == (0, 16) and dw.shape == (0, 2)
    assert all(not np.asarray(g).any() for g in dp.values())
    empty = ragged_dot(jnp.zeros((0, 16)), p["w_down"], jnp.zeros((4,), I32), implementation=impl)
    assert empty.shape == (0, 16)
    weight_grad = tgmm(
        jnp.zeros((0, 16)), jnp.zeros((0, 8)), jnp.zeros((4,), I32), implementation=impl
    )
    assert weight_grad.shape == (4, 16, 8) and not np.asarray(weight_grad).any()


# --- memory: no O(T·k·E) intermediate, no per-row weight copies --------------------------------

# Sizes chosen so that every product of interest is distinguishable: M = T·k = 15 rows.
T, K, E, H, I = 5, 3, 7, 11, 13
M = T * K


def _avals(jaxpr):
    """Output avals of every equation, recursing into sub-jaxprs (pallas kernels excluded: their
    blocks live in registers and shared memory, not in device memory)."""
    for eqn in jaxpr.eqns:
        yield eqn.primitive.name, [v.aval for v in eqn.outvars]
        if eqn.primitive.name == "pallas_call":
            continue
        for param in eqn.params.values():
            for sub in param if isinstance(param, (list, tuple)) else [param]:
                sub = getattr(sub, "jaxpr", sub)  # ClosedJaxpr -> Jaxpr
                if hasattr(sub, "eqns"):
                    yield from _avals(sub)


def _offending(aval):
    shape = getattr(aval, "shape", ())
    per_row_expert = M in shape and E in shape  # [T·k, E], [E, T·k, ·]: one-hots, dense masks
    # [T·k, H, 2I], [T·k, I, H]: gathered expert weights (not the [T·k, I, 2] gate/up pairs the
    # gpt-oss backward interleaves)
    weight_dims = {H, I, 2 * I}
    per_row_weights = len(shape) >= 3 and shape[0] == M and set(shape[1:3]) <= weight_dims
    return per_row_expert or per_row_weights


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("activation", ["swiglu", "gptoss"])
@pytest.mark.parametrize("impl", IMPLS)
def test_no_tkE_or_per_row_weight_intermediates(impl, activation, grad):
    rng = np.random.default_rng(0)
    x, idx, w, p = _case(
        rng, tokens=T, hidden=H, inter=I, experts=E, top_k=K, biases=activation == "gptoss"
    )
    f = _experts(impl, activation)
    if grad:
        f = jax.grad(
            lambda x, i, w, p: jnp.sum(_experts(impl, activation)(x, i, w, p)), argnums=(0, 2, 3)
        )
    jaxpr = jax.make_jaxpr(f)(x, idx, w, p).jaxpr
    bad = [(prim, a.shape) for prim, avals in _avals(jaxpr) for a in avals if _offending(a)]
    assert not bad, bad
