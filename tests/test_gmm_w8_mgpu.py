"""fp8 weights converted in registers on Mosaic GPU (`kernels.gmm_w8_mgpu`): interpret mode against
float64 on the decoded weights (interpret mode fills outputs with NaN, so every row written is
checked), errors, and gpt-oss's and SwiGLU-256's products lowering for the H100 (layout inference
and the shared-memory budget are checked there)."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from moe_pallas import quant
from moe_pallas.kernels.gmm_w8_mgpu import W8Config, check, default_config, gmm_w8
from tests.test_quant import gmm_oracle, rel_err


def _padded_with_nan(qw, extra=64):
    """qw with each row padded past its K values: zeros up to the next multiple of 128 (a K tail's
    last box reads them, against x's zero-filled columns), then NaN bytes, which make NaN if
    read."""
    k = qw.shape[1]
    values = jnp.pad(qw.values[:, :, :k], ((0, 0), (0, 0), (0, -k % 128)))
    values = jnp.pad(values, ((0, 0), (0, 0), (0, extra)), constant_values=jnp.nan)
    return dataclasses.replace(qw, values=values, k=k)


@pytest.mark.parametrize(
    "activation,k,n_out,sizes,block_m,pad",
    [
        # unaligned group starts, an empty group, rows past the groups, two column tiles of two
        # consumers; 64-token boxes
        (None, 256, 256, [70, 0, 9, 49], 64, True),
        # 16-token boxes (decode): a group over several boxes, groups sharing a box
        (None, 128, 128, [5, 0, 37, 2], 16, True),
        ("swiglu", 256, 128, [1], 16, True),  # T = 1: x padded to one box
        # K and N tails (gpt-oss's 2880): the last K box zero-filled past K, the second consumer
        # of the last column tile past N (its stores clipped); gpt-oss's interleaved columns
        ("gptoss", 192, 192, [3, 0, 40, 11], 32, True),
        ("gptoss", 192, 64, [0, 33], 64, False),  # rows unpadded: the next half's values, times 0
        ("swiglu", 192, 192, [17, 5], 32, False),  # the gate tile's K tail reads up rows
    ],
)
def test_gmm_w8_matches_oracle(activation, k, n_out, sizes, block_m, pad):
    """fp8 weights (per-column scales) against float64 on the decoded weights within one bf16
    rounding, bias and row scale, x rows of very different magnitudes (float16 with a power of two
    each); rows past the groups are zero."""
    rng = np.random.default_rng()
    parts = 2 if activation else 1
    n = parts * n_out
    w = jnp.asarray(rng.standard_normal((len(sizes), k, n)) / np.sqrt(k), jnp.bfloat16)
    qw = quant.quantize_weight(w, "fp8")
    qw = _padded_with_nan(qw) if pad else qw
    m = sum(sizes) + 3
    x = rng.standard_normal((m, k)) * 2.0 ** rng.integers(-30, 30, (m, 1))
    x = jnp.asarray(x, jnp.bfloat16)
    bias = jnp.asarray(rng.standard_normal((len(sizes), n)), jnp.float32)
    row_scale = jnp.asarray(rng.random(m) + 0.5, jnp.float32)
    got = gmm_w8(
        x,
        qw,
        jnp.asarray(sizes, jnp.int32),
        bias=bias,
        activation=activation,
        row_scale=row_scale,
        config=W8Config(block_m=block_m, num_stages=2),
    )
    want = gmm_oracle(x, qw.dequantize(jnp.float32), sizes, bias, activation, row_scale)
    assert got.shape == (m, n_out) and got.dtype == jnp.bfloat16
    rows = sum(sizes)
    for r in range(rows):  # row by row: the rows' magnitudes differ by up to 2^60
        assert rel_err(got[r], want[r]) < 5e-3, r
    np.testing.assert_array_equal(np.asarray(got[rows:], np.float32), 0)


def test_gmm_w8_refuses_what_it_cannot_tile():
    """check names the limit; gmm_w8 raises it with the fallback."""
    assert "format" in check(256, 256, "fp8_block", None)
    assert "multiple of 64" in check(2880, 2880 + 32, "fp8", None)
    assert "stored rows" in check(256, 256, "fp8", None, pitch=288)
    assert check(2880, 2880, "fp8", "gptoss", pitch=3072) == ""
    w = quant.quantize_weight(jnp.ones((1, 96, 64), jnp.bfloat16), "fp8")
    with pytest.raises(ValueError, match='implementation="pallas_triton"'):
        gmm_w8(jnp.ones((4, 96), jnp.bfloat16), w, jnp.array([4], jnp.int32))
    with pytest.raises(TypeError, match="bf16 or float16"):
        gmm_w8(jnp.ones((4, 96), jnp.float32), w, jnp.array([4], jnp.int32))


def test_default_config_follows_the_mean_group():
    """Boxes of 16 tokens at decode sizes, 64 from 33 rows per group; 3 ring slots with a GLU."""
    assert default_config(128 * 4, 128, None) == W8Config(block_m=16, num_stages=4)
    assert default_config(128 * 30, 128, "gptoss") == W8Config(block_m=32, num_stages=3)
    assert default_config(128 * 64, 128, None).block_m == 64
    assert default_config(128 * 512, 128, None).block_m == 64


@pytest.mark.parametrize("activation,tokens", [(None, 16), ("gptoss", 8192)])
def test_gmm_w8_lowers_for_the_h200(activation, tokens):
    """gpt-oss's down and gate_up products (K = N = 2880: 64-byte rows, the last column tile half
    past N) lower for the H200 at 16- and 64-token boxes: Mosaic GPU's layout inference and
    shared-memory budget run there."""
    from tests.test_lowering import SDS, lower_for_h200

    experts, k, n_out = 128, 2880, 2880
    parts = 2 if activation else 1

    def product(x, values, scales, sizes):
        w = quant.QuantizedWeight(values, scales, "fp8", jnp.bfloat16, k=k)
        return gmm_w8(x, w, sizes, activation=activation)

    text = lower_for_h200(
        product,
        SDS((tokens * 4, k), jnp.bfloat16),
        SDS((experts, parts * n_out, 3072), jnp.float8_e4m3fn),
        SDS((experts, parts * n_out), jnp.float32),
        SDS((experts,), jnp.int32),
    )
    assert text.count("mosaic_gpu_v2") == 1
