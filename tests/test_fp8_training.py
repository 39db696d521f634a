"""FP8 training (`moe_experts(..., fp8_training=True)`, `moe_pallas.fused`): one quantisation of
each weight read as w and as wᵀ, the block's forward and gradients on both backends against each
other and against the dense block, the layer option, errors, and the lowering for the H200."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import moe_pallas
from moe_pallas import quant
from moe_pallas.quant import FP8_MAX
from moe_pallas.reference import moe_experts_reference
from tests.helpers import FULL_SHAPES, make_params, random_routing
from tests.test_lowering import SDS, lower_for_h200, triton_calls
from tests.test_quant import rel_err

# Both backends quantise the same operands and multiply them exactly in float32; what differs is
# summation order and the bf16 roundings of h, a and dh, which can move an operand across an e4m3
# rounding boundary before the next product (measured <= 4.6e-5 here).
BACKENDS_BOUND = 1e-2
# Against the dense block in float64: e4m3 keeps 4 significant bits, so every operand of every
# product but the weight gradients' moves by up to 2^-4 of itself (25 draws of each case of
# `test_fp8_training_block`: at most 8.6% forward and 8.8% for the gradients but T = 1's routing
# weights', whose two entries reached 26%).
FP8_TRAINING_BOUND = 1.5e-1


def test_one_quantisation_serves_w_and_its_transpose():
    """`fp8_training_weight`: w_q decodes to what quantize_experts' "fp8_block" gives (ragged K
    and N tails: 200 x 136), the transposed one to its transpose, bit for bit; both with FP8
    activations, their values N-major as the kernels take them."""
    rng = np.random.default_rng()
    w = jnp.asarray(rng.standard_normal((3, 200, 136)) * rng.random((3, 1, 136)), jnp.bfloat16)
    w_q, wt_q = (jax.jit(quant.fp8_training_weight, static_argnums=1)(w, t) for t in (False, True))
    assert w_q.values.shape[:2] == (3, 136) and wt_q.values.shape[:2] == (3, 200)
    assert w_q.shape == (3, 200, 136) and wt_q.shape == (3, 136, 200)
    assert w_q.fp8_activations and wt_q.fp8_activations and w_q.fmt == wt_q.fmt == "fp8_block"
    want = quant.quantize_weight(w, "fp8_block").dequantize(jnp.float32)
    np.testing.assert_array_equal(w_q.dequantize(jnp.float32), want)
    np.testing.assert_array_equal(wt_q.dequantize(jnp.float32), jnp.swapaxes(want, 1, 2))
    assert w_q.dtype == wt_q.dtype == jnp.bfloat16


@pytest.mark.parametrize("shape", [(2, 1900, 136), (3, 200, 130), (1, 99, 64)])
def test_kernel_writes_the_rule(shape):
    """`fp8_training_weights` with the kernel (`kernels.fp8_blocks`, interpret mode: exact
    division) against the jnp rule, bit for bit: both layouts in one call, ragged K and N tails, a
    block of zeros (scale 1), K = 1900's rows padded to the 2048 pitch with zeros (the rule pads
    them so too), and odd K = 99, which the kernel's byte pairs cannot hold (the rule writes it)."""
    rng = np.random.default_rng()
    e, k, n = shape
    w = rng.standard_normal(shape) * np.exp(rng.standard_normal((e, 1, n)))
    w[0, :128, :64] = 0
    w = jnp.asarray(w, jnp.bfloat16)
    pair = functools.partial(quant.fp8_training_weights, both=True)
    got = jax.jit(functools.partial(pair, kernel=True))(w)
    want = jax.jit(functools.partial(pair, kernel=False))(w)
    assert got[0].k == want[0].k and got[0].values.shape[2] == quant._activation_pitch(e, n, k)
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape and a.k == b.k and a.fp8_activations
        np.testing.assert_array_equal(a.scales, b.scales)
        np.testing.assert_array_equal(a.values.view(jnp.uint8), b.values.view(jnp.uint8))
    q_only = jax.jit(lambda w: quant.fp8_training_weights(w, both=False, kernel=True))(w)
    assert q_only[1] is None
    np.testing.assert_array_equal(q_only[0].values.view(jnp.uint8), want[0].values.view(jnp.uint8))


def _loss_and_grads(activation, implementation, fp8_training, x, idx, wts, params, dout):
    """The block's output and the gradients of <out, dout> w.r.t. (x, wts, params), in one jit
    (eagerly, every op of the forward and backward compiled on its own); a new function each call,
    so a backend patched by the caller is traced, not taken from an earlier call's cache."""

    def loss(x, wts, params):
        out = moe_pallas.moe_experts(
            x,
            idx,
            wts,
            params,
            activation=activation,
            implementation=implementation,
            fp8_training=fp8_training,
        )
        return jnp.vdot(out.astype(jnp.float32), dout), out

    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))
    (_, out), grads = step(x, wts, params)
    return out, grads


@pytest.mark.parametrize(
    "activation,num_tokens,hidden,inter",
    [("swiglu", 1, 128, 64), ("swiglu", 37, 192, 160), ("gptoss", 29, 160, 96)],
)
def test_fp8_training_block(activation, num_tokens, hidden, inter):
    """The block with fp8_training on pallas_triton (interpret mode) and on xla: forward and the
    gradients of x, the routing weights and every parameter within BACKENDS_BOUND of each other,
    and within FP8_TRAINING_BOUND of the dense block's (float64 reference, its jax.grad; at T = 1
    not the routing weights', a ratio of two dot products over I quantised terms); T = 1,
    an expert that gets no rows, K and N tails off 128 (192, 160, 96 and 320 columns)."""
    rng = np.random.default_rng()
    num_experts, top_k = 5, 2
    params = make_params(rng, num_experts, hidden, inter, biases=activation == "gptoss", scale=2)
    params = {k: jnp.asarray(v, jnp.bfloat16) for k, v in params.items()}
    x = jnp.asarray(rng.standard_normal((num_tokens, hidden)), jnp.bfloat16)
    idx, wts = random_routing(rng, num_tokens, num_experts - 1, top_k)  # expert 4 gets no rows
    idx, wts = jnp.asarray(idx), jnp.asarray(wts)
    dout = jnp.asarray(rng.standard_normal((num_tokens, hidden)), jnp.float32)
    args = (x, idx, wts, params, dout)
    out, grads = _loss_and_grads(activation, "pallas_triton", True, *args)
    xla_out, xla_grads = _loss_and_grads(activation, "xla", True, *args)

    def reference(x, wts, params):
        p64 = {k: v.astype(jnp.float64) for k, v in params.items()}
        out = moe_experts_reference(x.astype(jnp.float64), idx, wts, p64, activation=activation)
        return jnp.vdot(out, dout.astype(jnp.float64)), out

    with jax.enable_x64():
        (_, want), want_grads = jax.jit(
            jax.value_and_grad(reference, argnums=(0, 1, 2), has_aux=True)
        )(x, wts, params)
        want, want_grads = np.asarray(want), jax.tree.map(np.asarray, want_grads)
    assert out.dtype == jnp.bfloat16 and out.shape == x.shape
    assert rel_err(out, xla_out) < BACKENDS_BOUND
    assert rel_err(out, want) < FP8_TRAINING_BOUND
    assert rel_err(xla_out, want) < FP8_TRAINING_BOUND
    flat, xla_flat = jax.tree.leaves_with_path(grads), jax.tree.leaves(xla_grads)
    for (path, got), got_xla, dense in zip(flat, xla_flat, jax.tree.leaves(want_grads)):
        assert got.dtype == got_xla.dtype and got.shape == dense.shape, path
        assert rel_err(got, got_xla) < BACKENDS_BOUND, path
        if num_tokens == 1 and path[0].idx == 1:
            continue  # T = 1's routing gradient: two dot products, up to 26% in 25 draws
        assert rel_err(got, dense) < FP8_TRAINING_BOUND, path
    # the expert that got no rows: zero weight gradients
    for name in ("w_gate_up", "w_down"):
        np.testing.assert_array_equal(np.asarray(grads[2][name][num_experts - 1], np.float32), 0)
    assert len(jax.tree.leaves(grads[2])) == len(params)


def _on_grid(rng, shape, power, block_rows):
    """bf16 values that quantise to themselves: e4m3 values times 2^power, each block of
    block_rows x 128 holding a 448 (so its scale is 2^power exactly)."""
    v = np.clip(rng.standard_normal(shape) * 100, -FP8_MAX, FP8_MAX)
    v = np.asarray(jnp.asarray(v, jnp.float8_e4m3fn), np.float32)
    v[..., ::block_rows, ::128] = FP8_MAX
    return jnp.asarray(v * 2.0**power, jnp.bfloat16)


def test_fp8_training_quantises_what_it_says():
    """Which operands are quantised, on the Pallas backend against its own dense block: with
    weights and x that quantise to themselves (`_on_grid`), the forward differs only by the
    activation a's quantisation before the down product, dx also by dout's and dh's in the
    backward, and d_w_down, the tgmm of the unquantised a and dy, not at all."""
    rng = np.random.default_rng()
    hidden, inter, num_experts, num_tokens = 128, 128, 3, 16
    params = {
        "w_gate_up": _on_grid(rng, (num_experts, hidden, 2 * inter), -12, 128),
        "w_down": _on_grid(rng, (num_experts, inter, hidden), -12, 128),
    }
    for w in params.values():
        np.testing.assert_array_equal(
            quant.fp8_training_weight(w).dequantize(jnp.float32), w.astype(jnp.float32)
        )
    x = _on_grid(rng, (num_tokens, hidden), -8, 1)
    np.testing.assert_array_equal(quant.fp8_rows(x), x)
    idx, wts = (jnp.asarray(a) for a in random_routing(rng, num_tokens, num_experts, 2))
    dout = jnp.asarray(rng.standard_normal((num_tokens, hidden)), jnp.float32)
    args = (x, idx, wts, params, dout)
    out, grads = _loss_and_grads("swiglu", "pallas_triton", True, *args)
    dense_out, dense_grads = _loss_and_grads("swiglu", "pallas_triton", False, *args)
    assert 5e-3 < rel_err(out, dense_out) < 8e-2  # q(a) (measured 2.2-2.6%)
    assert 5e-3 < rel_err(grads[0], dense_grads[0]) < FP8_TRAINING_BOUND  # 3.4-3.7%
    assert 5e-3 < rel_err(grads[2]["w_gate_up"], dense_grads[2]["w_gate_up"]) < 8e-2  # via dh
    assert rel_err(grads[2]["w_down"], dense_grads[2]["w_down"]) < 1e-6


def test_moe_layer_trains_with_fp8_training():
    """The MoE layer's fp8_training option: a jitted SGD step lowers the loss on the same batch,
    and its gradients are within FP8_TRAINING_BOUND of the layer's without it."""
    from flax import nnx

    rng = np.random.default_rng()
    x = jnp.asarray(rng.standard_normal((24, 128)), jnp.float32)
    target = jnp.asarray(rng.standard_normal((24, 128)), jnp.float32)
    layers = {
        fp8: moe_pallas.MoE(128, 64, 4, 2, fp8_training=fp8, rngs=nnx.Rngs(0))
        for fp8 in (True, False)
    }
    loss = lambda layer: jnp.mean((layer(x) - target) ** 2)
    grads = {fp8: nnx.jit(nnx.grad(loss))(layer) for fp8, layer in layers.items()}
    for name in ("w_gate_up", "w_down"):
        got, dense = (getattr(grads[fp8], name)[...] for fp8 in (True, False))
        assert rel_err(got, dense) < FP8_TRAINING_BOUND, name

    @nnx.jit
    def step(layer):
        value, g = nnx.value_and_grad(loss)(layer)
        nnx.update(layer, jax.tree.map(lambda p, d: p - 0.5 * d, nnx.state(layer), g))
        return value

    layer = layers[True]
    first = step(layer)
    for _ in range(3):
        last = step(layer)
    assert last < first


@pytest.mark.parametrize("implementation", ["pallas_triton", "xla"])
def test_a_non_finite_weight_spoils_its_block(implementation):
    """An infinity in w_down[1] under fp8_training sets its 128 x 128 block's scale: the block's
    128 output columns are NaN in expert 1's rows (one column without fp8_training), every other
    row finite; under `debug_checks` the call raises, naming the weight and its expert."""
    rng = np.random.default_rng()
    params = make_params(rng, 2, 256, 128, biases=False)
    params = {k: jnp.asarray(v, jnp.bfloat16) for k, v in params.items()}
    params["w_down"] = params["w_down"].at[1, 5, 7].set(jnp.inf)
    x = jnp.asarray(rng.standard_normal((4, 256)), jnp.bfloat16)
    idx, wts = jnp.array([[0], [1], [1], [0]], jnp.int32), jnp.ones((4, 1))
    for fp8, width in ((True, 128), (False, 1)):
        out = moe_pallas.moe_experts(
            x,
            idx,
            wts,
            params,
            activation="swiglu",
            implementation=implementation,
            fp8_training=fp8,
        )
        bad = ~np.isfinite(np.asarray(out, np.float32))
        assert bad.sum(axis=1).tolist() == [0, width, width, 0], fp8
        assert bad[1, :128].all() == fp8 and bad[1, 7]
    message = r"params\['w_down'\] holds 1 NaN .* expert 1"
    with pytest.raises(ValueError, match=message), moe_pallas.debug_checks():
        moe_pallas.moe_experts(
            x,
            idx,
            wts,
            params,
            activation="swiglu",
            implementation=implementation,
            fp8_training=True,
        )


def test_fp8_training_errors():
    rng = np.random.default_rng()
    params = make_params(rng, 2, 128, 64, biases=False)
    qparams = moe_pallas.quantize_experts(params, "fp8_block")
    x, idx, wts = jnp.ones((4, 128)), jnp.zeros((4, 1), jnp.int32), jnp.ones((4, 1))
    with pytest.raises(ValueError, match=r"fp8_training quantises dense weights.*w_gate_up"):
        moe_pallas.moe_experts(x, idx, wts, qparams, activation="swiglu", fp8_training=True)


def test_fp8_training_step_lowers_for_the_h200():
    """gpt-oss's block at full size, forward and backward with fp8_training, lowers to Triton
    calls for the H200: four products on FP8 weights (the forward's two, g and dx on wᵀ), none
    on the transposed-weight kernel, and the two weight gradients' tgmm in bf16."""
    hidden, inter, experts, top_k, tokens = 2880, 2880, 128, 4, 2048
    params = {
        "w_gate_up": SDS((experts, hidden, 2 * inter), jnp.bfloat16),
        "w_down": SDS((experts, inter, hidden), jnp.bfloat16),
        "b_gate_up": SDS((experts, 2 * inter), jnp.bfloat16),
        "b_down": SDS((experts, hidden), jnp.bfloat16),
    }

    def loss(x, idx, wts, params):
        out = moe_pallas.moe_experts(
            x,
            idx,
            wts,
            params,
            activation="gptoss",
            implementation="pallas_triton",
            fp8_training=True,
        )
        return jnp.sum(out.astype(jnp.float32))

    args = (
        SDS((tokens, hidden), jnp.bfloat16),
        SDS((tokens, top_k), jnp.int32),
        SDS((tokens, top_k), jnp.float32),
        params,
    )
    text = lower_for_h200(jax.grad(loss, argnums=(0, 2, 3)), *args)
    assert text.count('name = "gmm_fp8_block"') == 4
    assert 'name = "gmm_t_' not in text and text.count('name = "tgmm"') == 2
    assert triton_calls(text) >= 8


@FULL_SHAPES
@pytest.mark.gpu
def test_gptoss_sized_fp8_training():
    """gpt-oss's experts at full size, the train step's output and gradients with fp8_training
    on the GPU ("auto": Mosaic GPU's FP8 kernel where the table has it, Triton's else) within
    FP8_TRAINING_BOUND of the bf16 step's, and within BACKENDS_BOUND of "pallas_triton"'s and
    "mosaic_gpu"'s (the same quantised operands; the tensor cores' fp8 sums and the order
    differ), at T = 64 (decode-sized tiles: float16 dots of the e4m3 values) and T = 2048 (64
    rows per expert: fp8 wgmma)."""
    from tests.helpers import device_expert_params, device_normal

    rng = np.random.default_rng(7)
    experts, hidden, inter, top_k = 128, 2880, 2880, 4
    params = device_expert_params(rng, experts, hidden, inter, jnp.bfloat16, (0.1, 0.1))
    steps = {
        (impl, fp8): jax.jit(
            lambda x, idx, wts, p, dout, impl=impl, fp8=fp8: _loss_and_grads(
                "gptoss", impl, fp8, x, idx, wts, p, dout
            )
        )
        for impl, fp8 in (
            ("auto", False),
            ("auto", True),
            ("pallas_triton", True),
            ("mosaic_gpu", True),
        )
    }
    for tokens in (64, 2048):
        x = device_normal(rng, (tokens, hidden), jnp.bfloat16)
        idx, wts = (jnp.asarray(a) for a in random_routing(rng, tokens, experts, top_k))
        dout = device_normal(rng, (tokens, hidden), jnp.float32)
        runs = {key: step(x, idx, wts, params, dout) for key, step in steps.items()}
        got = jax.tree.leaves(runs[("auto", True)])
        for key, run in runs.items():
            bound = FP8_TRAINING_BOUND if key == ("auto", False) else BACKENDS_BOUND
            for a, b in zip(got, jax.tree.leaves(run), strict=True):
                assert rel_err(a, b) < bound, (tokens, key)


def test_fp8_training_on_mosaic_gpu():
    """With implementation="mosaic_gpu" (interpret mode) every product of the block takes
    Mosaic GPU's FP8 kernel (K and N multiples of 64, SwiGLU halves of whole 128-column blocks):
    the forward, g (float32, gathered rows) and dx; output and gradients within BACKENDS_BOUND of
    pallas_triton's, an expert without rows."""
    from moe_pallas import backends
    from moe_pallas.backends import mosaic_gpu

    rng = np.random.default_rng()
    num_experts, hidden, inter, num_tokens = 3, 128, 128, 12
    params = make_params(rng, num_experts, hidden, inter, biases=False, scale=2)
    params = {k: jnp.asarray(v, jnp.bfloat16) for k, v in params.items()}
    x = jnp.asarray(rng.standard_normal((num_tokens, hidden)), jnp.bfloat16)
    idx, wts = (jnp.asarray(a) for a in random_routing(rng, num_tokens, num_experts - 1, 2))
    dout = jnp.asarray(rng.standard_normal((num_tokens, hidden)), jnp.float32)
    taken = []
    mosaic = mosaic_gpu.BACKEND
    gmm_fp8 = mosaic.gmm

    def counted(lhs, rhs, *args, **kwargs):
        taken.append((rhs.shape, kwargs.get("lhs_row_index") is not None))
        return gmm_fp8(lhs, rhs, *args, **kwargs)

    args = (x, idx, wts, params, dout)
    with pytest.MonkeyPatch.context() as mp:
        backends.get("mosaic_gpu")  # (fills the registry)
        mp.setitem(backends.REGISTRY, "mosaic_gpu", dataclasses.replace(mosaic, gmm=counted))
        out, grads = _loss_and_grads("swiglu", "mosaic_gpu", True, *args)
    want, want_grads = _loss_and_grads("swiglu", "pallas_triton", True, *args)
    assert sorted(taken) == sorted(
        [
            ((3, 128, 256), True),  # gate_up (GLU), x's rows gathered
            ((3, 128, 128), False),  # down
            ((3, 128, 128), True),  # g = dout[row_token] @ w_downᵀ
            ((3, 256, 128), False),  # dx rows = dh @ w_gate_upᵀ
        ]
    )
    assert rel_err(out, want) < BACKENDS_BOUND
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads), strict=True):
        assert rel_err(a, b) < BACKENDS_BOUND


@pytest.mark.parametrize(
    "activation,policy,device,tokens,mosaic,fp8_triton",
    [
        # down has a table entry; gate_up (a plain gmm under jax.grad, h kept) and dx have values
        # past Triton's int32 offsets (`backends.fp8_past_triton_offsets`); g's float32 output
        # stays on Triton
        ("swiglu", "auto", "NVIDIA H200", 2048, 3, 1),
        # down has an entry; gate_up, g and dx on Triton (no entry, values within offsets)
        ("gptoss", "auto", "NVIDIA H200", 2048, 1, 3),
        # the four FP8 products and the two bf16 weight gradients on Mosaic GPU, g's float32
        # tile within the H200's shared memory
        ("swiglu", "mosaic_gpu", "NVIDIA H200", 2048, 6, 0),
        ("gptoss", "mosaic_gpu", "NVIDIA H200", 2048, 6, 0),
        # the H100 at 256 rows per expert: down, g ("gmm_a8_f32") and dx have entries, gate_up
        # stays on Triton
        ("gptoss", "auto", "NVIDIA H100 80GB HBM3", 8192, 3, 1),
    ],
)
def test_fp8_training_step_lowers_to_mosaic_gpu(
    activation, policy, device, tokens, mosaic, fp8_triton
):
    """The train step with fp8_training at full size lowers for the H200 (and the H100) under
    "auto" (the device's table) and "mosaic_gpu": Mosaic GPU checks each kernel's shared memory
    while lowering, so a config past the 227 KiB fails here; the FP8 products each backend takes,
    counted."""
    from jax.sharding import AbstractDevice, AbstractMesh

    from moe_pallas import fused
    from tests.test_lowering import _layer_args

    def loss(x, idx, wts, params):
        out = fused.expert_block(x, idx, wts, params, activation, policy, True)
        return jnp.sum(out.astype(jnp.float32))

    step = jax.jit(jax.grad(loss, argnums=(0, 2, 3)))
    mesh = AbstractMesh((1,), ("x",), abstract_device=AbstractDevice(device, 132, "gpu"))
    with jax.sharding.use_abstract_mesh(mesh):
        lowered = step.trace(*_layer_args(activation, tokens)).lower(lowering_platforms=("cuda",))
    text = lowered.as_text()
    assert text.count("mosaic_gpu_v2") == mosaic
    assert text.count('name = "gmm_fp8_block"') == fp8_triton
