"""FP8 x FP8 grouped matmul on Mosaic GPU (`kernels.gmm_fp8_mgpu`): interpret mode against float64
on the quantised operands (interpret mode fills outputs with NaN, so every row written is checked),
the mosaic_gpu backend's routing of FP8-activation products, errors, and SwiGLU-256's layer
lowering for the H200 (layout inference and the shared-memory budget are checked there)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import moe_pallas
from moe_pallas import backends, quant, tuning
from moe_pallas.backends import mosaic_gpu as mosaic_backend
from moe_pallas.kernels import _common, gmm_fp8_mgpu
from moe_pallas.kernels.gmm_fp8_mgpu import gmm_fp8
from moe_pallas.kernels.gmm_mgpu import MosaicConfig
from tests.helpers import as_if_h200, make_params, random_routing
from tests.test_fp8_activations import BACKENDS_BOUND
from tests.test_lowering import SDS, lower_for_h200, triton_calls
from tests.test_quant import gmm_oracle, rel_err

# A float32 output: exact products and float32 sums in interpret mode; on the GPU each 128-deep
# wgmma chain of e4m3 products is summed with fewer bits than float32 (measured 1.4e-4 on an H100).
F32_BOUND = {True: 1e-5, False: 1e-3}


def _padded_with_nan(qw, extra=128):
    """qw with each row padded past its K values (a row pitch): zeros up to the next multiple of
    128 (a K tail's last box reads them, against x's zero-filled tail), then 128 NaN bytes, which
    make NaN if read."""
    k = qw.shape[1]
    zeros = -k % 128
    values = jnp.pad(qw.values[:, :, :k], ((0, 0), (0, 0), (0, zeros)))
    values = jnp.pad(values, ((0, 0), (0, 0), (0, extra)), constant_values=jnp.nan)
    return dataclasses.replace(qw, values=values, k=k)


@pytest.mark.parametrize(
    "fmt,activation,k,n_out,sizes,out_dtype,pad",
    [
        # unaligned group starts, an empty group, rows past the groups, two column tiles
        ("fp8", None, 256, 256, [70, 0, 9, 49], jnp.bfloat16, 128),
        # one hot expert over two row boxes, float32 out: the products exact, float32 sums
        ("fp8_block", "swiglu", 256, 128, [0, 128, 0, 3], jnp.float32, 128),
        ("fp8", "swiglu", 256, 128, [1], jnp.bfloat16, 128),  # T = 1: x padded to one box
        (
            "fp8_block",
            None,
            256,
            128,
            [5, 7, 9, 51],
            jnp.bfloat16,
            128,
        ),  # groups sharing 8-row units
        # K and N tails (gpt-oss's 2880 is 22.5 blocks): the last K box zero-filled past K, the
        # last column tile's stores clipped at N; gpt-oss's interleaved gate and up columns
        # (64-byte shared-memory rows); rows unpadded (None: their last box zero-filled too)
        ("fp8", "gptoss", 320, 192, [3, 0, 70, 11], jnp.bfloat16, 128),
        ("fp8", "gptoss", 192, 128, [0, 129], jnp.float32, None),
        ("fp8_block", None, 320, 192, [9, 40, 0, 2], jnp.float32, 128),
        ("fp8", "swiglu", 192, 192, [17, 5], jnp.bfloat16, None),  # the gate tile reads up rows
    ],
)
def test_gmm_fp8_matches_oracle(fmt, activation, k, n_out, sizes, out_dtype, pad):
    """K = 256 (two 128-deep blocks, each its own activation and fp8_block scale) and K, N tails,
    the weights' rows padded with NaN past the last 128-value box (never read), bias and row
    scale, against float64 on the dequantised operands (bf16 output 5e-3, float32 F32_BOUND);
    rows past the groups are zero."""
    rng = np.random.default_rng()
    parts = 2 if activation else 1
    n = parts * n_out
    w = jnp.asarray(rng.standard_normal((len(sizes), k, n)) / np.sqrt(k), jnp.bfloat16)
    qw = quant.quantize_weight(w, fmt)
    qw = qw if pad is None else _padded_with_nan(qw, pad)
    m = sum(sizes) + 3
    x_q, x_scales = quant.quantize_rows(jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16))
    bias = jnp.asarray(rng.standard_normal((len(sizes), n)), jnp.float32)
    row_scale = jnp.asarray(rng.random(m) + 0.5, jnp.float32)
    got = gmm_fp8(
        x_q,
        x_scales,
        qw,
        jnp.asarray(sizes, jnp.int32),
        bias=bias,
        activation=activation,
        row_scale=row_scale,
        out_dtype=out_dtype,
    )
    x = quant.dequantize_rows(x_q, x_scales, jnp.float32)
    want = gmm_oracle(x, qw.dequantize(jnp.float32), sizes, bias, activation, row_scale)
    assert got.shape == (m, n_out) and got.dtype == out_dtype
    rows = sum(sizes)
    bound = 5e-3 if out_dtype == jnp.bfloat16 else F32_BOUND[_common.interpret_mode()]
    assert rel_err(got[:rows], want[:rows]) < bound
    np.testing.assert_array_equal(np.asarray(got[rows:], np.float32), 0)


def test_mosaic_gpu_backend_runs_fp8_activation_products(monkeypatch):
    """implementation="mosaic_gpu": the SwiGLU block's two FP8-activation products run gmm_fp8
    (gate_up's rows gathered as e4m3, the GLU fused; apart under differentiation) and equal the
    Triton backend's within BACKENDS_BOUND, gradients of x and the routing weights too (the
    backward's products run on Triton); gpt-oss's interleaved GLU with fp8 weights likewise, with
    fp8_block (a scale block holds gate and up columns) on Triton."""
    calls = []
    kernel = gmm_fp8_mgpu.gmm_fp8
    spy = lambda x, *args, **kw: calls.append((x.shape, kw["activation"])) or kernel(x, *args, **kw)
    monkeypatch.setattr(gmm_fp8_mgpu, "gmm_fp8", spy)
    rng = np.random.default_rng()
    experts, hidden, inter = 5, 256, 128
    params = make_params(rng, experts, hidden, inter, biases=False, scale=2)
    dense = {name: jnp.asarray(v, jnp.bfloat16) for name, v in params.items()}
    qparams = moe_pallas.quantize_experts(dense, "fp8_block", fp8_activations=True)
    x = jnp.asarray(rng.standard_normal((6, hidden)), jnp.bfloat16)
    idx, wts = random_routing(rng, 6, experts - 1, 2)

    def run(x, wts, impl):
        return moe_pallas.moe_experts(
            x, idx, wts, qparams, activation="swiglu", implementation=impl
        )

    # jitted, each call a new function (traced, so the spy sees its kernels): eagerly, every op
    # of the block would compile on its own
    jit_run = lambda impl: jax.jit(lambda x, wts: run(x, wts, impl))(x, wts)
    primal, want = jit_run("mosaic_gpu"), jit_run("pallas_triton")
    assert [a for _, a in calls] == ["swiglu", None] and calls[0][0] == (12, hidden)
    assert rel_err(primal, want) < BACKENDS_BOUND
    calls.clear()  # under differentiation the GLU runs apart, gate_up's product plain

    def vjp_run(impl):
        @jax.jit
        def out_and_grads(x, wts, cot):
            out, vjp = jax.vjp(lambda x, wts: run(x, wts, impl), x, wts)
            return out, vjp(cot)

        return out_and_grads(x, wts, want)

    (out, grads), (want_out, want_grads) = vjp_run("mosaic_gpu"), vjp_run("pallas_triton")
    assert [a for _, a in calls] == [None, None] and rel_err(out, want_out) < BACKENDS_BOUND
    for got_grad, want_grad in zip(grads, want_grads):
        assert rel_err(got_grad, want_grad) < BACKENDS_BOUND

    problem = lambda **kw: backends.Problem(
        **{
            "kernel": "gmm_glu",
            "dtypes": (jnp.bfloat16, jnp.float8_e4m3fn),
            "out_dtype": jnp.bfloat16,
            "k": 256,
            "n": 128,
            "num_rows": 64,
            "num_groups": 4,
            "gather": True,
            "fused_epilogue": True,
            "weight_format": "fp8",
            "fp8_activations": True,
            "activation": "swiglu",
            **kw,
        }
    )
    assert mosaic_backend.supports(problem())
    assert mosaic_backend.supports(problem(activation="gptoss", k=2880, n=2880))
    assert not mosaic_backend.supports(problem(activation="gptoss", weight_format="fp8_block"))
    assert not mosaic_backend.supports(problem(k=2912))  # TMA tiles: K a multiple of 64
    assert not mosaic_backend.supports(problem(n=144))  # and N (the output's tiles)
    assert not mosaic_backend.supports(problem(fp8_activations=False))
    assert not mosaic_backend.supports(problem(weight_format="mxfp4", fp8_activations=False))
    gptoss = {
        fmt: moe_pallas.quantize_experts(dense, fmt, fp8_activations=True)
        for fmt in ("fp8", "fp8_block")
    }
    for fmt, want_calls in (("fp8", [((12, hidden), "gptoss"), ((12, inter), None)]),
                            ("fp8_block", [((12, inter), None)])):  # fmt: skip
        calls.clear()
        got, want = (
            jax.jit(
                lambda x, wts, p, impl=impl: moe_pallas.moe_experts(
                    x, idx, wts, p, activation="gptoss", implementation=impl
                )
            )(x, wts, gptoss[fmt])
            for impl in ("mosaic_gpu", "pallas_triton")
        )
        assert calls == want_calls and rel_err(got, want) < BACKENDS_BOUND, fmt


def test_auto_takes_fp8_activation_products_where_the_table_has_an_entry(monkeypatch):
    """ "auto" on the H200 gives SwiGLU-256's and gpt-oss's FP8-activation products (gate_up's GLU
    with its gathered rows, and down) to mosaic_gpu at 17+ rows per expert, where the table has
    "gmm_a8" / "gmm_glu_a8" entries keyed by the stored float8_e4m3fn; decode sizes, shapes
    without an entry (unless Triton would multiply them in float16: values past int32 offsets),
    gpt-oss's GLU on fp8_block weights and weights-only fp8 products stay on Triton. On the H100
    gpt-oss's products have entries in the large class only, FP8 training's backward ones (g's
    float32 output, "gmm_a8_f32", and dx) too."""
    as_if_h200(monkeypatch)

    def problem(kernel, rows=65536, a8=True, k=4096, n=2048):
        glu = kernel == "gmm_glu"
        dtypes = (jnp.bfloat16, jnp.float8_e4m3fn)
        return backends.Problem(
            kernel, dtypes, jnp.dtype(jnp.bfloat16), k, n, rows, 256, glu, True, "fp8", a8,
            "swiglu" if glu else None,
        )  # fmt: skip

    select = lambda p: backends.select("auto", p).name
    assert select(problem("gmm_glu")) == select(problem("gmm", k=2048, n=4096)) == "mosaic_gpu"
    assert select(problem("gmm_glu", rows=8192)) == "mosaic_gpu"  # 32 rows per expert
    assert select(problem("gmm_glu", rows=2048)) == "pallas_triton"  # 8: decode
    assert select(problem("gmm")) == "pallas_triton"  # no entry for K = 4096, N = 2048
    assert select(problem("gmm_glu", a8=False)) == "pallas_triton"
    gptoss = lambda kernel, fmt="fp8", **kw: problem(kernel, k=2880, n=2880, **kw)._replace(
        weight_format=fmt, activation="gptoss" if kernel == "gmm_glu" else None
    )
    assert select(gptoss("gmm_glu")) == select(gptoss("gmm", rows=8192)) == "mosaic_gpu"
    assert select(gptoss("gmm", fmt="fp8_block")) == "mosaic_gpu"
    assert select(gptoss("gmm_glu", fmt="fp8_block")) == "pallas_triton"
    assert select(gptoss("gmm_glu", rows=2048)) == "pallas_triton"
    # no entry, but stored values past int32 offsets (FP8 training's dx on SwiGLU-256's wᵀ), which
    # Triton multiplies in float16: Mosaic GPU with its default config, above decode sizes, for a
    # 16-bit output
    big = problem("gmm", k=4096, n=4096)._replace(weight_elements=256 * 4096 * 4096)
    assert select(big) == "mosaic_gpu"
    assert select(big._replace(num_rows=2048)) == "pallas_triton"
    assert select(big._replace(out_dtype=jnp.dtype(jnp.float32))) == "pallas_triton"
    # a float32 output has entries of its own ("gmm_a8_f32"), none on the H200
    assert select(gptoss("gmm")._replace(out_dtype=jnp.dtype(jnp.float32))) == "pallas_triton"
    assert select(big._replace(weight_elements=256 * 2048 * 4096)) == "pallas_triton"
    assert select(big._replace(fp8_activations=False)) == "pallas_triton"
    # the H100's table holds what was measured there: gpt-oss's in the large class only
    as_if_h200(monkeypatch, device="NVIDIA H100 80GB HBM3")
    assert select(problem("gmm_glu")) == select(problem("gmm", k=2048, n=4096)) == "mosaic_gpu"
    assert select(gptoss("gmm_glu")) == select(gptoss("gmm")) == "mosaic_gpu"
    assert select(gptoss("gmm_glu", rows=32768)) == "pallas_triton"  # 128 rows per expert
    g = gptoss("gmm")._replace(out_dtype=jnp.dtype(jnp.float32))  # dout[row_token] @ q(w_down)ᵀ
    dx = gptoss("gmm")._replace(k=5760)  # dh @ q(w_gate_up)ᵀ
    assert select(g) == select(dx) == "mosaic_gpu"
    assert (
        select(g._replace(num_rows=32768)) == select(dx._replace(num_rows=32768)) == "pallas_triton"
    )
    # g runs with its own entry's config, not the forward's down projection's (the same K and N)
    w_t = jax.eval_shape(quant.fp8_training_weight, SDS((128, 2880, 2880), jnp.bfloat16))
    lhs = SDS((65536, 2880), jnp.bfloat16)
    configs = [
        mosaic_backend.config(lhs, w_t, False, None, 65536, out)
        for out in (jnp.float32, jnp.bfloat16)
    ]
    kernels = ("gmm_a8_f32", "gmm_a8")
    entries = [
        tuning.lookup("mosaic_gpu", name, dtype=w_t.values.dtype, k=2880, n=2880, rows="large")
        for name in kernels
    ]
    assert configs == [MosaicConfig(**entry) for entry in entries] and configs[0] != configs[1]
    as_if_h200(monkeypatch)
    # the backend runs the kernel with the entry's config, else the kernel's default
    dense = SDS((256, 4096, 4096), jnp.bfloat16)
    w = jax.eval_shape(lambda d: quant.quantize_weight(d, "fp8_block"), dense)
    lhs = SDS((2048, 4096), jnp.bfloat16)
    entry = tuning.lookup(
        "mosaic_gpu", "gmm_glu_a8", dtype=jnp.float8_e4m3fn, k=4096, n=2048, rows="large"
    )
    assert mosaic_backend.config(lhs, w, False, "swiglu", 65536) == MosaicConfig(**entry)
    default = gmm_fp8_mgpu.default_config(None)
    assert mosaic_backend.config(lhs, w, False, None, 65536) == default  # no plain entry


def test_gmm_fp8_errors():
    rng = np.random.default_rng()
    w = quant.quantize_weight(jnp.asarray(rng.standard_normal((2, 200, 128)), jnp.bfloat16), "fp8")
    x_q, x_scales = quant.quantize_rows(jnp.ones((4, 200), jnp.bfloat16))
    sizes = jnp.array([2, 2], jnp.int32)
    with pytest.raises(ValueError, match=r"K=200 .* not a multiple of 64.*pallas_triton"):
        gmm_fp8(x_q, x_scales, w, sizes)
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        gmm_fp8(jnp.ones((4, 200), jnp.bfloat16), x_scales, w, sizes)
    with pytest.raises(ValueError, match=r"x_scales must be \[4, 2\]"):
        gmm_fp8(x_q, x_scales.T, w, sizes)
    w256 = quant.quantize_weight(
        jnp.asarray(rng.standard_normal((2, 256, 128)), jnp.bfloat16), "fp8_block"
    )
    x_q, x_scales = quant.quantize_rows(jnp.ones((4, 256), jnp.bfloat16))
    with pytest.raises(ValueError, match="fp8_block with gpt-oss's interleaved GLU"):
        gmm_fp8(x_q, x_scales, w256, sizes, activation="gptoss")
    with pytest.raises(ValueError, match="activation='relu'"):
        gmm_fp8(x_q, x_scales, w256, sizes, activation="relu")
    with pytest.raises(ValueError, match="config"):
        config = dataclasses.replace(gmm_fp8_mgpu.default_config(None), block_n=64)
        gmm_fp8(x_q, x_scales, w256, sizes, config=config)


@pytest.mark.parametrize(
    "activation,fmt", [("swiglu", "fp8"), ("swiglu", "fp8_block"), ("gptoss", "fp8")]
)
def test_full_size_fp8_activations_lower_to_mosaic_gpu(activation, fmt):
    """SwiGLU-256's and gpt-oss's (K = N = 2880: 22.5 blocks) blocks at full size with
    FP8-activation weights under "mosaic_gpu", forward and backward, lower for the H200 with their
    two forward products on Mosaic GPU (shared memory within the budget) and the backward's on
    Triton; T = 2293 (rows off the 8-row boxes)."""
    hidden, inter, experts, top_k = (4096, 2048, 256, 8) if activation == "swiglu" else (
        2880, 2880, 128, 4)  # fmt: skip
    dense = {
        "w_gate_up": SDS((experts, hidden, 2 * inter), jnp.bfloat16),
        "w_down": SDS((experts, inter, hidden), jnp.bfloat16),
    }
    params = jax.eval_shape(lambda d: quant.quantize_experts(d, fmt, fp8_activations=True), dense)

    def loss(x, idx, wts, params):
        out = moe_pallas.moe_experts(
            x, idx, wts, params, activation=activation, implementation="mosaic_gpu"
        )
        return jnp.sum(out.astype(jnp.float32))

    tokens = 2293
    args = (
        SDS((tokens, hidden), jnp.bfloat16),
        SDS((tokens, top_k), jnp.int32),
        SDS((tokens, top_k), jnp.float32),
        params,
    )
    text = lower_for_h200(jax.grad(loss, argnums=(0, 2)), *args)
    assert text.count("mosaic_gpu_v2") == 2 and triton_calls(text) >= 3


def test_debug_checks_catch_non_finite_row_padding():
    """Under debug_checks a padded fp8 weight whose padding up to the next 128 values (what the
    kernel's last K box reads) holds NaN is an error naming the weight; NaN further on is not."""
    rng = np.random.default_rng()
    k = 192
    w = quant.quantize_weight(jnp.asarray(rng.standard_normal((2, k, 64)), jnp.bfloat16), "fp8")
    x = jnp.asarray(rng.standard_normal((4, k)), jnp.bfloat16)
    sizes = jnp.array([3, 1], jnp.int32)
    with moe_pallas.debug_checks():
        moe_pallas.ragged_dot(x, _padded_with_nan(w), sizes, implementation="xla")
    bad = dataclasses.replace(
        w, values=jnp.pad(w.values, ((0, 0), (0, 0), (0, 64)), constant_values=jnp.nan), k=k
    )
    match = r"rhs's row padding .*192:256.*with_row_pitch"
    with pytest.raises(ValueError, match=match), moe_pallas.debug_checks():
        moe_pallas.ragged_dot(x, bad, sizes, implementation="xla")
