"""The Pallas Triton kernels lower for an H200 on this CPU machine (ahead-of-time, no GPU).

Lowering runs Pallas's Triton lowering in full: unsupported block shapes, masks or ops fail here,
before a GPU run would. (Triton's own compile to PTX, e.g. a shared-memory overflow, happens later
on the GPU and is not covered.) Inputs are abstract shapes: the seed workloads at full size cost
no memory.
"""

import functools
import re

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AbstractDevice, AbstractMesh

from moe_pallas import moe_experts, ragged_dot, tgmm

SDS = jax.ShapeDtypeStruct
H200 = AbstractMesh((1,), ("x",), abstract_device=AbstractDevice("NVIDIA H200", 132, "gpu"))
WORKLOADS = {  # (H, I, E, k, biases)
    "gptoss": (2880, 2880, 128, 4, True),
    "swiglu": (4096, 2048, 256, 8, False),
}


def lower_for_h200(fn, *args) -> str:
    with jax.sharding.use_abstract_mesh(H200):
        text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    return text


def triton_calls(text: str) -> int:
    return text.count("__gpu$xla.gpu.triton")


def _layer_args(activation, tokens):
    hidden, inter, experts, top_k, biases = WORKLOADS[activation]
    bf16 = jnp.bfloat16
    params = {
        "w_gate_up": SDS((experts, hidden, 2 * inter), bf16),
        "w_down": SDS((experts, inter, hidden), bf16),
    }
    if biases:
        params |= {
            "b_gate_up": SDS((experts, 2 * inter), bf16),
            "b_down": SDS((experts, hidden), bf16),
        }
    return (
        SDS((tokens, hidden), bf16),
        SDS((tokens, top_k), jnp.int32),
        SDS((tokens, top_k), jnp.float32),
        params,
    )


def _layer(activation, implementation, grad):
    layer = functools.partial(moe_experts, activation=activation, implementation=implementation)
    if not grad:
        return layer
    loss = lambda x, i, w, p: jnp.sum(layer(x, i, w, p).astype(jnp.float32))
    return jax.grad(loss, argnums=(0, 2, 3))


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("tokens", [1, 2293])
@pytest.mark.parametrize("activation", sorted(WORKLOADS))
def test_fused_layer_lowers_to_triton(activation, tokens, grad):
    layer = _layer(activation, "pallas_triton", grad)
    text = lower_for_h200(layer, *_layer_args(activation, tokens))
    # forward: gate_up gmm, down gmm, combine; backward adds gmm_t x2 (g and dx), tgmm x2 (+ bias
    # sums), combine
    assert triton_calls(text) >= (8 if grad else 3)


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("activation", sorted(WORKLOADS))
def test_fused_layer_lowers_to_mosaic_gpu(activation, grad):
    """implementation="mosaic_gpu" at seed shapes, T = 2293 (T·k rows off the 8-row TMA boxes):
    the matmuls lower to Mosaic GPU; combine and the bias sums stay Triton."""
    text = lower_for_h200(_layer(activation, "mosaic_gpu", grad), *_layer_args(activation, 2293))
    kernels = text.count("mosaic_gpu_v2"), triton_calls(text)
    # forward: gate_up, down (Mosaic GPU) + combine; backward adds tgmm x2 and the gmm_t of g and
    # dx (Mosaic GPU), the second combine and the bias sums (Triton)
    assert kernels[0] >= (6 if grad else 2) and kernels[1] >= (2 if grad else 1), kernels


def test_ragged_dot_and_tgmm_lower_to_triton():
    lhs, rhs = SDS((8192, 2880), jnp.bfloat16), SDS((128, 2880, 5760), jnp.bfloat16)
    sizes = SDS((128,), jnp.int32)
    dot = functools.partial(ragged_dot, implementation="pallas_triton")
    assert triton_calls(lower_for_h200(dot, lhs, rhs, sizes)) == 1
    loss = lambda a, b, g: jnp.sum(dot(a, b, g).astype(jnp.float32))
    # d lhs (gmm with transposed rhs) and d rhs (tgmm); the forward is dead code under grad of a sum
    assert triton_calls(lower_for_h200(jax.grad(loss, argnums=(0, 1)), lhs, rhs, sizes)) == 2
    dy = SDS((8192, 5760), jnp.bfloat16)
    t = functools.partial(tgmm, implementation="pallas_triton")
    assert triton_calls(lower_for_h200(t, lhs, dy, sizes)) == 1


def test_interpret_mode_follows_the_target():
    from moe_pallas.kernels import _common

    assert _common.interpret_mode() == (jax.default_backend() != "gpu")
    with jax.sharding.use_abstract_mesh(H200):
        assert not _common.interpret_mode()
        assert _common.num_sms() == 132


@pytest.mark.parametrize("activation", sorted(WORKLOADS))
def test_gmm_glu_epilogue_lowers_to_triton(activation):
    """The gate_up gmm with its fused epilogue (gather, bias, GLU: gpt-oss splits an interleaved
    [., 2·bn] accumulator in registers), at seed shapes."""
    from moe_pallas.kernels.gmm import gmm

    hidden, inter, experts, top_k, _ = WORKLOADS[activation]
    rows = 2048 * top_k
    args = (
        SDS((2048, hidden), jnp.bfloat16),
        SDS((experts, hidden, 2 * inter), jnp.bfloat16),
        SDS((experts,), jnp.int32),
        SDS((rows,), jnp.int32),
        SDS((experts, 2 * inter), jnp.bfloat16),
    )
    glu_gmm = lambda x, w, sizes, row_token, bias: gmm(
        x, w, sizes, lhs_row_index=row_token, bias=bias, activation=activation
    )
    assert triton_calls(lower_for_h200(glu_gmm, *args)) == 1


@pytest.mark.parametrize("variant", ["gptoss_glu", "transpose_rhs"])
def test_gmm_m_paths_lower_to_one_triton_call(variant, monkeypatch):
    """A bucketed-M config (tile heights 128, 64, 32, 16) lowers to one Triton kernel with one dot
    per path, of its height: the gpt-oss gate_up (gather, bias, GLU) and its dx (rhs transposed)."""
    from jax._src.pallas.triton import lowering

    from moe_pallas.kernels import BlockConfig
    from moe_pallas.kernels.gmm import gmm

    modules = []
    lower = lowering.lower_jaxpr_to_triton_module

    def spy(*args, **kwargs):  # keeps the Triton module's text (the call holds it as bytecode)
        result = lower(*args, **kwargs)
        modules.append(result.module.operation.get_asm())
        return result

    monkeypatch.setattr(lowering, "lower_jaxpr_to_triton_module", spy)
    cfg = BlockConfig(128, 128, 64, group_m=8, num_warps=8, num_stages=3, min_block_m=16)
    hidden, inter, experts, top_k, _ = WORKLOADS["gptoss"]
    rows, sizes = 2048 * top_k, SDS((experts,), jnp.int32)
    bf16 = jnp.bfloat16
    if variant == "gptoss_glu":
        fn = lambda x, w, s, r, b: gmm(
            x, w, s, lhs_row_index=r, bias=b, activation="gptoss", config=cfg
        )
        args = (
            SDS((2048, hidden), bf16),
            SDS((experts, hidden, 2 * inter), bf16),
            sizes,
            SDS((rows,), jnp.int32),
            SDS((experts, 2 * inter), bf16),
        )
    else:
        fn = lambda dh, w, s: gmm(dh, w, s, transpose_rhs=True, config=cfg)
        args = (SDS((rows, 2 * inter), bf16), SDS((experts, hidden, 2 * inter), bf16), sizes)
    assert triton_calls(lower_for_h200(fn, *args)) == 1
    (asm,) = modules
    heights = tuple(int(h) for h in re.findall(r"tt\.dot .* -> tensor<(\d+)x", asm))
    assert heights == cfg.m_paths(), heights


@pytest.mark.parametrize("tokens", [2048, 16384])
@pytest.mark.parametrize("activation", sorted(WORKLOADS))
def test_auto_weight_gradients_lower_to_a_batched_dot_and_overflow_kernels(activation, tokens):
    """Under "auto" at T = 2048 and 16384 (64-512 rows per expert) the backward's weight gradients are
    batched dots over capacity slabs (built by four Triton slab kernels) plus the Triton tgmm in
    overflow mode (its tails unmasked at these shapes: a load's `other` needs a mask, which only
    the GPU lowering checks)."""
    from moe_pallas import fused

    layer = lambda x, i, w, p: fused.expert_block(x, i, w, p, activation, "auto")
    loss = lambda x, i, w, p: jnp.sum(layer(x, i, w, p).astype(jnp.float32))
    text = lower_for_h200(jax.grad(loss, argnums=(0, 2, 3)), *_layer_args(activation, tokens))
    assert len(re.findall(r"stablehlo.dot_general.*batching_dims = \[0\] x \[0\]", text)) >= 2
    assert text.count('name = "slab"') == 4
    assert triton_calls(text) + text.count("mosaic_gpu_v2") >= 12  # gpt-oss's dx: Mosaic GPU


def _mosaic_entries():
    from moe_pallas import tuning

    data = tuning.table()
    entries = data["devices"]["NVIDIA H200"]["entries"]
    return [e for e in entries if e["backend"] == "mosaic_gpu"]


@pytest.mark.parametrize(
    "entry", _mosaic_entries(), ids=lambda e: f"{e['kernel']}-{e['k']}-{e['n']}-{e['rows']}"
)
def test_mosaic_gpu_table_entries_lower(entry):
    """Every Mosaic GPU config the table ships lowers for the H200 as the backend runs it (its
    kernel's epilogue, bf16 output; FP8-activation entries on `gmm_fp8_mgpu`): Mosaic GPU checks
    the kernel's shared memory against the H200's 227 KiB while lowering, so an entry past it
    fails here rather than on the GPU."""
    from moe_pallas.kernels import gmm_mgpu

    cfg = gmm_mgpu.MosaicConfig(**entry["config"])
    k, n, groups = entry["k"], entry["n"], 128
    if entry["kernel"].endswith("_a8"):  # FP8 activations: kernels.gmm_fp8_mgpu
        _lower_fp8_entry(entry["kernel"], k, n, groups, cfg)
        return
    assert entry["kernel"] in ("gmm", "gmm_t")  # a plain gmm, or one with rhs transposed (dx)
    transposed = entry["kernel"] == "gmm_t"
    args = (
        SDS((512 * groups, k), jnp.bfloat16),  # "large": 512 rows per group
        SDS((groups, n, k) if transposed else (groups, k, n), jnp.bfloat16),
        SDS((groups,), jnp.int32),
        SDS((512 * groups,), jnp.float32),
    )
    fn = lambda lhs, rhs, sizes, scale: gmm_mgpu.gmm(
        lhs,
        rhs,
        sizes,
        transpose_rhs=transposed,
        row_scale=None if transposed else scale,
        out_dtype=jnp.bfloat16,
        config=cfg,
    )
    assert lower_for_h200(fn, *args).count("mosaic_gpu_v2") == 1


def _lower_fp8_entry(kernel, k, n, groups, cfg):
    """An FP8-activation entry's kernel lowers for the H200 on both fp8 formats and, for a GLU,
    both activations, where the kernel takes them, its epilogue as the layer's (the GLU's, or the
    row scale)."""
    from moe_pallas import quant
    from moe_pallas.kernels.gmm_fp8_mgpu import check, gmm_fp8

    rows, lowered = 512 * groups, 0
    for activation in ("swiglu", "gptoss") if kernel == "gmm_glu_a8" else (None,):
        width = 2 * n if activation else n
        for fmt in ("fp8", "fp8_block"):
            dense = SDS((groups, k, width), jnp.bfloat16)
            w = jax.eval_shape(lambda d, fmt=fmt: quant.quantize_weight(d, fmt), dense)
            if check(k, n, fmt, w.scales.shape, activation, cfg, w.values.shape[2]):
                continue
            args = (SDS((rows, k), jnp.float8_e4m3fn), SDS((rows, -(-k // 128)), jnp.float32), w)
            fn = lambda x, xs, w, sizes, scale, act=activation: gmm_fp8(
                x, xs, w, sizes, activation=act, row_scale=None if act else scale, config=cfg
            )
            sizes_scale = (SDS((groups,), jnp.int32), SDS((rows,), jnp.float32))
            assert lower_for_h200(fn, *args, *sizes_scale).count("mosaic_gpu_v2") == 1
            lowered += 1
    assert lowered


@pytest.mark.parametrize("activation", ["gptoss", "swiglu"])
def test_mosaic_gpu_default_glu_config_lowers(activation):
    """The config a GLU gets on Mosaic GPU (`default_config`, no table entry) fits the H200's
    shared memory, at decode and at prefill rows."""
    from moe_pallas.backends import mosaic_gpu
    from moe_pallas.kernels import gmm_mgpu

    hidden, inter, experts, _, _ = WORKLOADS[activation]
    for rows in (experts, 64 * experts):
        cfg = mosaic_gpu.default_config(rows, experts, inter, activation)
        args = (
            SDS((rows, hidden), jnp.bfloat16),
            SDS((experts, hidden, 2 * inter), jnp.bfloat16),
            SDS((experts,), jnp.int32),
            SDS((experts, 2 * inter), jnp.float32),
        )
        fn = lambda lhs, rhs, sizes, bias, cfg=cfg: gmm_mgpu.gmm(
            lhs, rhs, sizes, bias=bias, activation=activation, out_dtype=jnp.bfloat16, config=cfg
        )
        assert lower_for_h200(fn, *args).count("mosaic_gpu_v2") == 1, (rows, cfg)


@pytest.mark.parametrize(
    "fmt,small_scales", [("fp8", False), ("fp8_block", False), ("mxfp4", False), ("mxfp4", True)]
)
@pytest.mark.parametrize("config", ["tiny", "small", "weights_first"])
def test_quantised_gmm_lowers_to_triton(fmt, small_scales, config):
    """gmm_quant's formats at SwiGLU-256's gate_up size (fp8 values of 2^32 bytes: the byte-pair
    view) with the GLU epilogue, at the 16-row and the 128-row table entries and the latter with
    the weights first (and its 16-row paths); mxfp4 with one and with two scale multiplies."""
    from moe_pallas import quant
    from moe_pallas.kernels.config import BlockConfig
    from moe_pallas.kernels.gmm_quant import gmm_quant

    hidden, inter, experts, top_k, _ = WORKLOADS["swiglu"]
    k, n = hidden, 2 * inter
    if fmt == "mxfp4":
        values = SDS((experts, n, k // 2), jnp.uint8)
        scales = SDS((experts, k // 32, n), jnp.uint8)
    else:
        values = SDS((experts, n, k), jnp.float8_e4m3fn)
        scales = SDS((experts, n) if fmt == "fp8" else (experts, k // 128, n // 128), jnp.float32)
    cfg = {
        "tiny": BlockConfig(block_m=16, block_n=64, block_k=128, num_warps=4, num_stages=3),
        "small": BlockConfig(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=4),
        "weights_first": BlockConfig(128, 128, 64, 8, 8, 4, min_block_m=16, weights_first=True),
    }[config]
    tokens = 16 if config == "tiny" else 2048

    def glu_gmm(x, values, scales, sizes, row_token):
        w = quant.QuantizedWeight(values, scales, fmt, jnp.bfloat16, small_scales)
        return gmm_quant(x, w, sizes, lhs_row_index=row_token, activation="swiglu", config=cfg)

    args = (
        SDS((tokens, hidden), jnp.bfloat16),
        values,
        scales,
        SDS((experts,), jnp.int32),
        SDS((tokens * top_k,), jnp.int32),
    )
    assert triton_calls(lower_for_h200(glu_gmm, *args)) == 1


@pytest.mark.parametrize("fmt", ["fp8", "fp8_block", "mxfp4"])
@pytest.mark.parametrize("tokens", [16, 4096])
def test_quantised_transposed_gmm_lowers_to_triton(fmt, tokens):
    """The backward's product with wᵀ on the weights as stored (`kernels.gmm_quant_t`, through the
    pallas_triton backend and its table entries) at SwiGLU-256's gate_up, whose fp8 values of
    2^32 bytes it reads as byte pairs: one Triton call and no dense weight."""
    from moe_pallas import backends, quant

    hidden, inter, experts, top_k, _ = WORKLOADS["swiglu"]
    k, n = hidden, 2 * inter
    values = SDS((experts, n, k), jnp.float8_e4m3fn)
    scales = SDS((experts, n) if fmt == "fp8" else (experts, k // 128, n // 128), jnp.float32)
    if fmt == "mxfp4":
        values = SDS((experts, n, k // 2), jnp.uint8)
        scales = SDS((experts, k // 32, n), jnp.uint8)

    def dx(dh, values, scales, sizes):
        w = quant.QuantizedWeight(values, scales, fmt, jnp.bfloat16)
        return backends.gmm("pallas_triton", dh, w, sizes, transpose_rhs=True)

    args = (SDS((tokens * top_k, n), jnp.bfloat16), values, scales, SDS((experts,), jnp.int32))
    text = lower_for_h200(dx, *args)
    assert triton_calls(text) == 1 and f"{experts}x{k}x{n}xbf16" not in text
