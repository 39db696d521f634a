"""Compiled (Triton) kernels at the workloads' awkward sizes: K = 2880 = 45·64, N = 5760, tails."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import moe_pallas
from moe_pallas.dispatch import dispatch
from moe_pallas.kernels import gmm, tgmm
from tests.test_kernels_gmm import gmm64, group_bounds, rel_err, tgmm64

pytestmark = pytest.mark.gpu


def _routed(t, k, e, k_dim, n_dim, seed):
    rng = np.random.default_rng(seed)
    d = dispatch(jnp.asarray(rng.integers(0, e, (t, k)), jnp.int32), e)
    x = jnp.asarray(rng.standard_normal((t, k_dim)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((e, k_dim, n_dim)) * k_dim**-0.5, jnp.bfloat16)
    return rng, d, x, w


@pytest.mark.parametrize("t", [1, 64])
def test_gptoss_gate_up_epilogue(t):
    rng, d, x, w = _routed(t, 4, 8, 2880, 5760, seed=t)
    bias = jnp.asarray(rng.standard_normal((8, 5760)), jnp.bfloat16)
    scale = jnp.asarray(rng.random(t * 4), jnp.float32)
    out = gmm(
        x,
        w,
        d.group_sizes,
        lhs_row_index=d.row_token,
        bias=bias,
        activation="gptoss",
        row_scale=scale,
    )
    ref = gmm64(
        x,
        w,
        d.group_sizes,
        lhs_row_index=d.row_token,
        bias=bias,
        activation="gptoss",
        row_scale=scale,
    )
    assert rel_err(out, ref) < 1e-2


def test_swiglu_gate_up_and_down():
    rng, d, x, w = _routed(200, 8, 16, 512, 2 * 384, seed=3)
    h = gmm(x, w, d.group_sizes, lhs_row_index=d.row_token, activation="swiglu")
    assert (
        rel_err(h, gmm64(x, w, d.group_sizes, lhs_row_index=d.row_token, activation="swiglu"))
        < 1e-2
    )
    w_down = jnp.asarray(rng.standard_normal((16, 384, 512)) / 20, jnp.bfloat16)
    y = gmm(h, w_down, d.group_sizes, out_dtype=jnp.float32)
    assert rel_err(y, gmm64(h, w_down, d.group_sizes)) < 1e-2


def test_transposed_and_tgmm_with_empty_groups():
    rng = np.random.default_rng(4)
    m, k_dim, n_dim = 1000, 2880, 5760
    sizes = np.array([300, 0, 0, 450, 1, 0, 200, 0], np.int32)  # 49 tail rows
    dy = jnp.asarray(rng.standard_normal((m, n_dim)), jnp.bfloat16)
    x = jnp.asarray(rng.standard_normal((m, k_dim)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((8, k_dim, n_dim)) / 50, jnp.bfloat16)
    dx = gmm(dy, w, jnp.asarray(sizes), transpose_rhs=True)
    assert rel_err(dx, gmm64(dy, np.swapaxes(np.asarray(w, np.float32), 1, 2), sizes)) < 1e-2
    assert not np.asarray(dx[sizes.sum() :]).any()
    dw = tgmm(x, dy, jnp.asarray(sizes), out_dtype=jnp.float32)
    assert rel_err(dw, tgmm64(x, dy, sizes)) < 1e-2
    assert not np.asarray(dw[sizes == 0]).any()


def test_ragged_dot_grads_and_vmap_on_gpu():
    rng = np.random.default_rng(5)
    lhs = jnp.asarray(rng.standard_normal((300, 192)), jnp.float32)
    rhs = jnp.asarray(rng.standard_normal((6, 192, 320)) / 14, jnp.float32)
    sizes = jnp.asarray([50, 0, 120, 30, 0, 90], jnp.int32)
    d_out = jnp.asarray(rng.standard_normal((300, 320)), jnp.float32)

    def grads(impl):
        f = lambda a, b: jnp.sum(moe_pallas.ragged_dot(a, b, sizes, implementation=impl) * d_out)
        return jax.grad(f, argnums=(0, 1))(lhs, rhs)

    for got, want in zip(grads("pallas_triton"), grads("xla")):
        assert rel_err(got, np.asarray(want, np.float64)) < 3e-3  # tf32 dots
    out = jax.vmap(lambda a: moe_pallas.ragged_dot(a, rhs, sizes))(jnp.stack([lhs, -lhs]))
    assert rel_err(out[1], -gmm64(lhs, rhs, sizes)) < 3e-3


@pytest.mark.parametrize("n_dim, transpose_rhs", [(2880, False), (5760, False), (2880, True)])
def test_auto_table_shapes_match_triton(n_dim, transpose_rhs):
    """The gpt-oss shapes "auto" sends to Mosaic GPU on the H200 (the tuning table's mosaic_gpu
    entries: 512 rows per expert, K = 2880, bf16 out; at 2880 x 2880, plain and transposed, its
    ping-pong tiles): the same products as Triton's kernel, with the layer's bias and routing
    weight, and against the float64 oracle; a float32 output (Triton under "auto") too. Off Hopper
    every call runs Triton."""
    from moe_pallas import backends

    keys = jax.random.split(jax.random.key(11), 5)  # on the device: w has 2.1e9 entries
    d = dispatch(jax.random.randint(keys[0], (16384, 4), 0, 128, jnp.int32), 128)
    lhs = jax.random.normal(keys[1], (65536, 2880), jnp.bfloat16)
    w = (jax.random.normal(keys[2], (128, 2880, n_dim), jnp.float32) / 54).astype(jnp.bfloat16)
    bias = jax.random.normal(keys[3], (128, n_dim), jnp.bfloat16)
    row_scale = jax.random.uniform(keys[4], (65536,), jnp.float32, 0.5, 1.5)
    # The float64 oracle on the first 8 experts' rows (all of w in float64 would be 17 GB).
    sizes = np.asarray(d.group_sizes)[:8]
    rows = int(sizes.sum())
    ref = gmm64(
        lhs[:rows],
        w[:8],
        sizes,
        bias=bias[:8],
        row_scale=row_scale[:rows],
        transpose_rhs=transpose_rhs,
    )
    auto = backends.resolve("auto")
    for out_dtype in (jnp.bfloat16, jnp.float32):
        kwargs = {
            "bias": bias,
            "row_scale": row_scale,
            "out_dtype": out_dtype,
            "transpose_rhs": transpose_rhs,
        }
        got, want = (
            jax.jit(functools.partial(backends.gmm, b, **kwargs))(lhs, w, d.group_sizes)
            for b in (auto, "pallas_triton")
        )
        assert rel_err(got, np.asarray(want, np.float64)) < 1e-6
        assert rel_err(got[:rows], ref) < 1e-2


def check_tail_groups(variant, t, k, e, h):
    """Rows of groups that end in the tail path, from one call at the given size, against the
    float64 product of just those groups (weights drawn on the device: [E, H, 2H] in float64 on
    the host would be 17 GB at gpt-oss sizes)."""
    n = 2 * h if variant == "gptoss_glu" else h
    rng = np.random.default_rng(11)
    d = dispatch(jnp.asarray(rng.integers(0, e, (t, k)), jnp.int32), e)
    keys = jax.random.split(jax.random.key(11), 3)
    w = (jax.random.normal(keys[0], (e, h, n), jnp.float32) * h**-0.5).astype(jnp.bfloat16)
    sizes, m = np.asarray(d.group_sizes), t * k
    if variant == "gptoss_glu":
        lhs = jax.random.normal(keys[1], (t, h), jnp.bfloat16)
        kwargs = {
            "lhs_row_index": d.row_token,
            "activation": "gptoss",
            "bias": jnp.asarray(rng.standard_normal((e, n)), jnp.bfloat16),
            "row_scale": jnp.asarray(rng.random(m), jnp.float32),
        }
    else:
        lhs = jax.random.normal(keys[1], (m, h), jnp.bfloat16)
        if variant == "transposed":
            kwargs = {"transpose_rhs": True}
        else:
            kwargs = {"row_scale": jnp.asarray(rng.random(m), jnp.float32)}
    table = {"gptoss_glu": "gmm_glu", "transposed": "gmm_t"}.get(variant, "gmm")
    from moe_pallas.backends import pallas_triton

    config = pallas_triton.config(table, jnp.bfloat16, m, e, h, h, kwargs.get("activation"))
    tails = np.flatnonzero((sizes > config.block_m) & (sizes <= config.block_m + config.tail_m))
    assert config.tail_m and len(tails) >= 4, (config, sizes.max())
    run = lambda cfg: np.asarray(gmm(lhs, w, d.group_sizes, config=cfg, **kwargs))
    out = run(config)
    # Bit for bit the kernel without the tail path, twice: with a 16-row tail the plain gmm's
    # "small" config (bias-free, row-scaled, 256 columns) gave run-to-run different rows on the
    # H200 (kernels/gmm.py, Tails), so a wrong row must not slip by.
    assert np.array_equal(out, run(dataclasses.replace(config, tail_m=0)))
    assert np.array_equal(out, run(config))
    out = out.astype(np.float64)
    chosen = tails[:4]
    starts, _ = group_bounds(sizes, m)
    rows = np.concatenate([np.arange(starts[g], starts[g] + sizes[g]) for g in chosen])
    sub = {a: v for a, v in kwargs.items() if a in ("activation", "transpose_rhs")}
    if "bias" in kwargs:
        sub["bias"] = np.asarray(kwargs["bias"])[chosen]
    if "row_scale" in kwargs:
        sub["row_scale"] = np.asarray(kwargs["row_scale"])[rows]
    if "lhs_row_index" in kwargs:
        sub["lhs_row_index"] = np.asarray(kwargs["lhs_row_index"])[rows]
        sub_lhs = lhs
    else:
        sub_lhs = np.asarray(lhs, np.float32)[rows]
    sub_w = np.asarray(w[jnp.asarray(chosen)], np.float32)
    want = gmm64(sub_lhs, sub_w, jnp.asarray(sizes[chosen], jnp.int32), **sub)
    assert rel_err(out[rows], want) < 1e-2


@pytest.mark.parametrize("variant", ["gptoss_glu", "transposed", "plain"])
@pytest.mark.parametrize("workload", ["gptoss", "swiglu"])
def test_tail_path_at_128_rows_per_expert(variant, workload):
    """T = 4096 at gpt-oss's (E = 128, k = 4, H = 2880) and SwiGLU's (E = 256, k = 8, H = 2048:
    the down projection's K) routing: ~half the experts get a few rows past block_m, which the
    table's tail_m path multiplies in the visit before (kernels/gmm.py, Tails)."""
    e, k, h = (128, 4, 2880) if workload == "gptoss" else (256, 8, 2048)
    check_tail_groups(variant, 4096, k, e, h)


def two_dot_kernel(m_main: int, m_tail: int, k_dim: int, n_dim: int, *, num_warps=8, stages=4):
    """The 16-row-tail fault reduced to plain Pallas Triton, no gmm machinery: per program one
    [bn] column block, a K loop that loads one rhs block and multiplies it by two lhs blocks,
    [m_main, bk] and [m_tail, bk] (the gmm's main and tail segments), two float32
    accumulators, two stores. Returns (kernel out, XLA's float32 product of the same operands)."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu

    bk, bn = 64, 256
    rows = m_main + m_tail

    def kernel(a_ref, b_ref, o_ref):
        n0 = pl.program_id(0) * bn

        def body(i, accs):
            k0 = i * bk
            b = plgpu.load(b_ref.at[pl.ds(k0, bk), pl.ds(n0, bn)])
            main = plgpu.load(a_ref.at[pl.ds(0, m_main), pl.ds(k0, bk)])
            tail = plgpu.load(a_ref.at[pl.ds(m_main, m_tail), pl.ds(k0, bk)])
            return accs[0] + plgpu.dot(main, b), accs[1] + plgpu.dot(tail, b)

        accs = (jnp.zeros((m_main, bn), jnp.float32), jnp.zeros((m_tail, bn), jnp.float32))
        acc_main, acc_tail = jax.lax.fori_loop(0, k_dim // bk, body, accs)
        plgpu.store(o_ref.at[pl.ds(0, m_main), pl.ds(n0, bn)], acc_main)
        plgpu.store(o_ref.at[pl.ds(m_main, m_tail), pl.ds(n0, bn)], acc_tail)

    rng = np.random.default_rng(0)
    a = jnp.asarray(rng.standard_normal((rows, k_dim)), jnp.bfloat16)
    b = jnp.asarray(rng.standard_normal((k_dim, n_dim)), jnp.bfloat16)
    out = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((rows, n_dim), jnp.float32),
        grid=(n_dim // bn,),
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=stages),
    )(a, b)
    ref = jnp.dot(a, b, preferred_element_type=jnp.float32, precision="highest")
    return np.asarray(out), np.asarray(ref)


def _bad_rows(m_tail, k_dim, **kw):
    out, ref = two_dot_kernel(128, m_tail, k_dim, 2560, **kw)
    err = np.abs(out - ref).max(axis=1) / np.abs(ref).max()
    return np.flatnonzero(err > 1e-3)


@pytest.mark.xfail(
    strict=True,
    reason="Triton (jaxlib's and upstream 3.6) miscompiles two dots of 128 and 16 rows that share "
    "one loaded block in a pipelined loop at 8 warps: every row of the 128-row product is wrong. "
    "When this passes, the fault is fixed: BlockConfig may then allow short tails again.",
)
@pytest.mark.parametrize("stages", [3, 4])
def test_triton_two_dots_of_128_and_16_rows_at_8_warps(stages):
    assert _bad_rows(16, 2880 // 64 * 64, num_warps=8, stages=stages).size == 0


@pytest.mark.parametrize(
    "m_tail,warps,stages",
    [(16, 4, 4), (16, 8, 1), (64, 8, 3), (64, 8, 4)],  # 4 warps, no pipeline, the shipped tail
)
def test_triton_two_dots_exact_where_the_table_goes(m_tail, warps, stages):
    """The controls of the fault above: 4 warps, an unpipelined loop, or a 64-row second dot
    (the tails `BlockConfig` allows at 8 warps) compute every row exactly."""
    for k_dim in (256, 2880 // 64 * 64):
        assert _bad_rows(m_tail, k_dim, num_warps=warps, stages=stages).size == 0
