"""Quantised expert weights: formats round-trip, the on-chip-converting gmm (interpret mode) and
the expert block against float64 oracles on the exactly dequantised weights, gradients, errors."""

import dataclasses
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import moe_pallas
from moe_pallas import quant, tuning
from moe_pallas.backends import pallas_triton
from moe_pallas.kernels import gmm_quant as gmm_quant_module
from moe_pallas.kernels import mx_words
from moe_pallas.kernels.config import BlockConfig
from moe_pallas.kernels.gmm_quant import gmm_quant
from moe_pallas.kernels.gmm_quant_t import gmm_quant_t
from moe_pallas.reference import moe_experts_reference
from tests.helpers import FULL_SHAPES, make_params, random_bytes, random_routing

# bf16 output rounding (2^-8 relative) plus bf16 rounding of the stored activation between the
# two matmuls: the bound docs/reliability.md states for the quantised path.
BF16_BOUND = 1.5e-2


def rel_err(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return np.linalg.norm(got - want) / np.linalg.norm(want)


def e2m1_oracle(codes):
    """e2m1 code -> value from the bit fields, independent of quant.E2M1."""
    sign = np.where(codes & 8, -1.0, 1.0)
    e, m = (codes >> 1) & 3, codes & 1
    return sign * np.where(e == 0, 0.5 * m, (1 + 0.5 * m) * 2.0 ** (e - 1.0))


def stored_codes(values):
    """mxfp4's stored bytes [..., K/2] -> e2m1 codes [..., K] (low half, then high), read with
    numpy from the layout table `mx_words.MX_WORD_BITS` (little-endian 32-bit words)."""
    words = np.ascontiguousarray(values).view("<u4").astype(np.int64)
    halves = []
    for places_of in mx_words.MX_WORD_BITS:
        slots = [
            sum(((words >> p) & 1) << b for b, p in zip((3, 2, 1, 0), places))
            for places in places_of
        ]
        halves.append(np.stack(slots, axis=-1).reshape(*values.shape))
    return np.concatenate(halves, axis=-1)


def test_formats_decode_and_quantise():
    rng = np.random.default_rng()
    w = jnp.asarray(rng.standard_normal((2, 192, 160)) * 3, jnp.bfloat16)
    wf = np.asarray(w, np.float64)
    for fmt, bound in (("fp8", 0.07), ("fp8_block", 0.07), ("mxfp4", 0.25)):
        qw = moe_pallas.quantize_experts({"w_gate_up": w}, fmt)["w_gate_up"]
        assert qw.shape == w.shape and qw.dtype == jnp.bfloat16
        dense = np.asarray(qw.dequantize(jnp.float32), np.float64)
        if fmt == "mxfp4":
            assert qw.values.shape == (2, 160, 96)  # N-major, K/2 bytes
            codes = np.swapaxes(stored_codes(np.asarray(qw.values)), 1, 2)
            scales = np.repeat(np.asarray(qw.scales).astype(np.int64) - 127, 32, axis=1)
            want = e2m1_oracle(codes) * 2.0**scales
            # OCP rule: each 32-block's absmax scaled into [4, 8), so no code past 6 is lost.
            blocks = np.abs(wf).reshape(2, 6, 32, 160).max(2)
            assert np.all(blocks * 2.0 ** -(np.asarray(qw.scales) - 127.0) >= 4)
            assert np.all(blocks * 2.0 ** -(np.asarray(qw.scales) - 127.0) < 8)
        else:
            assert qw.values.shape == (2, 160, 192)  # N-major, as checkpoints store [out, in]
            vals = np.swapaxes(np.asarray(qw.values.astype(jnp.float32), np.float64), 1, 2)
            s = np.asarray(qw.scales, np.float64)
            if fmt == "fp8":
                want = vals * s[:, None, :]
            else:
                want = vals * np.repeat(np.repeat(s, 128, 1), 128, 2)[:, :192, :160]
        np.testing.assert_array_equal(dense, want.astype(np.float32))  # one rounding
        assert rel_err(dense, wf) < bound, fmt
    # mxfp4 decodes exactly to bf16, and re-quantising the decode gives the same weight
    again = quant.quantize_weight(qw.dequantize(), "mxfp4")
    np.testing.assert_array_equal(np.asarray(again.dequantize(jnp.float32)), dense)


@pytest.mark.parametrize("fmt", quant.FORMATS)
def test_quantising_works_a_few_experts_at_a_time(fmt):
    """quantize_experts' and dequantize_experts' temporaries stay under a float32 copy of the
    whole weight (SwiGLU-256's gate_up ran out of memory on the H200 asking for 48 GiB): a chunk
    of experts at a time. Unchunked, both take at least that copy (CPU: 128 and 192 MiB); chunked,
    16-33 MiB on CPU and 64-85 MiB on the H200, whose XLA keeps more temporaries. And the chunks
    change no value."""
    w = jax.ShapeDtypeStruct((64, 512, 1024), jnp.bfloat16)
    whole_f32 = 64 * 512 * 1024 * 4  # 128 MiB
    memory = quant._quantize.lower(w, fmt).compile().memory_analysis()
    assert memory.temp_size_in_bytes < whole_f32
    qw = jax.eval_shape(lambda w: quant._quantize(w, fmt), w)  # and the way back
    memory = quant._dequantize.lower(qw, dtype=jnp.dtype(jnp.bfloat16)).compile().memory_analysis()
    assert memory.temp_size_in_bytes < whole_f32
    rng = np.random.default_rng()
    small = jnp.asarray(rng.standard_normal((5, 128, 96)), jnp.bfloat16)
    chunked = quant.quantize_weight(small, fmt)
    for e in range(5):
        one = quant.quantize_weight(small[e : e + 1], fmt)
        np.testing.assert_array_equal(
            np.asarray(chunked.dequantize(jnp.float32)[e]),
            np.asarray(one.dequantize(jnp.float32)[0]),
        )


# The check precedes every format's code (quantize_weight): each value once, each format once.
@pytest.mark.parametrize("bad,fmt", [(np.nan, "fp8_block"), (np.inf, "fp8"), (-np.inf, "mxfp4")])
def test_quantising_refuses_non_finite_weights(fmt, bad):
    """A NaN or infinity would set its block's scale (fp8 turned an infinity's column into NaN,
    mxfp4 stored both as finite values): concrete weights holding one are refused, naming the
    weight, the count and the first position; under jit they are not checked (no host round
    trip)."""
    rng = np.random.default_rng()
    params = {
        k: jnp.asarray(v, jnp.bfloat16)
        for k, v in make_params(rng, 4, 128, 64, biases=False).items()
    }
    w = np.asarray(params["w_gate_up"], np.float32)
    w[2, 70, 5] = w[3, 1, 0] = bad
    params["w_gate_up"] = jnp.asarray(w, jnp.bfloat16)
    with pytest.raises(
        ValueError, match=r"params\['w_gate_up'\] holds 2 NaN or infinite .*\[2, 70, 5\]"
    ):
        moe_pallas.quantize_experts(params, fmt)
    with pytest.raises(ValueError, match=r"the weight holds 2 .*\[2, 70, 5\]"):
        quant.quantize_weight(params["w_gate_up"], fmt)
    traced = jax.jit(lambda p: moe_pallas.quantize_experts(p, fmt))(params)
    assert quant.is_quantized(traced["w_gate_up"])
    finite = moe_pallas.quantize_experts({**params, "w_gate_up": jnp.zeros_like(w)}, fmt)
    assert quant.is_quantized(finite["w_gate_up"])


def gmm_oracle(x, w, group_sizes, bias, activation, row_scale):
    """float64: rows of group g times w[g], + bias, GLU, x row scale; rows past the groups 0."""
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    out = np.zeros((x.shape[0], w.shape[2] // (2 if activation else 1)))
    ends = np.cumsum(group_sizes)
    for g, (lo, hi) in enumerate(zip(np.r_[0, ends[:-1]], ends)):
        h = x[lo:hi] @ w[g] + np.asarray(bias, np.float64)[g]
        if activation == "swiglu":
            gate, up = np.split(h, 2, axis=1)
            h = gate / (1 + np.exp(-gate)) * up
        elif activation == "gptoss":
            gate, up = np.minimum(h[:, ::2], 7), np.clip(h[:, 1::2], -7, 7)
            h = gate / (1 + np.exp(-1.702 * gate)) * (up + 1)
        out[lo:hi] = h * np.asarray(row_scale, np.float64)[lo:hi, None]
    return out


@pytest.mark.parametrize(
    "fmt,activation,paired",
    [
        ("fp8", None, False),
        ("fp8_block", "swiglu", False),
        ("mxfp4", "gptoss", False),
        ("mxfp4", None, False),
        ("fp8", "swiglu", True),
        ("fp8", "gptoss", True),
        ("fp8_block", None, True),
        ("mxfp4", "swiglu", True),
    ],
)
def test_gmm_quant_matches_oracle(fmt, activation, paired, monkeypatch):
    """K = 176 for fp8 (two 64-deep K steps and a 48-deep tail, across two 128-row scale
    blocks; 3 x 64 for mxfp4, which has no K tail), N = 2·80 with 32-column tiles (ragged N
    tail), an empty group, a one-row group, rows past the groups, gathered rows. paired: fp8 read
    as byte pairs (decode-sized tiles, and weights of over 2^31 bytes); else as bytes, forced."""
    if not paired:
        monkeypatch.setattr(gmm_quant_module, "PAIRED_MAX_ROWS", 0)
    k = 192 if fmt == "mxfp4" else 176
    run = _epilogue_case(fmt, activation, k, 160, [11, 0, 1, 15], 30)  # 3 rows past the groups
    run(BlockConfig(block_m=16, block_n=32, block_k=64, min_block_m=16))


def _epilogue_case(fmt, activation, k, n, sizes, m, *, per_column=False, fp8_activations=False):
    """Random [len(sizes), k, n] weights in `fmt` (fp8_block's scales per column if per_column:
    the loader's [E, K/128, N] form), m gathered rows of x, bias and row scale: a function of a
    config that runs gmm_quant with every epilogue and checks it against the float64 oracle (bf16
    output, 5e-3) and the rows past the groups (zero). fp8_activations: x quantised per row and
    128 values of K (`quant.quantize_rows`), the oracle on the quantised rows."""
    rng = np.random.default_rng()
    e, rows = len(sizes), sum(sizes)
    w = jnp.asarray(rng.standard_normal((e, k, n)) / np.sqrt(k), jnp.bfloat16)
    qw = quant.quantize_weight(w, fmt)
    if per_column:
        qw = dataclasses.replace(qw, scales=jnp.repeat(qw.scales, 128, axis=2)[:, :, :n])
    x = jnp.asarray(rng.standard_normal((m + 5, k)), jnp.bfloat16)
    index = jnp.asarray(rng.integers(0, m + 5, m), jnp.int32)
    bias = jnp.asarray(rng.standard_normal((e, n)), jnp.float32)
    scale = jnp.asarray(rng.random(m) + 0.5, jnp.float32)
    lhs, fp8 = x, {}
    if fp8_activations:
        lhs, lhs_scales = quant.quantize_rows(x)
        x = quant.dequantize_rows(lhs, lhs_scales, jnp.float32)
        fp8 = {"lhs_scales": lhs_scales, "out_dtype": jnp.bfloat16}
    want = gmm_oracle(
        np.asarray(x)[index], qw.dequantize(jnp.float32), sizes, bias, activation, scale
    )

    def run(config):
        out = gmm_quant(
            lhs,
            qw,
            jnp.asarray(sizes, jnp.int32),
            lhs_row_index=index,
            bias=bias,
            activation=activation,
            row_scale=scale,
            config=config,
            **fp8,
        )
        assert out.shape == (m, n // 2 if activation else n) and out.dtype == jnp.bfloat16
        assert rel_err(out, want) < 5e-3
        np.testing.assert_array_equal(np.asarray(out[rows:], np.float32), 0)

    return run


def test_fp8_rows_padded_to_the_row_pitch():
    """fp8 values' rows are stored padded with zeros to a multiple of 256 bytes where that adds at
    most an eighth of a row (gpt-oss's 2880 -> 3072; 192 and 136 stay), `k` keeping K: the
    logical shape, the decode and every other format unchanged."""
    rows = {k: quant.row_pitch(k) for k in (64, 136, 192, 480, 1000, 2048, 2880, 4096)}
    assert rows == {64: 64, 136: 136, 192: 192, 480: 512, 1000: 1024, 2048: 2048, 2880: 3072,
                    4096: 4096}  # fmt: skip
    rng = np.random.default_rng()
    w = jnp.asarray(rng.standard_normal((3, 480, 40)), jnp.bfloat16)
    for fmt in ("fp8", "fp8_block"):
        qw = quant.quantize_weight(w, fmt)
        assert qw.values.shape == (3, 40, 512) and qw.k == 480 and qw.shape == (3, 480, 40)
        np.testing.assert_array_equal(np.asarray(qw.values[:, :, 480:], np.float32), 0)
        plain = dataclasses.replace(qw, values=qw.values[:, :, :480], k=None)
        assert plain.shape == qw.shape
        np.testing.assert_array_equal(qw.dequantize(jnp.float32), plain.dequantize(jnp.float32))
        assert quant.with_row_pitch(plain).values.shape == qw.values.shape
        assert quant.with_row_pitch(qw) is qw
        assert rel_err(qw.dequantize(jnp.float32), w) < 0.07
    mx = quant.quantize_weight(jnp.ones((1, 2880, 8), jnp.bfloat16), "mxfp4")
    assert mx.k is None and mx.values.shape == (1, 8, 1440)
    with pytest.raises(ValueError, match="k .padded rows. applies to 'fp8' and 'fp8_block'"):
        dataclasses.replace(mx, k=2880)


def test_fp8_activations_keep_rows_unpadded_past_the_offset_limit(monkeypatch):
    """Weights with FP8 activations keep unpadded rows where the padding would take the values
    past AS_LOADED_MAX_BYTES (the byte-pair view: float16 dots, not the tiles as loaded); the
    setting's switch pads or cuts the rows back, and weights that stay under it keep their
    padding."""
    w = jnp.asarray(np.random.default_rng().standard_normal((3, 480, 40)), jnp.bfloat16)
    padded = quant.quantize_weight(w, "fp8")
    monkeypatch.setattr(quant, "AS_LOADED_MAX_BYTES", 3 * 40 * 500)  # 480 fits, 512 does not
    on = quant.use_fp8_activations({"w_gate_up": padded, "w_down": padded})
    for qw in on.values():
        assert qw.fp8_activations and qw.k is None and qw.values.shape == (3, 40, 480)
        np.testing.assert_array_equal(qw.dequantize(jnp.float32), padded.dequantize(jnp.float32))
    assert quant.with_row_pitch(on["w_down"]) is on["w_down"]
    off = quant.use_fp8_activations(on, False)["w_down"]
    assert not off.fp8_activations and off.k == 480 and off.values.shape == (3, 40, 512)
    quantised = quant.quantize_experts({"w_gate_up": w, "w_down": w}, "fp8", fp8_activations=True)
    assert quantised["w_down"].values.shape == (3, 40, 480)
    monkeypatch.setattr(quant, "AS_LOADED_MAX_BYTES", 3 * 40 * 512)
    assert quant.use_fp8_activations({"w_gate_up": padded, "w_down": padded})["w_down"].k == 480


def _poisoned_padding(qw):
    """qw, its rows' padding NaN: a product that read it would be NaN."""
    k = qw.shape[1]
    return dataclasses.replace(qw, values=qw.values.at[:, :, k:].set(jnp.nan))


@pytest.mark.parametrize(
    "fmt,activation,block_m,weights_first,fp8_activations",
    [
        ("fp8", "gptoss", 16, False, False),  # byte pairs (decode tiles)
        ("fp8_block", None, 16, False, False),
        ("fp8", None, 64, False, False),  # bytes, a masked K tail
        ("fp8_block", "swiglu", 64, True, False),  # weights first asked: x first, bytes
        ("fp8_block", "gptoss", 64, False, False),
        ("fp8", "gptoss", 64, False, True),  # fp8 dots on the tiles as loaded, a K tail step
        ("fp8_block", None, 64, False, True),
        ("fp8", None, 16, False, True),  # FP8 activations' decode tiles: byte pairs
    ],
)
def test_padded_rows_are_never_read(fmt, activation, block_m, weights_first, fp8_activations):
    """gmm_quant on K = 480 (3 steps of 128 and a 96-deep tail; rows padded to 512) with NaN
    padding equals gmm_quant on the same values unpadded, bit for bit, on every path that reads
    fp8 values (byte pairs, bytes, weights first, FP8 activations as loaded and as pairs), as does
    gmm_quant_t, the backward's product, on both fp8 formats."""
    rng = np.random.default_rng()
    k, n, sizes = 480, 96, [70, 0, 1, 33]
    w = jnp.asarray(rng.standard_normal((len(sizes), k, n)) / np.sqrt(k), jnp.bfloat16)
    qw = quant.quantize_weight(w, fmt)
    assert qw.values.shape[2] == 512
    plain = dataclasses.replace(qw, values=qw.values[:, :, :k], k=None)
    x = jnp.asarray(rng.standard_normal((110, k)), jnp.bfloat16)
    lhs, extra = x, {}
    if fp8_activations:
        lhs, lhs_scales = quant.quantize_rows(x)
        extra = {"lhs_scales": lhs_scales, "out_dtype": jnp.bfloat16}
    cfg = BlockConfig(
        block_m=block_m, block_n=32, block_k=128, min_block_m=16, weights_first=weights_first
    )
    group_sizes = jnp.asarray(sizes, jnp.int32)
    bias = jnp.asarray(rng.standard_normal((len(sizes), n)), jnp.float32)
    run = lambda w: gmm_quant(
        lhs, w, group_sizes, bias=bias, activation=activation, config=cfg, **extra
    )
    got, want = run(_poisoned_padding(qw)), run(plain)
    assert np.isfinite(np.asarray(got, np.float32)).all()
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
    if block_m == 64 and not fp8_activations:
        dy = jnp.asarray(rng.standard_normal((110, n)), jnp.bfloat16)
        run_t = lambda w: gmm_quant_t(dy, w, group_sizes, out_dtype=jnp.float32, config=cfg)
        got_t = run_t(_poisoned_padding(qw))
        assert got_t.shape == (110, k) and np.isfinite(got_t).all()
        np.testing.assert_array_equal(got_t, run_t(plain))


def test_mxfp4_small_scales_one_multiply():
    """mxfp4 weights whose scale codes are all at most 128 are marked `small_scales` by
    quantize_weight and load_experts where the scales are concrete (not under jit), and not when
    a code is larger; the kernel's one-multiply path on them gives the two-multiply path's bits
    (both exact) on 16- and 64-row tiles, within bf16 rounding of the oracle; under debug_checks
    a false claim is refused."""
    from tests.test_weights import gpt_oss_mxfp4_tensors

    rng = np.random.default_rng()
    e, k, n = 2, 128, 96
    w = jnp.asarray(rng.standard_normal((e, k, n)) / np.sqrt(k), jnp.bfloat16)
    qw = quant.quantize_weight(w, "mxfp4")
    assert qw.small_scales and int(jnp.max(qw.scales)) <= quant.MX_SMALL_CODE
    big = quant.quantize_weight(w.at[1, 40, 7].set(20.0), "mxfp4")  # a block of |w| >= 16
    assert not big.small_scales and int(jnp.max(big.scales)) > quant.MX_SMALL_CODE
    traced = jax.jit(lambda w: quant.quantize_weight(w, "mxfp4"))(w)
    assert not traced.small_scales and quant.with_scale_bound(traced).small_scales
    for scale_range, small in (((112, 129), True), ((112, 132), False)):
        tensors = gpt_oss_mxfp4_tensors(rng, scale_range=scale_range, inter=64)
        stored = moe_pallas.load_experts(tensors, "gpt_oss", dequantize=False)
        assert stored["w_gate_up"].small_scales == stored["w_down"].small_scales == small

    x = jnp.asarray(rng.standard_normal((90, k)), jnp.bfloat16)
    sizes = jnp.array([70, 20], jnp.int32)
    want = gmm_oracle(x, qw.dequantize(jnp.float32), [70, 20], np.zeros((e, n)), None, np.ones(90))
    for block_m in (16, 64):
        cfg = BlockConfig(block_m=block_m, block_n=32, block_k=128, min_block_m=16)
        one, two = (
            np.asarray(gmm_quant(x, v, sizes, out_dtype=jnp.float32, config=cfg))
            for v in (qw, dataclasses.replace(qw, small_scales=False))
        )
        np.testing.assert_array_equal(one, two)
        assert rel_err(one, want) < 1e-5
    false_claim = dataclasses.replace(big, small_scales=True)
    with pytest.raises(ValueError, match="small_scales"), moe_pallas.debug_checks():
        moe_pallas.ragged_dot(x, false_claim, sizes)


@pytest.mark.parametrize(
    "fmt,activation",
    [
        # mxfp4, whose 64-row tiles swap: with each GLU layout and without
        ("mxfp4", None),
        ("mxfp4", "swiglu"),
        ("mxfp4", "gptoss"),
        # fp8 values' tiles stay x first whatever the epilogue (the epilogues on them: the fuzz
        # test and test_padded_rows_are_never_read): one GLU layout each
        ("fp8", "gptoss"),
        ("fp8_block", "swiglu"),
    ],
)
def test_weights_first_tiles_match_oracle(fmt, activation, monkeypatch):
    """BlockConfig.weights_first: the 64-row paths compute accᵀ = w · xᵀ (the weights the dot's
    first operand, 128 columns wide) and the 16/32-row paths x · w, within bf16 rounding of the
    oracle with gathered rows, bias, row scale, an empty group and rows past the groups; weight
    blocks narrower than 16 rows a warp stay x first, as do fp8 values' tiles (`gmm_quant`'s
    Tiling: they raced on the GPU)."""
    first_operand_rows = []
    dot = gmm_quant_module.plgpu.dot
    monkeypatch.setattr(
        gmm_quant_module.plgpu,
        "dot",
        lambda a, b, **kw: first_operand_rows.append(a.shape[0]) or dot(a, b, **kw),
    )
    # visits of 64 and 26 rows, and of 51: the 64-, 32- and 64-row paths; 9 rows past the groups
    run = _epilogue_case(fmt, activation, 192, 256, [90, 0, 51], 150)
    for block_n, swapped in ((128 if activation != "gptoss" else 64, True), (32, False)):
        first_operand_rows.clear()
        run(
            BlockConfig(block_m=64, block_n=block_n, block_k=64, min_block_m=16, weights_first=True)
        )
        assert (128 in first_operand_rows) == (swapped and fmt == "mxfp4"), first_operand_rows
        assert {16, 32} <= set(first_operand_rows)  # the short paths, x first


@pytest.mark.parametrize("fmt", ["fp8", "fp8_block"])
def test_fp8_gmm_keeps_rows_outside_float16s_range(fmt):
    """fp8 weights multiply in float16, lhs rows scaled by a power of two each: rows of bf16
    values far outside float16's range (2^±100), a zero row and a row with one large and many
    tiny values match the float64 oracle row by row, with no overflow or flush to zero."""
    rng = np.random.default_rng()
    e, k, n = 2, 96, 64
    w = jnp.asarray(rng.standard_normal((e, k, n)) / np.sqrt(k), jnp.bfloat16)
    qw = quant.quantize_weight(w, fmt)
    x = rng.standard_normal((6, k))
    x[0] *= 2.0**100
    x[1] *= 2.0**-100
    x[2] = 0
    x[3] *= 2.0**-40
    x[3, 5] = 3e4
    x = jnp.asarray(x, jnp.bfloat16)
    out = gmm_quant(
        x,
        qw,
        jnp.array([4, 2], jnp.int32),
        out_dtype=jnp.float32,
        config=BlockConfig(block_m=16, block_n=32, block_k=32, min_block_m=16),
    )
    want = gmm_oracle(
        np.asarray(x, np.float64),
        qw.dequantize(jnp.float32),
        [4, 2],
        np.zeros((e, n)),
        None,
        np.ones(6),
    )
    got = np.asarray(out, np.float64)
    assert np.isfinite(got).all()
    np.testing.assert_array_equal(got[2], 0)
    for r in (0, 1, 3, 4, 5):
        assert np.linalg.norm(got[r] - want[r]) <= 1e-5 * np.linalg.norm(want[r]), r


@pytest.mark.parametrize("per_column,paired", [(False, False), (True, False), (False, True)])
def test_fp8_block_scale_folded_into_64_row_tiles(per_column, paired, monkeypatch):
    """fp8_block on a 64-row tile multiplies each float16 weight by its float16 block scale
    (normalised per column by a power of two, restored after the K loop): scales spread over
    2^±20 between column blocks (or columns) and 2^-20..1 between K blocks of a column, and x
    rows at 2^±60, still give each row within 2e-3 of the float64 oracle, relative to the row's
    Σ |x w| (two float16 roundings a weight, under bf16's; relative to the sum itself, a row
    whose dominant column block cancels once measured 2.6e-3); the float32 partial-dot path (the
    16- and 32-row tiles) gives other bits on the same tile. paired: the byte-pair view, forced at this size."""
    if paired:
        monkeypatch.setattr(gmm_quant_module, "PAIRED_MIN_ELEMENTS", 0)
    rng = np.random.default_rng()
    e, k, n = 2, 320, 192  # 3 K blocks (the last 64 deep), 2 column blocks (the last 64 wide)
    w = jnp.asarray(rng.standard_normal((e, k, n)) / np.sqrt(k), jnp.bfloat16)
    qw = quant.quantize_weight(w, "fp8_block")
    scales = np.asarray(qw.scales, np.float64)
    if per_column:  # the loader's [E, K/128, N] form
        scales = np.repeat(scales, 128, axis=2)[:, :, :n]
    spread = 2.0 ** rng.integers(-20, 21, (e, 1, scales.shape[2]))
    spread = spread * 2.0 ** rng.uniform(-20, 0, (e, scales.shape[1], scales.shape[2]))
    qw = dataclasses.replace(qw, scales=jnp.asarray(scales * spread, jnp.float32))
    x = rng.standard_normal((80, k))
    x[3] *= 2.0**60
    x[70] *= 2.0**-60
    x = jnp.asarray(x, jnp.bfloat16)
    sizes = jnp.array([70, 10], jnp.int32)
    # min_block_m 16: the short visits (6 and 10 rows) run 16-row paths on the normalised scales
    cfg = BlockConfig(block_m=64, block_n=32, block_k=64, min_block_m=16)
    run = lambda: np.asarray(gmm_quant(x, qw, sizes, out_dtype=jnp.float32, config=cfg))
    folded = run()
    monkeypatch.setattr(gmm_quant_module, "FOLD_MIN_ROWS", 10**9)
    unfolded = run()
    dense, zeros, ones = qw.dequantize(jnp.float32), np.zeros((e, n)), np.ones(80)
    want = gmm_oracle(x, dense, [70, 10], zeros, None, ones)
    # Σ |x w| per output: each product's rounding is relative to it, whatever the sum cancels
    magnitude = gmm_oracle(
        np.abs(np.asarray(x, np.float64)), np.abs(dense), [70, 10], zeros, None, ones
    )
    assert np.isfinite(folded).all() and not np.array_equal(folded, unfolded)
    for r in range(80):
        norm = np.linalg.norm(magnitude[r])
        assert np.linalg.norm(folded[r] - want[r]) <= 2e-3 * norm, r
        assert np.linalg.norm(unfolded[r] - want[r]) <= 1e-5 * norm, r


@pytest.mark.parametrize(
    "fmt,activation,implementation,token_counts",
    [
        ("mxfp4", "gptoss", "pallas_triton", (1,)),
        ("fp8_block", "swiglu", "pallas_triton", (1, 6)),
        ("fp8", "gptoss", "xla", (1, 6)),
    ],
)
def test_moe_experts_quantised(fmt, activation, implementation, token_counts):
    """The block on quantised weights equals the float64 block on dequantize_experts(qparams)
    within bf16 rounding; T = 1 (the primal, GLU in the gmm epilogue) and an unused expert; at
    T = 6 the forward under differentiation and the gradients of x and topk_weight against the
    xla block on the dense weights (the backward's dequantised products are format-blind);
    gradients of the weights are refused."""
    rng = np.random.default_rng()
    num_experts, hidden, inter = 5, 64, 48  # H = 64: mxfp4's smallest K; I = 48 (no 64-multiple)
    if fmt == "mxfp4":
        inter = 64
    params = make_params(rng, num_experts, hidden, inter, biases=activation == "gptoss", scale=2.0)
    params = {k: jnp.asarray(v, jnp.bfloat16) for k, v in params.items()}
    qparams = moe_pallas.quantize_experts(params, fmt)
    dense = moe_pallas.dequantize_experts(qparams)
    run = lambda x, idx, wts, p, impl=implementation: moe_pallas.moe_experts(
        x, idx, wts, p, activation=activation, implementation=impl
    )

    # Each computation below one jit (eagerly, every op compiled on its own).
    @jax.jit
    def primal_and_dense(x, idx, wts, qparams, dense):  # the primal (GLU in the gmm epilogue)
        return run(x, idx, wts, qparams), run(x, idx, wts, dense, "xla")

    @jax.jit
    def under_grad(x, idx, wts, qparams, dense):
        """The forward under differentiation (h kept), the gradients of x and wts for cotangent
        out on qparams and on the dense weights (xla), and the dense forward."""
        out, vjp = jax.vjp(lambda x, wts: run(x, idx, wts, qparams), x, wts)
        dense_out, dense_vjp = jax.vjp(lambda x, wts: run(x, idx, wts, dense, "xla"), x, wts)
        return out, dense_out, vjp(out), dense_vjp(out)

    reference = jax.jit(moe_experts_reference, static_argnames=("activation", "dtype"))
    for num_tokens in token_counts:
        x = jnp.asarray(rng.standard_normal((num_tokens, hidden)), jnp.bfloat16)
        idx, wts = random_routing(rng, num_tokens, num_experts - 1, 2)  # expert 4 gets no rows
        if num_tokens == 1:
            out, dense_out = primal_and_dense(x, idx, wts, qparams, dense)
        else:
            out, dense_out, grads, dense_grads = under_grad(x, idx, wts, qparams, dense)
            for g, w in zip(grads, dense_grads):
                assert rel_err(g, w) < 3e-2
        with jax.enable_x64(True):
            want = reference(
                x,
                idx,
                wts,
                moe_pallas.dequantize_experts(qparams, jnp.float32),
                activation=activation,
                dtype=jnp.float64,
            )
        assert out.dtype == jnp.bfloat16 and rel_err(out, want) < BF16_BOUND
        assert rel_err(out, dense_out) < BF16_BOUND
    loss = lambda p: jnp.sum(run(x, idx, wts, p).astype(jnp.float32) ** 2)
    if (
        fmt != "mxfp4" and implementation == "xla"
    ):  # (jax.grad refuses mxfp4's integer leaves itself)
        with pytest.raises(TypeError, match="dequantize_experts"):
            jax.grad(loss)(qparams)


def test_ragged_dot_quantised_and_errors():
    rng = np.random.default_rng()
    w = jnp.asarray(rng.standard_normal((3, 128, 48)) / 8, jnp.bfloat16)
    qw = quant.quantize_weight(w, "mxfp4")
    x = jnp.asarray(rng.standard_normal((9, 128)), jnp.bfloat16)
    sizes = jnp.array([4, 0, 5], jnp.int32)
    dense = np.asarray(qw.dequantize(jnp.float32), np.float64)
    want = np.concatenate(
        [np.asarray(x[:4], np.float64) @ dense[0], np.asarray(x[4:], np.float64) @ dense[2]]
    )
    for impl in ("pallas_triton", "xla"):
        got = moe_pallas.ragged_dot(x, qw, sizes, implementation=impl)
        assert got.shape == (9, 48) and rel_err(got, want) < 5e-3
    dx = jax.grad(
        lambda x: jnp.sum(moe_pallas.ragged_dot(x, qw, sizes, implementation="pallas_triton"))
    )(x)
    dx_want = jax.grad(lambda x: jnp.sum(jax.lax.ragged_dot(x, qw.dequantize(), sizes)))(x)
    assert rel_err(dx, dx_want) < 1e-2
    with pytest.raises(ValueError, match="multiple of 64"):
        quant.quantize_weight(jnp.zeros((1, 96, 8)), "mxfp4")
    with pytest.raises(ValueError, match="fmt="):
        moe_pallas.quantize_experts({"w_down": w}, "int4")


@pytest.mark.parametrize("fmt,bound", [("fp8", 1e-3), ("fp8_block", 1e-5), ("mxfp4", 1e-5)])
def test_transposed_products_on_the_stored_weights(fmt, bound):
    """gmm_quant_t, the backward's lhs @ wᵀ on the weights as stored, against the float64 product
    with the exactly decoded weights (float32 out: fp8 rounds lhs · s to float16, 2^-11;
    fp8_block's bf16 lhs is exact in float16, mxfp4's decode exact in bf16): contraction and
    column tails (N = 200 against 64-deep steps; K = 136, mxfp4's 320, against 128-column tiles,
    mxfp4's 64 bytes of each half), an empty group, a one-row group, 16- and 32-row paths, a
    gathered lhs, and rows past the groups written as zeros (interpret mode pre-fills NaN);
    mxfp4 with one and with two scale multiplies, bit for bit. Then the gradient of ragged_dot
    runs it (no dense weight in the jaxpr), and what it does not take (per-column fp8_block
    scales, float32 lhs, fp8 at odd K, mxfp4 with float16 lhs) is refused by name."""
    rng = np.random.default_rng()
    e, k, n = 4, 320 if fmt == "mxfp4" else 136, 200
    qw = quant.quantize_weight(jnp.asarray(rng.standard_normal((e, k, n)), jnp.bfloat16), fmt)
    qw = quant.with_scale_bound(qw)
    assert qw.small_scales == (fmt == "mxfp4")
    sizes = [21, 0, 1, 40]
    rows = sum(sizes) + 5
    src = rng.integers(0, 30, rows)
    lhs = jnp.asarray(rng.standard_normal((30, n)), jnp.bfloat16)
    cfg = BlockConfig(block_m=32, block_n=128, block_k=64, min_block_m=16)
    run = lambda w: gmm_quant_t(
        lhs,
        w,
        jnp.array(sizes, jnp.int32),
        lhs_row_index=jnp.asarray(src, jnp.int32),
        out_dtype=jnp.float32,
        config=cfg,
    )
    got = run(qw)
    dense = np.asarray(qw.dequantize(jnp.float32), np.float64)
    want, start = np.zeros((rows, k)), 0
    for g, size in enumerate(sizes):
        rows_g = np.asarray(lhs, np.float64)[src[start : start + size]]
        want[start : start + size] = rows_g @ dense[g].T
        start += size
    assert got.shape == (rows, k) and np.isfinite(got).all()
    np.testing.assert_array_equal(got[start:], 0)
    assert rel_err(got, want) < bound
    if fmt == "mxfp4":
        np.testing.assert_array_equal(run(dataclasses.replace(qw, small_scales=False)), got)

    x = jnp.asarray(rng.standard_normal((9, k)), jnp.bfloat16)
    dot_sizes = jnp.array([4, 0, 5, 0], jnp.int32)
    dx_fn = jax.grad(
        lambda x: jnp.sum(moe_pallas.ragged_dot(x, qw, dot_sizes, implementation="pallas_triton"))
    )
    traced = jax.jit(dx_fn).trace(x)  # one trace for the jaxpr and the run
    assert f"gmm_t_{fmt}" in str(traced.jaxpr)
    dx_want = jax.grad(lambda x: jnp.sum(jax.lax.ragged_dot(x, qw.dequantize(), dot_sizes)))
    assert rel_err(traced.lower().compile()(x), jax.jit(dx_want)(x)) < 1e-2

    from moe_pallas.kernels.gmm_quant_t import supports

    w = jnp.zeros((2, 128, 272), jnp.bfloat16)
    assert supports(quant.quantize_weight(w, fmt), jnp.bfloat16)
    assert not supports(quant.quantize_weight(w, fmt), jnp.float32)
    assert supports(quant.quantize_weight(w, "fp8"), jnp.float16)
    assert not supports(quant.quantize_weight(w, "mxfp4"), jnp.float16)
    assert not supports(quant.quantize_weight(w[:, :127], "fp8"), jnp.bfloat16)
    fp8_values = jnp.zeros((e, n, k), jnp.float8_e4m3fn)
    per_column = quant.QuantizedWeight(
        fp8_values, jnp.ones((e, 2, n), jnp.float32), "fp8_block", jnp.bfloat16
    )
    assert not supports(per_column, jnp.bfloat16)
    with pytest.raises(ValueError, match="Dequantise the weight"):
        gmm_quant_t(lhs, per_column, jnp.array(sizes, jnp.int32))


def test_layer_and_checkpoints_kept_as_stored():
    """load_experts(dequantize=False): gpt-oss MXFP4 and per-expert FP8 (I = 136: per-column
    factors) as stored, decoding bit for bit to the dense load; an NNX layer holding them runs."""
    from flax import nnx

    from tests.test_weights import PREFIX, fp8_tensors, gpt_oss_mxfp4_tensors

    def finite(tensors):  # e4m3fn has no inf: the fixture's values past 448 cast to NaN
        return {k: jnp.where(jnp.isnan(v), 0, v).astype(v.dtype) for k, v in tensors.items()}

    rng = np.random.default_rng()
    for tensors, layout, prefix, fmt in (
        (gpt_oss_mxfp4_tensors(rng, inter=64), "gpt_oss", "", "mxfp4"),
        (finite(fp8_tensors(rng)), "per_expert", PREFIX, "fp8_block"),
    ):
        stored = moe_pallas.load_experts(tensors, layout, prefix=prefix, dequantize=False)
        dense = moe_pallas.load_experts(tensors, layout, prefix=prefix)
        for name in ("w_gate_up", "w_down"):
            assert stored[name].fmt == fmt and stored[name].shape == dense[name].shape
            np.testing.assert_array_equal(
                np.asarray(stored[name].dequantize(), np.float32),
                np.asarray(dense[name], np.float32),
            )
    # the last (FP8 SwiGLU) experts in an NNX layer: forward as the layer on the dense weights
    num_experts, hidden, two_inter = dense["w_gate_up"].shape
    layer = moe_pallas.MoE(
        hidden_size=hidden,
        intermediate_size=two_inter // 2,
        num_experts=num_experts,
        top_k=2,
        param_dtype=jnp.bfloat16,
        rngs=nnx.Rngs(0),
    )
    x = jnp.asarray(rng.standard_normal((3, hidden)), jnp.bfloat16)
    moe_pallas.set_expert_params(layer, dense)
    want = layer(x)
    moe_pallas.set_expert_params(layer, stored)
    assert quant.is_quantized(layer.w_gate_up[...])
    assert rel_err(layer(x), want) < BF16_BOUND
    with pytest.raises(ValueError, match="dequantize=True"):
        moe_pallas.load_experts(gpt_oss_mxfp4_tensors(rng), "gpt_oss", dequantize=False)


def _run_ptx(asm: str, *words: int) -> int:
    """Executes the integer, bf16x2 and fp8 conversion instructions of an
    `elementwise_inline_asm` block on 32-bit inputs ($1, $2, ...) and returns its 32-bit output
    ($0)."""
    regs = {f"${i + 1}": word for i, word in enumerate(words)}

    def val(x):
        return regs[x] if x in regs else int(x, 0)

    def bf16(bits):
        return float(np.array([bits], np.uint16).view(jnp.bfloat16).astype(np.float64)[0])

    for line in asm.strip("{}\n").splitlines():
        op, args = line.rstrip(";").split(None, 1)
        args = [a.strip() for a in args.split(",")]
        if op == ".reg":
            continue
        if op == "mov.b32" and args[0].startswith("{"):  # {lo, hi} = the 16-bit halves
            lo, hi = (a.strip("{} ") for a in args[:2])
            regs[lo], regs[hi] = val(args[2]) & 0xFFFF, val(args[2]) >> 16
            continue
        d, *src = args
        if op == "mov.b32":
            regs[d] = val(src[0])
        elif op == "cvt.rn.f16x2.e4m3x2":  # byte i of the 16-bit source -> half i, exactly
            codes = np.array([val(src[0]) & 0xFF, val(src[0]) >> 8], np.uint8)
            bits = codes.view(jnp.float8_e4m3fn).astype(np.float16).view(np.uint16)
            regs[d] = int(bits[0]) | int(bits[1]) << 16
        elif op == "prmt.b32":  # byte i of d = byte selector[i] of {b, a}, or its sign spread
            a, b, sel = (val(s) for s in src)
            pool = a | (b << 32)
            picked = [(pool >> (8 * ((sel >> (4 * i)) & 7))) & 0xFF for i in range(4)]
            spread = [(sel >> (4 * i)) & 8 for i in range(4)]  # msb of a selector: sign mode
            regs[d] = sum(
                ((0xFF if p & 0x80 else 0) if s else p) << (8 * i)
                for i, (p, s) in enumerate(zip(picked, spread))
            )
        elif op == "shl.b32":
            regs[d] = (val(src[0]) << val(src[1])) & 0xFFFFFFFF
        elif op == "shr.b32":
            regs[d] = val(src[0]) >> val(src[1])
        elif op == "or.b32":
            regs[d] = val(src[0]) | val(src[1])
        elif op == "and.b32":
            regs[d] = val(src[0]) & val(src[1])
        elif op == "lop3.b32":  # bitwise LUT over (a, b, c): bit = lut[a<<2 | b<<1 | c]
            a, b, c, lut = (val(s) for s in src)
            regs[d] = sum(
                ((lut >> (((a >> i & 1) << 2) | ((b >> i & 1) << 1) | (c >> i & 1))) & 1) << i
                for i in range(32)
            )
        elif op == "mul.rn.bf16x2":  # a power of two times a decoded value: exact (NaN stays)
            a, b = val(src[0]), val(src[1])
            halves = [bf16(a >> s & 0xFFFF) * bf16(b >> s & 0xFFFF) for s in (0, 16)]
            bits = np.array(halves, np.float64).astype(jnp.bfloat16).view(np.uint16)
            regs[d] = int(bits[0]) | int(bits[1]) << 16
        else:
            raise AssertionError(f"instruction {op} has no emulation here")
    return regs["$0"]


def _decode_words(asm: str, byte_values, *more: int) -> np.ndarray:
    """The 16-bit results (uint16) `asm` makes of `byte_values`, 4 bytes to a little-endian 32-bit
    word ($1), two per word in element order; `more`, the same 32-bit inputs $2.. for each."""
    got = []
    for word in np.ascontiguousarray(byte_values, np.uint8).view(np.uint32).reshape(-1):
        out = _run_ptx(asm, int(word), *more)
        got += [out & 0xFFFF, out >> 16]
    return np.array(got, np.uint16)


@pytest.mark.parametrize("quarter", gmm_quant_module.MX_QUARTERS)
@pytest.mark.parametrize("scale", [0, 1, 2, 100, 127, 128, 129, 200, 252])
def test_e2m1_ptx_decodes_packed_codes(quarter, scale):
    """The GPU's inline PTX decode (text as compiled, emulated instruction by instruction) on words
    packed by `mx_words.mxfp4_pack`, with e8m0 code `scale`'s two factors, and its one factor
    where scale <= 128 (`small_scales`): each quarter's 2 values of a word (L0 L1, L2 L3, H0 H1
    or H2 H3) are their codes' e2m1 values times 2^(scale - 127) in bf16, exactly, for every code
    at every position (and random words), bit for bit as the interpret-mode decode where that
    keeps clear of subnormals; unpack inverts pack."""
    rng = np.random.default_rng()
    every = np.repeat(np.arange(16), 4)[None, :] * np.ones((8, 1), np.int64)  # code c at slot i
    lo = np.concatenate([every.reshape(-1, 4), rng.integers(0, 16, (512, 4))]).reshape(-1)
    hi = np.concatenate([np.roll(every, 1, 0).reshape(-1, 4), rng.integers(0, 16, (512, 4))])
    hi = hi.reshape(-1)
    packed = np.asarray(mx_words.mxfp4_pack(jnp.asarray(lo), jnp.asarray(hi)))
    lo_back, hi_back = mx_words.mxfp4_unpack(jnp.asarray(packed))
    np.testing.assert_array_equal(np.asarray(lo_back), lo)
    np.testing.assert_array_equal(np.asarray(hi_back), hi)
    codes = (lo if quarter.startswith("lo") else hi).reshape(-1, 2, 2)  # [word, pair, value]
    codes = codes[:, int(quarter.endswith("23"))].reshape(-1)
    want = e2m1_oracle(codes) * 2.0 ** (scale - 127)
    for small in (False, True) if scale <= quant.MX_SMALL_CODE else (False,):
        factors = gmm_quant_module.e8m0_factors(jnp.asarray([scale], jnp.uint8), small)
        assert len(factors) == (1 if small else 2)
        bf16x2 = [int(np.asarray(f).view(np.uint16)[0]) * 0x10001 for f in factors]
        ptx = gmm_quant_module.E2M1_PTX[quarter, len(factors)]
        got = _decode_words(ptx, packed, *bf16x2)
        np.testing.assert_array_equal(got.view(jnp.bfloat16).astype(np.float64), want)
        np.testing.assert_array_equal(np.signbit(got.view(jnp.bfloat16)), codes >= 8)
        if scale >= 2:  # 0.5 · 2^(scale - 127) is a normal number (XLA on CPU flushes those)
            pairs = jnp.asarray(packed.view(np.uint16))[None]
            interpreted = gmm_quant_module.e2m1(pairs, quarter, factors)[0]
            np.testing.assert_array_equal(np.asarray(interpreted).view(np.uint16), got)


@pytest.mark.parametrize("half", ["low", "high"])
def test_e4m3_pair_ptx_decodes_every_byte(half):
    """The byte-pair view's inline PTX (text as compiled, emulated instruction by instruction):
    a 32-bit register holds two uint16 pairs, and the result's halves are the e4m3 values of the
    first pair's bytes ("low") or the second's ("high") in float16, for every byte at every
    position of the word (and random words), bit for bit as the interpret-mode decode (NaN codes
    NaN)."""
    rng = np.random.default_rng()
    every = np.arange(256)[:, None, None] * np.eye(4, dtype=np.int64)[None]  # byte b at slot i
    words = np.concatenate([every.reshape(-1, 4), rng.integers(0, 256, (512, 4))]).astype(np.uint8)
    pairs = words.view(np.uint16).reshape(-1)  # little-endian: pair i of a word is bytes 2i, 2i+1
    got = _decode_words(gmm_quant_module.E4M3_PAIR_PTX[half], words).view(np.float16)
    codes = words[:, 2:] if half == "high" else words[:, :2]  # [word, the 2 bytes of its pair]
    want = codes.reshape(-1).view(jnp.float8_e4m3fn).astype(np.float16)
    np.testing.assert_array_equal(got, want)
    interpreted = gmm_quant_module._e4m3_pair_f16(jnp.asarray(pairs)[None], half)[0]
    np.testing.assert_array_equal(np.asarray(interpreted), got)


@pytest.mark.parametrize("small", [False, True])
def test_e8m0_factors_of_every_code(small):
    """The kernel's bf16 factors of each e8m0 code c (exponent-field placement) are finite powers
    of two of product 2^(c - 1), which times the decode's e2m1 · 2^-126 is the scale
    2^(c - 127): two for all 256 codes, or one for the codes up to MX_SMALL_CODE (128)."""
    codes = np.arange(quant.MX_SMALL_CODE + 1 if small else 256)
    factors = gmm_quant_module.e8m0_factors(jnp.asarray(codes, jnp.uint8), small)
    assert len(factors) == (1 if small else 2)
    factors = [np.asarray(f).astype(np.float64) for f in factors]
    for f in factors:
        assert np.isfinite(f).all()
        np.testing.assert_array_equal(np.frexp(f)[0], 0.5)
    np.testing.assert_array_equal(np.prod(factors, axis=0), np.ldexp(1.0, codes - 1))


def test_each_format_fits_the_tiles_k_step():
    """fp8 takes up to 256 K a step, mxfp4 64-256 (whole 32-byte sub-block pairs), fp8_block at
    most 128 (one scale row a step): a tile asking for more, from the entries fp8_block shares with
    fp8, reads the same weight bytes a step as wider N."""
    cfg = BlockConfig(16, 32, 256, 8, 4, 4)
    fit = gmm_quant_module._format_tile
    assert (fit("fp8", cfg).block_n, fit("fp8", cfg).block_k) == (32, 256)
    assert (fit("fp8_block", cfg).block_n, fit("fp8_block", cfg).block_k) == (64, 128)
    assert fit("fp8", dataclasses.replace(cfg, block_k=512)).block_k == 256
    assert fit("mxfp4", dataclasses.replace(cfg, block_k=16)).block_k == 64
    assert fit("mxfp4", dataclasses.replace(cfg, block_k=512)).block_k == 256
    small = dataclasses.replace(cfg, block_k=64)
    assert all(fit(f, small) == small for f in quant.FORMATS)


@pytest.mark.parametrize(
    "k,block_m,paired", [(176, 16, True), (176, 32, True), (170, 16, False), (176, 64, False)]
)
def test_decode_tiles_read_fp8_as_byte_pairs(k, block_m, paired, monkeypatch):
    """fp8 calls of tiles up to 32 rows read the values as byte pairs when K is a multiple of 4
    and as bytes otherwise, as do the wgmma tiles (64 rows); each within bf16 rounding of the
    oracle."""
    seen = []
    decode = gmm_quant_module._e4m3_pair_f16
    monkeypatch.setattr(
        gmm_quant_module, "_e4m3_pair_f16", lambda *a: seen.append(a[1]) or decode(*a)
    )
    rng = np.random.default_rng()
    w = jnp.asarray(rng.standard_normal((2, k, 96)) / np.sqrt(k), jnp.bfloat16)
    qw = quant.quantize_weight(w, "fp8")
    x = jnp.asarray(rng.standard_normal((40, k)), jnp.bfloat16)
    cfg = BlockConfig(block_m=block_m, block_n=32, block_k=64, min_block_m=16)
    out = gmm_quant(x, qw, jnp.array([25, 15], jnp.int32), out_dtype=jnp.float32, config=cfg)
    want = gmm_oracle(x, qw.dequantize(jnp.float32), [25, 15], np.zeros((2, 96)), None, np.ones(40))
    assert rel_err(out, want) < 1e-5
    assert bool(seen) == paired


def test_paired_view_needs_k_a_multiple_of_4(monkeypatch):
    """fp8 weights read as byte pairs along K (over 2^31 bytes, forced here) with K not a multiple
    of 4 (a word of two pairs): a ValueError naming K and the fix, not a misread byte."""
    monkeypatch.setattr(gmm_quant_module, "PAIRED_MIN_ELEMENTS", 0)
    qw = quant.quantize_weight(jnp.ones((2, 34, 64), jnp.bfloat16), "fp8")
    with pytest.raises(ValueError, match="multiple of 4.*K=34"):
        gmm_quant(jnp.ones((4, 34), jnp.bfloat16), qw, jnp.array([2, 2], jnp.int32))


GPTOSS_EXPERTS, GPTOSS_HIDDEN = 128, 2880  # and I = 2880: a K and an N that 128 does not divide


def _gptoss_sized_experts(rng, fmt):
    """gpt-oss's experts at full size on the device, quantised to fmt, and their exact decode."""
    from tests.helpers import device_expert_params

    h = GPTOSS_HIDDEN
    params = device_expert_params(rng, GPTOSS_EXPERTS, h, h, jnp.bfloat16, (0.1, 0.1))
    qparams = moe_pallas.quantize_experts(params, fmt)
    del params
    return qparams, moe_pallas.dequantize_experts(qparams)


@FULL_SHAPES
@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["fp8", "fp8_block", "mxfp4"])
def test_gptoss_sized_quantised_layer(fmt):
    """gpt-oss's experts at full size (E = 128, H = I = 2880: a K and an N that 128 does not
    divide) quantised, through moe_experts on the GPU ("auto"), against the bf16 layer on
    dequantize_experts(qparams) within the documented bound, at T = 1 (decode), T = 64 and
    T = 2048 (64 rows per expert: the table's 128-row tiles); mxfp4 with one scale multiply a
    pair (`small_scales`, as quantize_experts marks these weights) and with two."""
    from tests.helpers import device_normal

    rng = np.random.default_rng(3)
    qparams, dense = _gptoss_sized_experts(rng, fmt)
    experts, hidden, top_k = GPTOSS_EXPERTS, GPTOSS_HIDDEN, 4
    variants = [qparams]
    if fmt == "mxfp4":
        assert qparams["w_gate_up"].small_scales and qparams["w_down"].small_scales
        two = {
            k: dataclasses.replace(v, small_scales=False)
            for k, v in qparams.items()
            if quant.is_quantized(v)
        }
        variants.append({**qparams, **two})
    layer = jax.jit(
        lambda x, idx, wts, p: moe_pallas.moe_experts(x, idx, wts, p, activation="gptoss")
    )
    for tokens in (1, 64, 2048):
        x = device_normal(rng, (tokens, hidden), jnp.bfloat16)
        idx, wts = random_routing(rng, tokens, experts, top_k)
        want = layer(x, idx, wts, dense)
        for v, stored in enumerate(variants):
            out = layer(x, idx, wts, stored)
            assert out.dtype == jnp.bfloat16 and rel_err(out, want) < BF16_BOUND, (tokens, fmt, v)


@FULL_SHAPES
@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["fp8", "mxfp4"])
def test_swiglu256_sized_quantised_weights(fmt):
    """SwiGLU-256's gate_up as stored: fp8 values [256, 4096, 4096] are 2^32 bytes, past int32
    element offsets (read as byte pairs along K), mxfp4's [256, 4096, 2048] are 2^31 (int32
    offsets, just). Random stored bytes (no dense weight is quantised: its float32 temporaries would be
    tens of GiB); rows of the first and the last experts (offsets near 0 and near the end)
    against float64 products with each hit expert's exactly decoded weight, the forward's gmm
    and the backward's product with wᵀ."""
    e, h, n = 256, 4096, 4096
    keys = jax.random.split(jax.random.key(0), 3)
    if fmt == "fp8":  # bit 0 cleared: no NaN codes (0x7F, 0xFF)
        values = random_bytes(keys[0], (e, n, h)) & 0xFE
        values = jax.lax.bitcast_convert_type(values, jnp.float8_e4m3fn)
        scales = jax.random.uniform(keys[1], (e, n), jnp.float32, 1e-4, 1e-3)
    else:
        values = random_bytes(keys[0], (e, n, h // 2))
        scales = jax.random.randint(keys[1], (e, h // 32, n), 118, 124).astype(jnp.uint8)
    w = quant.with_scale_bound(quant.QuantizedWeight(values, scales, fmt, jnp.bfloat16))
    assert w.small_scales == (fmt == "mxfp4")  # codes 118-123: one multiply a pair
    experts = [0, 1, 127, 128, 200, 254, 255]
    sizes = np.zeros(e, np.int64)
    sizes[experts] = [3, 1, 2, 5, 2, 1, 4]
    x = jax.random.normal(keys[2], (int(sizes.sum()), h), jnp.bfloat16)
    out = np.asarray(gmm_quant(x, w, jnp.asarray(sizes, jnp.int32), activation="swiglu"))
    dh = jax.random.normal(keys[2], (int(sizes.sum()), n), jnp.bfloat16)
    out_t = np.asarray(gmm_quant_t(dh, w, jnp.asarray(sizes, jnp.int32)))
    bounds = np.cumsum([0, *sizes])
    for g in experts:
        one = quant.QuantizedWeight(values[g : g + 1], scales[g : g + 1], fmt, jnp.bfloat16)
        rows = slice(bounds[g], bounds[g + 1])
        zero_bias, unit_scale = np.zeros((1, n)), np.ones(sizes[g])
        want = gmm_oracle(
            x[rows], one.dequantize(jnp.float32), [sizes[g]], zero_bias, "swiglu", unit_scale
        )
        assert rel_err(out[rows], want) < 5e-3, g
        # the backward's product with wᵀ (`kernels.gmm_quant_t`), on byte pairs too
        dense = np.asarray(one.dequantize(jnp.float32), np.float64)[0]
        want_t = np.asarray(dh[rows], np.float64) @ dense.T
        assert rel_err(out_t[rows], want_t) < 5e-3, g


@FULL_SHAPES
@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["fp8", "fp8_block", "mxfp4"])
def test_gptoss_sized_quantised_gradients(fmt):
    """Gradients of x and the routing weights through gpt-oss's full-size experts as stored ("auto"
    on the GPU: the backward's products with wᵀ on `kernels.gmm_quant_t`, no dense weight) against
    those through the bf16 layer on dequantize_experts(qparams), at T = 64 and T = 2048."""
    from moe_pallas.kernels.gmm_quant_t import supports
    from tests.helpers import device_normal

    rng = np.random.default_rng(4)
    qparams, dense = _gptoss_sized_experts(rng, fmt)
    experts, hidden, top_k = GPTOSS_EXPERTS, GPTOSS_HIDDEN, 4
    assert supports(qparams["w_gate_up"], jnp.bfloat16)

    def grads(x, idx, wts, p):
        loss = lambda x, wts: jnp.sum(
            moe_pallas.moe_experts(x, idx, wts, p, activation="gptoss").astype(jnp.float32) ** 2
        )
        return jax.grad(loss, argnums=(0, 1))(x, wts)

    grads = jax.jit(grads)
    for tokens in (64, 2048):
        x = device_normal(rng, (tokens, hidden), jnp.bfloat16)
        idx, wts = random_routing(rng, tokens, experts, top_k)
        for got, want in zip(grads(x, idx, wts, qparams), grads(x, idx, wts, dense)):
            assert rel_err(got, want) < 3e-2, (tokens, fmt)


@FULL_SHAPES
@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["fp8", "fp8_block", "mxfp4"])
@pytest.mark.parametrize("shape", [(128, 2880, 5760), (64, 4096, 4096)])
def test_quantised_gmm_repeated_at_64_rows_per_expert(fmt, shape):
    """ragged_dot on quantised weights at 64 rows per expert (the table's 64-row tiles; mxfp4's
    swap operands: `gmm_quant`'s Tiling), called four times, each output finite, bitwise the first
    call's and within bf16 rounding of a float32 einsum on the exactly decoded weights: a race
    between a tile's loads and its asynchronous wgmma shows as outputs that differ between calls
    (fp8's swapped tiles on an H100 gave NaN in 3 of 3 calls at [128, 2880, 5760])."""
    from tests.helpers import device_normal

    e, k, n = shape
    rng = np.random.default_rng(5)
    w = quant.quantize_weight(device_normal(rng, (e, k, n), jnp.bfloat16, 0.05), fmt)
    w = w if fmt == "mxfp4" else quant.with_row_pitch(w)
    x = device_normal(rng, (e * 64, k), jnp.bfloat16)
    want = jax.jit(
        lambda x, w: jnp.einsum("emk,ekn->emn", x.astype(jnp.float32).reshape(e, 64, k), w)
    )(x, w.dequantize(jnp.float32)).reshape(e * 64, n)
    product = jax.jit(lambda x, w: moe_pallas.ragged_dot(x, w, jnp.full((e,), 64, jnp.int32)))
    first = product(x, w)
    assert bool(jnp.isfinite(first).all()), (fmt, shape)
    assert rel_err(first, want) < 5e-3, (fmt, shape)
    for call in range(3):
        assert bool(jnp.array_equal(product(x, w), first)), (call, fmt, shape)


@pytest.mark.parametrize(
    "fmt,element", [("fp8_block", "float8_e4m3fn"), ("mxfp4", "float4_e2m1fn")]
)
def test_table_entries_keyed_by_stored_element_type(fmt, element, tmp_path, monkeypatch):
    """A gmm on quantised weights takes the table entry of its stored element type over the "*"
    one, and a bf16 gmm of the same shape does not."""
    path = tmp_path / "tuning.json"
    shutil.copy(tuning.TABLE_PATH, path)
    entry = {"backend": "pallas_triton", "kernel": "gmm", "dtype": element, "k": "*", "n": "*"}
    config = {"block_m": 16, "block_n": 32, "block_k": 64}
    tuning.write_entries([entry | {"rows": "tiny", "config": config}], "NVIDIA H200", path=path)
    monkeypatch.setattr(tuning, "TABLE_PATH", path)
    seen = {}
    monkeypatch.setattr(
        pallas_triton, "_gmm_quant", lambda *a, config, **kw: seen.setdefault("q", config)
    )
    monkeypatch.setattr(
        pallas_triton, "_gmm", lambda *a, config, **kw: seen.setdefault("bf16", config)
    )
    w = jnp.ones((4, 128, 256), jnp.bfloat16)
    x, sizes = jnp.ones((8, 128), jnp.bfloat16), jnp.array([2, 2, 2, 2], jnp.int32)
    pallas_triton.gmm(x, quant.quantize_weight(w, fmt), sizes)
    pallas_triton.gmm(x, w, sizes)
    assert (seen["q"].block_n, seen["q"].block_k) == (32, 64)
    assert (seen["bf16"].block_n, seen["bf16"].block_k) != (32, 64)
