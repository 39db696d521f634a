"""Weight import: real safetensors files in the gpt-oss and per-expert layouts, read back, converted
by load_experts, checked against the checkpoint's own expert formula, and put into a MoE layer."""

import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.flax
import safetensors.numpy
from flax import nnx

import moe_pallas
from moe_pallas import MoE, load_experts, moe_experts, set_expert_params

E, H, I, T, K = 4, 8, 6, 10, 2
PREFIX = "model.layers.3.mlp.experts."


def rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


def routing(seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((T, H)).astype(np.float32)
    idx = np.stack([rng.choice(E, K, replace=False) for _ in range(T)]).astype(np.int32)
    weight = rng.random((T, K)).astype(np.float32)
    return x, idx, weight


def gpt_oss_tensors(rng):
    return {
        "gate_up_proj": rng.standard_normal((E, H, 2 * I)).astype(np.float32),
        "gate_up_proj_bias": rng.standard_normal((E, 2 * I)).astype(np.float32),
        "down_proj": rng.standard_normal((E, I, H)).astype(np.float32) / 4,
        "down_proj_bias": rng.standard_normal((E, H)).astype(np.float32),
    }


def per_expert_tensors(rng, experts=E):
    tensors = {}
    for e in range(experts):
        tensors[f"{e}.gate_proj.weight"] = rng.standard_normal((I, H)).astype(np.float32)
        tensors[f"{e}.up_proj.weight"] = rng.standard_normal((I, H)).astype(np.float32)
        tensors[f"{e}.down_proj.weight"] = rng.standard_normal((H, I)).astype(np.float32) / 4
    return tensors


def gpt_oss_expert(t, e, x):
    """transformers GptOssExperts on one token, float64, from the checkpoint tensors."""
    gate_up = x @ t["gate_up_proj"][e] + t["gate_up_proj_bias"][e]
    gate, up = np.minimum(gate_up[0::2], 7.0), np.clip(gate_up[1::2], -7.0, 7.0)
    glu = gate / (1 + np.exp(-1.702 * gate))
    return ((up + 1) * glu) @ t["down_proj"][e] + t["down_proj_bias"][e]


def swiglu_expert(t, e, x):
    """A Qwen3-MoE / DeepSeek-V3 expert MLP (nn.Linear weights [out, in]) on one token, float64."""
    gate, up = t[f"{e}.gate_proj.weight"] @ x, t[f"{e}.up_proj.weight"] @ x
    return t[f"{e}.down_proj.weight"] @ (gate / (1 + np.exp(-gate)) * up)


def checkpoint_moe(expert_fn, tensors, x, idx, weight):
    tensors = {k: np.asarray(v, np.float64) for k, v in tensors.items()}
    return np.stack(
        [
            sum(
                weight[t, j] * expert_fn(tensors, idx[t, j], x[t].astype(np.float64))
                for j in range(K)
            )
            for t in range(T)
        ]
    )


def test_gpt_oss_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    tensors = gpt_oss_tensors(rng)
    path = tmp_path / "experts.safetensors"
    safetensors.numpy.save_file({PREFIX + k: v for k, v in tensors.items()}, str(path))
    params = load_experts(safetensors.numpy.load_file(str(path)), "gpt_oss", prefix=PREFIX)
    assert sorted(params) == ["b_down", "b_gate_up", "w_down", "w_gate_up"]
    np.testing.assert_array_equal(params["w_gate_up"], tensors["gate_up_proj"])
    x, idx, weight = routing(1)
    out = moe_experts(x, idx, weight, params, activation="gptoss", implementation="xla")
    assert rel_err(out, checkpoint_moe(gpt_oss_expert, tensors, x, idx, weight)) < 1e-5


def test_per_expert_round_trip(tmp_path):
    rng = np.random.default_rng(2)
    tensors = per_expert_tensors(rng)
    path = tmp_path / "experts.safetensors"
    safetensors.numpy.save_file({PREFIX + k: v for k, v in tensors.items()}, str(path))
    params = load_experts(safetensors.numpy.load_file(str(path)), "per_expert", prefix=PREFIX)
    assert params["w_gate_up"].shape == (E, H, 2 * I) and params["w_down"].shape == (E, I, H)
    np.testing.assert_array_equal(params["w_gate_up"][2, :, I:], tensors["2.up_proj.weight"].T)
    x, idx, weight = routing(3)
    out = moe_experts(x, idx, weight, params, activation="swiglu", implementation="xla")
    assert rel_err(out, checkpoint_moe(swiglu_expert, tensors, x, idx, weight)) < 1e-5


def test_bfloat16_file_into_layer(tmp_path):
    rng = np.random.default_rng(4)
    tensors = {k: jnp.asarray(v, jnp.bfloat16) for k, v in gpt_oss_tensors(rng).items()}
    path = tmp_path / "experts.safetensors"
    safetensors.flax.save_file(tensors, str(path))
    params = load_experts(safetensors.flax.load_file(str(path)), "gpt_oss")
    assert params["w_down"].dtype == jnp.bfloat16
    layer = MoE(
        H,
        I,
        E,
        K,
        activation="gptoss",
        expert_bias=True,
        router="topk_softmax",
        router_bias=True,
        rngs=nnx.Rngs(0),
    )
    set_expert_params(layer, params)
    assert layer.w_gate_up.dtype == jnp.float32
    for name, value in params.items():
        np.testing.assert_array_equal(getattr(layer, name)[...], value.astype(jnp.float32))
    assert np.isfinite(np.asarray(layer(jnp.asarray(routing(5)[0])))).all()


def test_dtype_cast():
    params = load_experts(
        per_expert_tensors(np.random.default_rng(6)), "per_expert", dtype=jnp.bfloat16
    )
    assert all(v.dtype == jnp.bfloat16 for v in params.values())


@pytest.mark.parametrize(
    "mutate, layout, match",
    [
        (lambda t: t.pop("2.up_proj.weight"), "per_expert", r"missing 2\.up_proj\.weight"),
        (
            lambda t: t.update({"1.down_proj.weight": np.zeros((H, I + 1))}),
            "per_expert",
            r"1\.down_proj\.weight must have shape \[8, 6\]",
        ),
        (lambda t: None, "mixtral", "layout='mixtral'"),
    ],
)
def test_per_expert_errors(mutate, layout, match):
    tensors = per_expert_tensors(np.random.default_rng(7))
    mutate(tensors)
    with pytest.raises(ValueError, match=match):
        load_experts(tensors, layout)


def test_gpt_oss_errors():
    tensors = gpt_oss_tensors(np.random.default_rng(8))
    with pytest.raises(ValueError, match="'down_proj_bias'"):
        load_experts({k: v for k, v in tensors.items() if k != "down_proj_bias"}, "gpt_oss")
    with pytest.raises(ValueError, match=r"down_proj must have shape \[4, 6, 8\]"):
        load_experts({**tensors, "down_proj": tensors["down_proj"][:, :-1]}, "gpt_oss")
    with pytest.raises(ValueError, match="MXFP4"):
        load_experts({"gate_up_proj_blocks": np.zeros(4, np.uint8)}, "gpt_oss")
    with pytest.raises(ValueError, match="check `layout` and `prefix`"):
        load_experts(tensors, "gpt_oss", prefix="model.")
    with pytest.raises(TypeError, match="mapping"):
        load_experts(list(tensors.values()), "gpt_oss")


def test_set_expert_params_errors():
    params = load_experts(gpt_oss_tensors(np.random.default_rng(9)), "gpt_oss")
    no_bias = MoE(H, I, E, K, activation="gptoss", rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="expert_bias=True"):
        set_expert_params(no_bias, params)
    wider = MoE(H, 2 * I, E, K, activation="gptoss", expert_bias=True, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"params\['b_down'\]|params\['b_gate_up'\]"):
        set_expert_params(wider, params)
    with pytest.raises(TypeError, match="moe_pallas.MoE"):
        set_expert_params(object(), params)


# MXFP4 (the published gpt-oss checkpoints' expert weights): H and I multiples of the 32-value block.
QE, QH, QI = 3, 64, 32


def e2m1(code):
    """The OCP e2m1 value of a 4-bit code, from its bits: sign, 2 exponent bits (bias 1), 1 mantissa."""
    sign = -1.0 if code & 8 else 1.0
    exponent, mantissa = (code >> 1) & 3, code & 1
    return sign * (mantissa / 2 if exponent == 0 else 2.0 ** (exponent - 1) * (1 + mantissa / 2))


def mxfp4_reference(blocks, scales):
    """float64 [E, 32·G, R] of blocks [E, R, G, 16] / scales [E, R, G], value by value: value 2j of
    a block is byte j's low nibble, value 2j + 1 its high nibble, times 2^(scale - 127); then the
    [R, K] -> [K, R] transpose transformers' GptOssExperts applies."""
    experts, rows, groups, _ = blocks.shape
    out = np.empty((experts, rows, 32 * groups))
    for e, r, g, j in np.ndindex(blocks.shape):
        scale = 2.0 ** (int(scales[e, r, g]) - 127)
        out[e, r, 32 * g + 2 * j] = e2m1(blocks[e, r, g, j] & 0xF) * scale
        out[e, r, 32 * g + 2 * j + 1] = e2m1(blocks[e, r, g, j] >> 4) * scale
    return out.transpose(0, 2, 1)


def gpt_oss_mxfp4_tensors(rng, scale_range=(112, 132), inter=QI):
    """inter = 64: the smallest I the stored (not dequantised) MXFP4 layout takes."""

    def quantised(rows, k):
        blocks = rng.integers(0, 256, (QE, rows, k // 32, 16), dtype=np.uint8)
        return blocks, rng.integers(*scale_range, (QE, rows, k // 32), dtype=np.uint8)

    (gu_blocks, gu_scales), (d_blocks, d_scales) = quantised(2 * inter, QH), quantised(QH, inter)
    return {
        "gate_up_proj_blocks": gu_blocks,
        "gate_up_proj_scales": gu_scales,
        "gate_up_proj_bias": rng.standard_normal((QE, 2 * inter)).astype(np.float32),
        "down_proj_blocks": d_blocks,
        "down_proj_scales": d_scales,
        "down_proj_bias": rng.standard_normal((QE, QH)).astype(np.float32),
    }


def test_e2m1_table_and_nibble_order():
    assert [e2m1(c) for c in range(8)] == [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    tensors = gpt_oss_mxfp4_tensors(np.random.default_rng(10))
    tensors["down_proj_blocks"][0, 5, 0, :] = 0
    tensors["down_proj_blocks"][0, 5, 0, 0] = 0x2B  # low nibble 0xB = -1.5, high 0x2 = 1.0
    tensors["down_proj_scales"][0, 5, 0] = 128
    w_down = np.asarray(load_experts(tensors, "gpt_oss")["w_down"], np.float64)
    np.testing.assert_array_equal(w_down[0, :32, 5], [-3.0, 2.0] + [0.0] * 30)


@pytest.mark.parametrize("dtype", [None, jnp.float32])
def test_mxfp4_dequantised_exactly(tmp_path, dtype):
    rng = np.random.default_rng(11)
    tensors = gpt_oss_mxfp4_tensors(rng)
    path = tmp_path / "experts.safetensors"
    safetensors.numpy.save_file({PREFIX + k: v for k, v in tensors.items()}, str(path))
    params = load_experts(
        safetensors.numpy.load_file(str(path)), "gpt_oss", prefix=PREFIX, dtype=dtype
    )
    assert params["w_gate_up"].dtype == (dtype or jnp.bfloat16)
    dense = {
        "gate_up_proj": mxfp4_reference(
            tensors["gate_up_proj_blocks"], tensors["gate_up_proj_scales"]
        ),
        "down_proj": mxfp4_reference(tensors["down_proj_blocks"], tensors["down_proj_scales"]),
    }
    assert params["w_gate_up"].shape == (QE, QH, 2 * QI) and params["w_down"].shape == (QE, QI, QH)
    np.testing.assert_array_equal(
        np.asarray(params["w_gate_up"], np.float64), dense["gate_up_proj"]
    )
    np.testing.assert_array_equal(np.asarray(params["w_down"], np.float64), dense["down_proj"])
    if dtype is None:
        return
    rng_x = np.random.default_rng(12)
    x = rng_x.standard_normal((T, QH)).astype(np.float32) / 8
    idx = np.stack([rng_x.choice(QE, K, replace=False) for _ in range(T)]).astype(np.int32)
    weight = rng_x.random((T, K)).astype(np.float32)
    out = moe_experts(x, idx, weight, params, activation="gptoss", implementation="xla")
    reference = checkpoint_moe(gpt_oss_expert, {**tensors, **dense}, x, idx, weight)
    assert rel_err(out, reference) < 1e-5


def test_mxfp4_mixed_with_a_dense_weight():
    tensors = gpt_oss_mxfp4_tensors(np.random.default_rng(13))
    dense_down = mxfp4_reference(tensors.pop("down_proj_blocks"), tensors.pop("down_proj_scales"))
    params = load_experts({**tensors, "down_proj": dense_down.astype(np.float32)}, "gpt_oss")
    assert params["w_gate_up"].dtype == jnp.bfloat16 and params["w_down"].dtype == jnp.float32
    np.testing.assert_array_equal(params["w_down"], dense_down)


def test_mxfp4_scale_range():
    tensors = gpt_oss_mxfp4_tensors(np.random.default_rng(14), scale_range=(3, 253))
    for name in ("gate_up_proj", "down_proj"):  # the extreme codes, both present
        tensors[f"{name}_scales"][0, 0, 0], tensors[f"{name}_scales"][0, 0, -1] = 3, 252
    params = load_experts(tensors, "gpt_oss", dtype=jnp.float32)
    reference = mxfp4_reference(tensors["gate_up_proj_blocks"], tensors["gate_up_proj_scales"])
    np.testing.assert_array_equal(np.asarray(params["w_gate_up"], np.float64), reference)
    with pytest.raises(ValueError, match="gate_up_proj overflows float16.*dtype=jnp.float32"):
        load_experts(tensors, "gpt_oss", dtype=jnp.float16)
    tensors["down_proj_scales"][1, 2, 0] = 255
    with pytest.raises(ValueError, match="down_proj_scales holds the NaN scale code 255"):
        load_experts(tensors, "gpt_oss")


@pytest.mark.parametrize(
    "mutate, match",
    [
        (
            lambda t: t.update(gate_up_proj_blocks=t["gate_up_proj_blocks"].astype(np.int8)),
            "gate_up_proj_blocks must be uint8",
        ),
        (
            lambda t: t.update(down_proj_scales=t["down_proj_scales"][:, :-1]),
            r"down_proj_scales must have shape \[3, 64, 1\]",
        ),
        (
            lambda t: t.update(down_proj_blocks=t["down_proj_blocks"][..., :8]),
            r"down_proj_blocks must have shape \[3, 64, 1, 16\]",
        ),
        (lambda t: t.pop("gate_up_proj_scales"), "no 'gate_up_proj_scales'"),
        (
            lambda t: t.update(gate_up_proj_blocks=t["gate_up_proj_blocks"][..., 0]),
            r"gate_up_proj_blocks must be \[E, 2I, H/32, 16\]",
        ),
    ],
)
def test_mxfp4_errors(mutate, match):
    tensors = gpt_oss_mxfp4_tensors(np.random.default_rng(15))
    mutate(tensors)
    with pytest.raises(ValueError, match=match):
        load_experts(tensors, "gpt_oss")


def test_gpt_oss_mxfp4_checkpoint_into_a_layer(tmp_path):
    """The README's recipe: one gpt-oss MLP block as the published checkpoints store it (router
    Linear weight [E, H] and bias, MXFP4 experts) into an NNX MoE, against transformers'
    GptOssMLP in float64 (router: top-k of the logits, softmax over those k)."""
    rng = np.random.default_rng(16)
    block = "model.layers.0.mlp."
    tensors = {f"{block}experts.{k}": v for k, v in gpt_oss_mxfp4_tensors(rng).items()}
    tensors[f"{block}router.weight"] = rng.standard_normal((QE, QH)).astype(np.float32)
    tensors[f"{block}router.bias"] = rng.standard_normal(QE).astype(np.float32)
    path = tmp_path / "model.safetensors"
    safetensors.numpy.save_file(tensors, str(path))
    tensors = moe_pallas.read_safetensors(path)

    layer = MoE(
        QH,
        QI,
        QE,
        K,
        activation="gptoss",
        router="topk_softmax",
        router_bias=True,
        expert_bias=True,
        rngs=nnx.Rngs(0),
    )
    params = load_experts(tensors, "gpt_oss", prefix=f"{block}experts.", dtype=jnp.float32)
    set_expert_params(layer, params)
    layer.router_kernel[...] = jnp.asarray(tensors[f"{block}router.weight"]).T
    layer.router_bias[...] = jnp.asarray(tensors[f"{block}router.bias"])
    x = rng.standard_normal((T, QH)) / 8
    out = layer(jnp.asarray(x, jnp.float32))

    experts = {}
    for name in ("gate_up_proj", "down_proj"):
        blocks, scales = (tensors[f"{block}experts.{name}_{part}"] for part in ("blocks", "scales"))
        experts[name] = mxfp4_reference(blocks, scales)
        experts[f"{name}_bias"] = np.asarray(tensors[f"{block}experts.{name}_bias"], np.float64)
    logits = (
        x @ tensors[f"{block}router.weight"].T.astype(np.float64) + tensors[f"{block}router.bias"]
    )
    reference = np.zeros_like(x)
    for t in range(T):
        top = np.argsort(-logits[t])[:K]
        weight = np.exp(logits[t, top] - logits[t, top].max())
        weight /= weight.sum()
        reference[t] = sum(w * gpt_oss_expert(experts, e, x[t]) for w, e in zip(weight, top))
    assert rel_err(out, reference) < 1e-5


# FP8 experts (DeepSeek-V3 / Qwen3 FP8 checkpoints): float8_e4m3fn weights [out, in] with one
# float32 factor per 128 x 128 block; sizes off the block edge.
FE, FH, FI = 2, 264, 136


def fp8_tensors(rng):
    tensors = {}
    for e in range(FE):
        for proj, shape in (
            ("gate_proj", (FI, FH)),
            ("up_proj", (FI, FH)),
            ("down_proj", (FH, FI)),
        ):
            key = f"{PREFIX}{e}.{proj}.weight"
            tensors[key] = jnp.asarray(rng.standard_normal(shape) * 100, jnp.float8_e4m3fn)
            blocks = (-(-shape[0] // 128), -(-shape[1] // 128))
            tensors[key + "_scale_inv"] = (rng.random(blocks) * 1e-3 + 1e-4).astype(np.float32)
    return tensors


def fp8_reference(tensors, key):
    """float32 [out, in]: each value times the factor of its 128 x 128 block, in float32."""
    weight = np.asarray(tensors[key].astype(jnp.float32))
    rows, cols = np.indices(weight.shape)
    return weight * np.asarray(tensors[key + "_scale_inv"])[rows // 128, cols // 128]


def test_fp8_experts_dequantised(tmp_path):
    rng = np.random.default_rng(18)
    path = tmp_path / "fp8.safetensors"
    safetensors.flax.save_file(fp8_tensors(rng), str(path))
    tensors = moe_pallas.read_safetensors(path)
    params = load_experts(tensors, "per_expert", prefix=PREFIX, dtype=jnp.float32)
    dense = {}
    for e in range(FE):
        for proj in ("gate_proj", "up_proj", "down_proj"):
            dense[f"{e}.{proj}.weight"] = fp8_reference(tensors, f"{PREFIX}{e}.{proj}.weight")
    for e in range(FE):
        want_gate_up = np.concatenate(
            [dense[f"{e}.gate_proj.weight"].T, dense[f"{e}.up_proj.weight"].T], 1
        )
        np.testing.assert_array_equal(params["w_gate_up"][e], want_gate_up)
        np.testing.assert_array_equal(params["w_down"][e], dense[f"{e}.down_proj.weight"].T)
    default = load_experts(tensors, "per_expert", prefix=PREFIX)
    assert default["w_down"].dtype == jnp.bfloat16
    np.testing.assert_array_equal(default["w_down"], params["w_down"].astype(jnp.bfloat16))
    x = rng.standard_normal((T, FH)).astype(np.float32) / 16
    idx = np.stack([rng.choice(FE, K, replace=False) for _ in range(T)]).astype(np.int32)
    weight = rng.random((T, K)).astype(np.float32)
    out = moe_experts(x, idx, weight, params, activation="swiglu", implementation="xla")
    assert rel_err(out, checkpoint_moe(swiglu_expert, dense, x, idx, weight)) < 1e-5


@pytest.mark.parametrize(
    "mutate, match",
    [
        (
            lambda t: t.pop(f"{PREFIX}1.up_proj.weight_scale_inv"),
            "no '.*1.up_proj.weight_scale_inv'",
        ),
        (
            lambda t: t.update(
                {f"{PREFIX}0.down_proj.weight_scale_inv": np.ones((2, 2), np.float32)}
            ),
            r"0\.down_proj\.weight_scale_inv must have shape \[3, 2\]",
        ),
        (
            lambda t: t.update(
                {
                    f"{PREFIX}0.gate_proj.weight": t[f"{PREFIX}0.gate_proj.weight"].astype(
                        jnp.bfloat16
                    )
                }
            ),
            "scales an FP8 weight, but .*0.gate_proj.weight is bfloat16",
        ),
        (
            lambda t: t.update({f"{PREFIX}1.down_proj.weight": np.zeros((FH, FI), np.int8)}),
            "1.down_proj.weight is int8",
        ),
    ],
)
def test_fp8_errors(mutate, match):
    tensors = fp8_tensors(np.random.default_rng(19))
    mutate(tensors)
    with pytest.raises(ValueError, match=match):
        load_experts(tensors, "per_expert", prefix=PREFIX)


def test_mixtral_names():
    tensors = per_expert_tensors(np.random.default_rng(20))
    renamed = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}
    mixtral = {}
    for key, value in tensors.items():
        e, proj, _ = key.split(".")
        mixtral[f"model.layers.1.block_sparse_moe.experts.{e}.{renamed[proj]}.weight"] = value
    params = load_experts(mixtral, "per_expert", prefix="model.layers.1.block_sparse_moe.experts.")
    for name, value in load_experts(tensors, "per_expert").items():
        np.testing.assert_array_equal(params[name], value)
    mixed = {**tensors, "3.w1.weight": tensors["3.gate_proj.weight"]}
    with pytest.raises(ValueError, match=r"missing 0\.w1\.weight .* one naming"):
        load_experts(mixed, "per_expert")


@pytest.mark.parametrize("layout", ["gpt_oss", "per_expert"])
def test_export_experts_inverts_load_experts(layout):
    rng = np.random.default_rng(22)
    tensors = gpt_oss_tensors(rng) if layout == "gpt_oss" else per_expert_tensors(rng)
    tensors = {PREFIX + k: v for k, v in tensors.items()}
    params = load_experts(tensors, layout, prefix=PREFIX)
    exported = moe_pallas.export_experts(params, layout, prefix=PREFIX)
    assert sorted(exported) == sorted(tensors)
    for name, value in tensors.items():
        np.testing.assert_array_equal(exported[name], value)


def test_export_experts_from_a_layer_through_a_file(tmp_path):
    """A trained layer's experts out to a gpt-oss checkpoint file and back, bit for bit (bf16)."""
    layer = MoE(
        H,
        I,
        E,
        K,
        activation="gptoss",
        expert_bias=True,
        param_dtype=jnp.bfloat16,
        rngs=nnx.Rngs(3),
    )
    path = tmp_path / "experts.safetensors"
    safetensors.flax.save_file(
        moe_pallas.export_experts(layer, "gpt_oss", prefix=PREFIX), str(path)
    )
    params = load_experts(moe_pallas.read_safetensors(path), "gpt_oss", prefix=PREFIX)
    for name, value in params.items():
        assert value.dtype == jnp.bfloat16
        np.testing.assert_array_equal(value, getattr(layer, name)[...])
    float32 = moe_pallas.export_experts(layer, "gpt_oss", dtype=jnp.float32)
    assert all(v.dtype == jnp.float32 for v in float32.values())


def test_export_experts_errors():
    params = load_experts(gpt_oss_tensors(np.random.default_rng(23)), "gpt_oss")
    no_bias = {k: v for k, v in params.items() if not k.startswith("b_")}
    with pytest.raises(ValueError, match="expert_bias=True"):
        moe_pallas.export_experts(no_bias, "gpt_oss")
    with pytest.raises(ValueError, match=r"'per_expert' takes exactly \['w_down', 'w_gate_up'\]"):
        moe_pallas.export_experts(params, "per_expert")
    with pytest.raises(ValueError, match="layout='mixtral'"):
        moe_pallas.export_experts(params, "mixtral")


def test_export_experts_writes_quantised_weights_as_stored(tmp_path):
    """Stored weights out to their layout's checkpoint form and back, bit for bit: gpt-oss MXFP4
    (blocks, scales, float32 biases) and per-expert FP8 with I = 136 (the loader's per-column
    factors) give back the very tensors loaded, also through a safetensors file; a SwiGLU
    weight from quantize_experts("fp8_block") with I = 128 and H = 480 (rows stored padded to
    512 bytes, written without the padding) loads back to the same weights; an
    up half starting inside a 128-column block, a format the layout does not hold, and FP8
    beside a dense weight are refused by name."""
    from moe_pallas import quant

    rng = np.random.default_rng(31)
    mx = gpt_oss_mxfp4_tensors(rng, inter=64)
    fp8 = {k: jnp.where(jnp.isnan(v), 0, v).astype(v.dtype) for k, v in fp8_tensors(rng).items()}
    for tensors, layout, prefix in ((mx, "gpt_oss", ""), (fp8, "per_expert", PREFIX)):
        stored = load_experts(tensors, layout, prefix=prefix, dequantize=False)
        exported = moe_pallas.export_experts(stored, layout, prefix=prefix)
        assert sorted(exported) == sorted(tensors)
        for name, value in tensors.items():
            assert exported[name].dtype == value.dtype, name
            np.testing.assert_array_equal(
                np.asarray(exported[name]).view(np.uint8), np.asarray(value).view(np.uint8)
            )
        path = tmp_path / f"{layout}.safetensors"
        safetensors.flax.save_file(exported, str(path))
        again = load_experts(
            moe_pallas.read_safetensors(path), layout, prefix=prefix, dequantize=False
        )
        for name, w in stored.items():
            if quant.is_quantized(w):
                np.testing.assert_array_equal(
                    again[name].values.view(jnp.uint8), w.values.view(jnp.uint8)
                )
                np.testing.assert_array_equal(again[name].scales, w.scales)

    dense = {
        "w_gate_up": jnp.asarray(rng.standard_normal((2, 480, 256)) / 16, jnp.bfloat16),
        "w_down": jnp.asarray(rng.standard_normal((2, 128, 480)) / 16, jnp.bfloat16),
    }
    qparams = moe_pallas.quantize_experts(dense, "fp8_block")
    assert qparams["w_gate_up"].values.shape == (2, 256, 512)
    exported = moe_pallas.export_experts(qparams, "per_expert")
    assert exported["0.gate_proj.weight"].shape == (128, 480)
    loaded = load_experts(exported, "per_expert", dequantize=False)
    for name in ("w_gate_up", "w_down"):
        assert loaded[name].values.shape == qparams[name].values.shape
        assert loaded[name].shape == qparams[name].shape
        np.testing.assert_array_equal(loaded[name].dequantize(), qparams[name].dequantize())

    straddling = moe_pallas.quantize_experts(
        {"w_gate_up": dense["w_gate_up"][:, :, :256], "w_down": dense["w_down"][:, :120]},
        "fp8_block",
    )
    with pytest.raises(ValueError, match="up_proj columns do not share one factor"):
        moe_pallas.export_experts(straddling, "per_expert")
    with pytest.raises(ValueError, match="'mxfp4', which 'per_expert' checkpoints do not hold"):
        moe_pallas.export_experts(
            moe_pallas.quantize_experts(
                {**dense, "w_gate_up": dense["w_gate_up"][:, :448]}, "mxfp4"
            ),
            "per_expert",
        )
    with pytest.raises(ValueError, match="both weights in FP8 or neither"):
        moe_pallas.export_experts({**dense, "w_down": qparams["w_down"]}, "per_expert")
