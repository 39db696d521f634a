"""FP8 activations (`QuantizedWeight.fp8_activations`): the e4m3 x e4m3 dot primitive, the row
quantiser, the gmm on the FP8 tensor cores (interpret mode) against float64 on the quantised
operands, the expert block and ragged_dot on both backends, gradients (straight through), errors,
and the lowering for the H200."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

import moe_pallas
from moe_pallas import quant
from moe_pallas.kernels import _common
from moe_pallas.kernels import gmm_quant as gmm_quant_module
from moe_pallas.kernels.config import BlockConfig
from moe_pallas.kernels.fp8_dot import fp8_dot
from moe_pallas.kernels.gmm_quant import gmm_quant
from tests.helpers import FULL_SHAPES, make_params, random_bytes, random_routing
from tests.test_lowering import H200, SDS, lower_for_h200, triton_calls
from tests.test_quant import _epilogue_case, gmm_oracle, rel_err

# Against the bf16 block on the dequantised weights: e4m3 keeps 4 significant bits, so each
# activation moves by up to 2^-4 of itself (measured 2.9-5.4% here, two matmuls).
FP8_ACTIVATIONS_BOUND = 8e-2
# The primal on both backends: the same quantised operands, exact in float32 (measured <= 0.34%:
# the bf16 output and activation roundings).
BACKENDS_BOUND = 1e-2
# The forward under jax.grad keeps h in bf16 and applies the GLU apart: a bf16 rounding of an
# activation can move its block's scale or cross an e4m3 rounding boundary before the down
# product (measured <= 2.8% against the primal); gradients (straight through) likewise.
ROUNDING_FLIP_BOUND = 5e-2


def _e4m3(rng, shape):
    return jnp.asarray(rng.standard_normal(shape) * 8, jnp.float8_e4m3fn)


def test_fp8_dot_in_a_kernel_and_its_lowering(monkeypatch):
    """Interpret mode: the float32 product of the e4m3 values. Lowered for the H200: one tt.dot on
    e4m3 operands whose max_num_imprecise_acc is its K (what makes Triton pick fp8 wgmma)."""
    rng = np.random.default_rng()
    m, n, k = 64, 32, 128
    a, b = _e4m3(rng, (m, k)), _e4m3(rng, (n, k))

    def kernel(a_ref, b_ref, o_ref):
        bits = [plgpu.load(r) for r in (a_ref, b_ref)]
        a, b = (jax.lax.bitcast_convert_type(x, jnp.float8_e4m3fn) for x in bits)
        o_ref[...] = fp8_dot(a, b)

    def call(a, b):
        return pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
            interpret=_common.interpret_mode(),
        )(a, b)

    as_bytes = lambda x: jax.lax.bitcast_convert_type(x, jnp.uint8)
    got = np.asarray(jax.jit(call)(as_bytes(a), as_bytes(b)), np.float64)
    want = np.asarray(a, np.float64) @ np.asarray(b, np.float64).T
    assert rel_err(got, want) < 1e-6

    from jax._src.pallas.triton import pallas_call_registration

    lowering = pallas_call_registration.lowering
    modules, lower = [], lowering.lower_jaxpr_to_triton_module

    def capture(*args, **kwargs):
        result = lower(*args, **kwargs)
        modules.append(result.module.operation.get_asm(enable_debug_info=False))
        return result

    monkeypatch.setattr(lowering, "lower_jaxpr_to_triton_module", capture)
    with jax.sharding.use_abstract_mesh(H200):
        bytes_ = SDS((m, k), jnp.uint8), SDS((n, k), jnp.uint8)
        jax.jit(call).trace(*bytes_).lower(lowering_platforms=("cuda",))
    [dot] = [line for line in modules[-1].splitlines() if "tt.dot" in line]
    assert "maxNumImpreciseAcc = 128" in dot and "f8E4M3FN" in dot
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        fp8_dot(a.astype(jnp.bfloat16), b)


def test_quantize_rows():
    """Each value within half an e4m3 step of x (2^-4 relative, or 2^-10 of the scale below
    e4m3's normal range), each block's largest magnitude at 448, a block of zeros with scale 1,
    a K tail (200 = 128 + 72), NaN and Inf reaching the row's products; fp8_rows' derivative is
    the identity."""
    rng = np.random.default_rng()
    x = rng.standard_normal((6, 200)) * np.exp(rng.uniform(-8, 8, (6, 1)))
    x[2, 128:] = 0
    x = jnp.asarray(x, jnp.bfloat16)
    values, scales = quant.quantize_rows(x)
    assert values.dtype == jnp.float8_e4m3fn and values.shape == (6, 200)
    assert scales.dtype == jnp.float32 and scales.shape == (6, 2)
    assert scales[2, 1] == 1 and not np.any(np.asarray(values[2, 128:], np.float32))
    xf = np.asarray(x, np.float64)
    back = (
        np.asarray(values, np.float64) * np.repeat(np.asarray(scales, np.float64), 128, 1)[:, :200]
    )
    step = np.maximum(2.0**-4 * np.abs(xf), 2.0**-10 * np.repeat(scales, 128, 1)[:, :200])
    assert np.all(np.abs(back - xf) <= step)
    for r, blk in ((0, 0), (5, 1)):
        assert np.max(np.abs(np.asarray(values[r, blk * 128 : (blk + 1) * 128], np.float32))) == 448
    np.testing.assert_array_equal(
        np.asarray(quant.fp8_rows(x), np.float32),
        np.asarray(quant.dequantize_rows(values, scales, jnp.bfloat16), np.float32),
    )
    assert np.asarray(jax.grad(lambda x: jnp.sum(quant.fp8_rows(x) * 3.0))(x) == 3).all()
    bad = x.at[0, 3].set(jnp.nan).at[1, 150].set(jnp.inf)
    w = jnp.ones((200, 4), jnp.bfloat16)
    products = quant.fp8_rows(bad).astype(jnp.float32) @ w.astype(jnp.float32)
    assert np.isnan(np.asarray(products[:2])).all() and np.isfinite(np.asarray(products[2:])).all()


@pytest.mark.parametrize(
    "fmt,activation,block_m,per_column,k,block_k",
    [
        ("fp8", None, 16, False, 176, 64),
        ("fp8", "gptoss", 16, False, 176, 256),
        ("fp8", "gptoss", 64, False, 176, 64),
        ("fp8_block", "swiglu", 64, False, 176, 64),
        ("fp8_block", "gptoss", 16, False, 176, 64),
        ("fp8_block", None, 64, True, 176, 64),
        ("fp8_block", "swiglu", 16, True, 176, 64),
        ("fp8_block", "swiglu", 16, False, 174, 64),
    ],
)
def test_gmm_on_fp8_activations_matches_oracle(
    fmt, activation, block_m, per_column, k, block_k, monkeypatch
):
    """gmm_quant with lhs_scales against float64 on the quantised rows and the decoded weights:
    K = 176 (a 128-deep step and a 48-deep tail, each its own activation scale), N = 2·96 in
    32-column tiles (an fp8_block SwiGLU tile in one 128-column scale block: its scale a scalar a
    step; gpt-oss's 64 interleaved columns likewise), fp8_block's per-column scale form (each
    column's own), gathered rows, bias, row scale, an empty and a one-row group, rows past the
    groups zero. block_m 64 (kept: 60 rows): fp8 dots of 128 values of K (the short visits on
    16- and 32-row paths); 16: the byte-pair view's float16 dots, a 256-deep step as two scale
    blocks, or, K = 174 (not a multiple of 4), fp8 dots on 16 rows."""
    run = _epilogue_case(
        fmt, activation, k, 192, [40, 0, 1, 15], 60, per_column=per_column, fp8_activations=True
    )
    fp8_dots = []
    spy = lambda a, b: fp8_dots.append(a.shape) or fp8_dot(a, b)
    monkeypatch.setattr(gmm_quant_module, "fp8_dot", spy)
    run(BlockConfig(block_m=block_m, block_n=32, block_k=block_k, min_block_m=16))
    paired = block_m <= gmm_quant_module.PAIRED_MAX_ROWS and k % 4 == 0
    assert bool(fp8_dots) != paired and all(shape[1] == 128 for shape in fp8_dots)


@pytest.mark.parametrize(
    "fmt,activation,k,n,direct",
    [
        ("fp8_block", None, 176, 96, True),  # block_n 64 -> 32 divides N; a 48-deep K tail
        ("fp8", "swiglu", 256, 192, True),  # no tail
        ("fp8", "gptoss", 176, 96, False),  # N = 48: no block_n of 32 or more divides it
        ("fp8_block", "swiglu", 174, 192, False),  # K not a multiple of 16
    ],
)
def test_fp8_activations_unmasked_tiles(fmt, activation, k, n, direct, monkeypatch):
    """fp8 dots on the weights as loaded (Math: fp8 activations): on 64-row tiles whose block_n
    divides N (narrowed to a divisor if needed) and whose K tail is a step of its own, ending at K
    with x's earlier columns masked, against float64 with every epilogue; other calls read the
    weights as bytes. The kernel is told which."""
    seen = []
    kernel = gmm_quant_module._kernel
    spy = lambda *refs, **kw: seen.append((kw["direct"], kw["cfg"].block_n)) or kernel(*refs, **kw)
    monkeypatch.setattr(gmm_quant_module, "_kernel", spy)
    run = _epilogue_case(fmt, activation, k, n, [40, 0, 1, 23], 64, fp8_activations=True)
    run(BlockConfig(block_m=64, block_n=64, block_k=128, min_block_m=16))
    n_out = n // 2 if activation else n
    assert seen and {d for d, _ in seen} == {direct}
    assert all(n_out % block_n == 0 for _, block_n in seen) or not direct


@pytest.mark.parametrize(
    "fmt,activation,implementation",
    [("fp8_block", "swiglu", "pallas_triton"), ("fp8", "gptoss", "pallas_triton")],
)
def test_moe_experts_on_fp8_activations(fmt, activation, implementation):
    """The block with fp8_activations: both backends compute the same quantised block (the primal
    within BACKENDS_BOUND), both within FP8_ACTIVATIONS_BOUND of the bf16 block on the
    dequantised weights; T = 1 and T = 6 with an expert that gets no rows; the forward under
    differentiation and the gradients of x and topk_weight (straight through the quantiser)
    between the backends, and the routing weights' against the dense block."""
    rng = np.random.default_rng()
    num_experts, hidden, inter = 5, 256, 96
    params = make_params(rng, num_experts, hidden, inter, biases=activation == "gptoss", scale=2)
    params = {k: jnp.asarray(v, jnp.bfloat16) for k, v in params.items()}
    qparams = moe_pallas.quantize_experts(params, fmt, fp8_activations=True)
    assert qparams["w_gate_up"].fp8_activations and qparams["w_down"].fp8_activations
    dense = moe_pallas.dequantize_experts(qparams)
    run = lambda x, idx, wts, p, impl=implementation: moe_pallas.moe_experts(
        x, idx, wts, p, activation=activation, implementation=impl
    )

    @jax.jit  # one program per token count (eagerly, every op compiled on its own)
    def block(x, idx, wts, qparams, dense):
        vjps = {}
        for name, p, impl in (
            ("pallas", qparams, implementation),
            ("xla", qparams, "xla"),
            ("dense", dense, "xla"),
        ):
            vjps[name] = jax.vjp(lambda x, wts, p=p, impl=impl: run(x, idx, wts, p, impl), x, wts)
        want = vjps["dense"][0]  # the cotangent of all three
        primal = run(x, idx, wts, qparams)  # the GLU in the gmm's epilogue
        return primal, {name: (out, vjp(want)) for name, (out, vjp) in vjps.items()}

    for num_tokens in (1, 6):
        x = jnp.asarray(rng.standard_normal((num_tokens, hidden)), jnp.bfloat16)
        idx, wts = random_routing(rng, num_tokens, num_experts - 1, 2)
        primal, runs = block(x, idx, wts, qparams, dense)
        (out, (dx, dw)), (xla_out, (dx_xla, dw_xla)) = runs["pallas"], runs["xla"]
        want, (_, dw_dense) = runs["dense"]
        assert primal.dtype == jnp.bfloat16 and rel_err(primal, xla_out) < BACKENDS_BOUND
        assert rel_err(out, primal) < ROUNDING_FLIP_BOUND
        for got in (primal, out, xla_out):
            assert rel_err(got, want) < FP8_ACTIVATIONS_BOUND
        assert rel_err(dx, dx_xla) < ROUNDING_FLIP_BOUND
        assert rel_err(dw, dw_xla) < ROUNDING_FLIP_BOUND
        assert rel_err(dw, dw_dense) < FP8_ACTIVATIONS_BOUND


def test_ragged_dot_on_fp8_activations(monkeypatch):
    """ragged_dot on an fp8_activations weight: both backends the quantised product, and the
    Pallas one again with the values read as byte pairs (as past 2^31 bytes: float16 dots of
    both operands' exact values, forced here)."""
    rng = np.random.default_rng()
    w = jnp.asarray(rng.standard_normal((3, 256, 64)) / 16, jnp.bfloat16)
    qw = quant.quantize_weight(w, "fp8_block")
    qw8 = dataclasses.replace(qw, fp8_activations=True)
    x = jnp.asarray(rng.standard_normal((9, 256)), jnp.bfloat16)
    sizes = jnp.array([4, 0, 5], jnp.int32)
    dense = np.asarray(qw.dequantize(jnp.float32), np.float64)
    rows = np.asarray(quant.fp8_rows(x), np.float64)
    want = np.concatenate([rows[:4] @ dense[0], rows[4:] @ dense[2]])
    got = {
        impl: moe_pallas.ragged_dot(x, qw8, sizes, implementation=impl)
        for impl in ("pallas_triton", "xla")
    }
    for impl, out in got.items():
        assert out.shape == (9, 64) and rel_err(out, want) < 5e-3, impl
    monkeypatch.setattr(gmm_quant_module, "PAIRED_MIN_ELEMENTS", 2)  # as if past 2^31 bytes
    wide = moe_pallas.ragged_dot(x, qw8, sizes, implementation="pallas_triton")
    assert rel_err(wide, want) < 5e-3


def test_fp8_activations_errors():
    rng = np.random.default_rng()
    w = jnp.asarray(rng.standard_normal((2, 128, 32)), jnp.bfloat16)
    with pytest.raises(ValueError, match="fp8_activations needs 'fp8' or 'fp8_block'"):
        moe_pallas.quantize_experts({"w_down": w}, "mxfp4", fp8_activations=True)
    qparams = moe_pallas.quantize_experts({"w_down": w}, "fp8")
    on = moe_pallas.use_fp8_activations(qparams)
    assert on["w_down"].fp8_activations and not qparams["w_down"].fp8_activations
    assert not moe_pallas.use_fp8_activations(on, False)["w_down"].fp8_activations
    with pytest.raises(ValueError, match=r"\['w_gate_up'\] are dense"):
        moe_pallas.use_fp8_activations({"w_gate_up": w, **on})
    x = jnp.ones((4, 128), jnp.bfloat16)
    values, scales = quant.quantize_rows(x)
    sizes = jnp.array([2, 2], jnp.int32)
    with pytest.raises(ValueError, match="out_dtype"):
        gmm_quant(values, qparams["w_down"], sizes, lhs_scales=scales)
    with pytest.raises(ValueError, match="float8_e4m3fn lhs"):
        gmm_quant(x, qparams["w_down"], sizes, lhs_scales=scales, out_dtype=jnp.bfloat16)
    with pytest.raises(ValueError, match=r"lhs_scales must be \[4, 1\]"):
        gmm_quant(values, qparams["w_down"], sizes, lhs_scales=scales.T, out_dtype=jnp.bfloat16)
    mx = quant.quantize_weight(w, "mxfp4")
    with pytest.raises(ValueError, match="'fp8' or 'fp8_block' weights"):
        gmm_quant(values, mx, sizes, lhs_scales=scales, out_dtype=jnp.bfloat16)


@pytest.mark.parametrize("fmt", ["fp8", "fp8_block"])
def test_fp8_activations_layer_lowers_for_the_h200(fmt):
    """gpt-oss's block at full size with fp8_activations weights (forward and its backward) lowers
    to Triton calls for the H200, the weights in the layout `quantize_experts` gives them: gate_up
    with unpadded rows (padded, its values would pass 2^31 bytes), down padded to 3072."""
    hidden, inter, experts, top_k = 2880, 2880, 128, 4
    dense = {
        "w_gate_up": SDS((experts, hidden, 2 * inter), jnp.bfloat16),
        "w_down": SDS((experts, inter, hidden), jnp.bfloat16),
    }
    params = jax.eval_shape(lambda d: quant.quantize_experts(d, fmt, fp8_activations=True), dense)
    assert params["w_gate_up"].values.shape == (experts, 2 * inter, hidden)
    assert params["w_down"].values.shape == (experts, hidden, 3072)
    assert params["w_down"].shape == (experts, inter, hidden)

    def loss(x, idx, wts, params):
        out = moe_pallas.moe_experts(
            x, idx, wts, params, activation="gptoss", implementation="pallas_triton"
        )
        return jnp.sum(out.astype(jnp.float32))

    args = (
        SDS((2048, hidden), jnp.bfloat16),
        SDS((2048, top_k), jnp.int32),
        SDS((2048, top_k), jnp.float32),
        params,
    )
    text = lower_for_h200(jax.grad(loss, argnums=(0, 2)), *args)
    assert triton_calls(text) >= 4 and text.count(f'name = "gmm_{fmt}"') == 2


@FULL_SHAPES
@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["fp8", "fp8_block"])
def test_gptoss_sized_fp8_activations(fmt):
    """gpt-oss's experts at full size with fp8_activations on the GPU ("auto": the FP8 tensor
    cores) within FP8_ACTIVATIONS_BOUND of the bf16 layer on the dequantised weights, and within
    BACKENDS_BOUND of every call on the byte-pair view (float16 dots of the same operands) and of
    "mosaic_gpu" (`kernels.gmm_fp8_mgpu`: K and N tails, fp8's interleaved GLU, unpadded gate_up
    rows), at T = 64 (16-row tiles, paired anyway) and T = 2048 (64 rows per expert: fp8 wgmma)."""
    from tests.helpers import device_expert_params, device_normal

    rng = np.random.default_rng(5)
    experts, hidden, inter, top_k = 128, 2880, 2880, 4
    params = device_expert_params(rng, experts, hidden, inter, jnp.bfloat16, (0.1, 0.1))
    qparams = moe_pallas.quantize_experts(params, fmt, fp8_activations=True)
    del params
    dense = moe_pallas.dequantize_experts(qparams)
    layer, mosaic = (
        jax.jit(
            lambda x, idx, wts, p, impl=impl: moe_pallas.moe_experts(
                x, idx, wts, p, activation="gptoss", implementation=impl
            )
        )
        for impl in ("auto", "mosaic_gpu")
    )
    for tokens in (64, 2048):
        x = device_normal(rng, (tokens, hidden), jnp.bfloat16)
        idx, wts = random_routing(rng, tokens, experts, top_k)
        out = layer(x, idx, wts, qparams)
        want = layer(x, idx, wts, dense)
        assert out.dtype == jnp.bfloat16 and rel_err(out, want) < FP8_ACTIVATIONS_BOUND, tokens
        with pytest.MonkeyPatch.context() as mp:  # float16 dots of the same operands
            mp.setattr(gmm_quant_module, "PAIRED_MAX_ROWS", 1 << 20)
            paired = jax.jit(
                lambda x, idx, wts, p: moe_pallas.moe_experts(x, idx, wts, p, activation="gptoss")
            )(x, idx, wts, qparams)
        assert rel_err(out, paired) < BACKENDS_BOUND, tokens
        assert rel_err(mosaic(x, idx, wts, qparams), out) < BACKENDS_BOUND, tokens


@FULL_SHAPES
@pytest.mark.gpu
@pytest.mark.parametrize(
    "rows_per_expert,implementation",
    [(2, "pallas_triton"), (64, "pallas_triton"), (64, "mosaic_gpu")],
)
def test_swiglu256_sized_fp8_activations(rows_per_expert, implementation):
    """SwiGLU-256's gate_up weight with fp8 activations, through ragged_dot: fp8_block values
    [256, 4096, 4096] are 2^32 bytes, so every Triton call reads them as byte pairs and
    multiplies in float16 (decode and wgmma tiles), and Mosaic GPU's TMA boxes address them in
    three coordinates (`kernels.gmm_fp8_mgpu`, e4m3 dots); random stored bytes (no dense weight: its float32
    temporaries would be tens of GiB), rows of the first and last experts against float64 on
    the quantised rows and each hit expert's decoded weight."""
    e, h, n = 256, 4096, 4096
    keys = jax.random.split(jax.random.key(1), 3)
    values = random_bytes(keys[0], (e, n, h)) & 0xFE  # no NaN codes
    values = jax.lax.bitcast_convert_type(values, jnp.float8_e4m3fn)
    scales = jax.random.uniform(keys[1], (e, h // 128, n // 128), jnp.float32, 1e-4, 1e-3)
    w = quant.QuantizedWeight(values, scales, "fp8_block", jnp.bfloat16, fp8_activations=True)
    experts = [0, 1, 128, 254, 255]
    sizes = np.zeros(e, np.int64)
    sizes[experts] = rows_per_expert
    x = jax.random.normal(keys[2], (int(sizes.sum()), h), jnp.bfloat16)
    out = np.asarray(
        moe_pallas.ragged_dot(x, w, jnp.asarray(sizes, jnp.int32), implementation=implementation)
    )
    rows_q = np.asarray(quant.fp8_rows(x, jnp.float32))
    bounds = np.cumsum([0, *sizes])
    for g in experts:
        one = quant.QuantizedWeight(values[g : g + 1], scales[g : g + 1], "fp8_block", jnp.bfloat16)
        rows = slice(bounds[g], bounds[g + 1])
        zero_bias, unit_scale = np.zeros((1, n)), np.ones(sizes[g])
        want = gmm_oracle(
            rows_q[rows], one.dequantize(jnp.float32), [sizes[g]], zero_bias, None, unit_scale
        )
        assert rel_err(out[rows], want) < 5e-3, g
