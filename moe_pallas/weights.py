"""Expert weights from checkpoint layouts into the `params` of `moe_experts` / a `MoE` layer
(`load_experts`, `set_expert_params`), and back out (`export_experts`: dense weights, or
`QuantizedWeight`s in the stored form of their layout below).

`tensors` is a mapping of names to arrays as read by `read_safetensors(path)` (or
`safetensors.numpy.load_file(path)`, `safetensors.flax.load_file(path)`, which cannot read FP8),
names relative to the experts module (or give `prefix`, e.g. "model.layers.0.mlp.experts.").
Layouts:

  - "gpt_oss" (transformers GptOssExperts, activation "gptoss"):
        gate_up_proj [E, H, 2I] (gate/up columns interleaved)  -> w_gate_up
        gate_up_proj_bias [E, 2I]                              -> b_gate_up
        down_proj [E, I, H]                                    -> w_down
        down_proj_bias [E, H]                                  -> b_down
    or, as the published gpt-oss checkpoints store the two weights, MXFP4-quantised (OCP
    microscaling: 32 e2m1 values share one power-of-two scale), dequantised here exactly:
        gate_up_proj_blocks [E, 2I, H/32, 16] uint8, gate_up_proj_scales [E, 2I, H/32] uint8
        down_proj_blocks [E, H, I/32, 16] uint8,     down_proj_scales [E, H, I/32] uint8
  - "per_expert" (Qwen3-MoE, DeepSeek-V3, Mixtral-style linear weights `[out, in]`, activation
    "swiglu"), for e in 0..E-1:
        {e}.gate_proj.weight [I, H], {e}.up_proj.weight [I, H]  -> w_gate_up[e] = [gateᵀ | upᵀ]
        {e}.down_proj.weight [H, I]                            -> w_down[e] = downᵀ
    or with Mixtral's names {e}.w1.weight (gate), {e}.w3.weight (up), {e}.w2.weight (down).
    An FP8 weight (float8_e4m3fn, as the DeepSeek-V3 and Qwen3 FP8 checkpoints store them) comes
    with `{e}.{proj}.weight_scale_inv` [ceil(out/128), ceil(in/128)], one float32 factor per
    128 x 128 block, and is dequantised here as their loaders do: block · factor in float32.
"""

import functools
import re
from collections.abc import Mapping
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

from moe_pallas import quant
from moe_pallas.kernels.mx_words import mxfp4_pack, mxfp4_unpack
from moe_pallas.layer import MoE

Layout = Literal["gpt_oss", "per_expert"]
LAYOUTS: tuple[str, ...] = ("gpt_oss", "per_expert")
_GPT_OSS = {
    "w_gate_up": "gate_up_proj",
    "b_gate_up": "gate_up_proj_bias",
    "w_down": "down_proj",
    "b_down": "down_proj_bias",
}
_PER_EXPERT = re.compile(r"(\d+)\.(gate_proj|up_proj|down_proj|w1|w3|w2)\.weight")
# Mixtral's names for the same three weights (w1 gate, w3 up, w2 down).
_MIXTRAL = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}


def _get(tensors: Mapping[str, Any], key: str) -> jax.Array:
    if key not in tensors:
        nearby = sorted(tensors)[:8]
        raise ValueError(
            f"tensors has no {key!r} (first keys: {nearby}); check `layout` and `prefix`."
        )
    return jnp.asarray(tensors[key])


def _check_shape(name: str, array: jax.Array, shape: tuple[int, ...]) -> None:
    if array.shape != shape:
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(array.shape)}.")


# e2m1 code -> value: sign bit 3, exponent bits 2-1 (bias 1; 0 is subnormal), mantissa bit 0.
_E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)
_E8M0_NAN = 255  # the OCP scale code for NaN
# Quantised weights load as bf16 unless asked otherwise: it holds every MXFP4 value exactly, and
# transformers loads MXFP4 gpt-oss experts as bf16 too.
_DEFAULT_QUANTISED_DTYPE = jnp.bfloat16


def _mxfp4_transposed(blocks, scales):
    """One expert: blocks [R, G, 16] uint8 and scales [R, G] uint8 -> float32 [32·G, R], the
    transpose of row r's values e2m1(code) · 2^(scale − 127), value 2j of a block from the low
    nibble of byte j and value 2j + 1 from its high nibble."""
    codes = jnp.stack([blocks & 0xF, blocks >> 4], axis=-1).reshape(*scales.shape, 32)
    values = jnp.asarray(_E2M1)[codes]
    # A power-of-two factor: exact in float32 while the product stays normal (scale >= 3).
    values = jnp.ldexp(values, scales.astype(jnp.int32)[..., None] - 127)
    return values.reshape(scales.shape[0], -1).T


@functools.partial(jax.jit, static_argnames="dtype")
def _mxfp4_dense(blocks, scales, dtype):
    """(dense [E, K, N] in dtype, whether a scale is the NaN code, whether all values are finite):
    one expert at a time, so the float32 temporaries stay one expert's size."""
    dense = jax.lax.map(lambda bs: _mxfp4_transposed(*bs).astype(dtype), (blocks, scales))
    return dense, jnp.any(scales == _E8M0_NAN), jnp.all(jnp.isfinite(dense))


def _dequantize_mxfp4(
    tensors, prefix: str, name: str, shape: tuple[int, ...], dtype: jnp.dtype
) -> jax.Array:
    """`name`_blocks / `name`_scales -> the dense [E, K, N] weight `shape` in `dtype`."""
    blocks, scales = (_get(tensors, f"{prefix}{name}_{part}") for part in ("blocks", "scales"))
    experts, k, n = shape
    if k % 32:
        raise ValueError(f"{name}: MXFP4 blocks hold 32 values, but its input dimension is {k}.")
    for part, array, want in (
        ("blocks", blocks, (experts, n, k // 32, 16)),
        ("scales", scales, (experts, n, k // 32)),
    ):
        if array.dtype != jnp.uint8:
            raise ValueError(f"{name}_{part} must be uint8 (MXFP4), got {array.dtype}.")
        _check_shape(f"{name}_{part}", array, want)
    dense, nan_scale, finite = _mxfp4_dense(blocks, scales, dtype)
    if bool(nan_scale):
        raise ValueError(
            f"{name}_scales holds the NaN scale code {_E8M0_NAN}: the checkpoint is corrupt."
        )
    if not bool(finite):
        raise ValueError(
            f"{name} overflows {dtype.name} once dequantised (scales up to "
            f"2^{int(jnp.max(scales)) - 127}); pass dtype=jnp.float32 or jnp.bfloat16."
        )
    return dense


@jax.jit
def _mxfp4_stored(blocks, scales):
    """gpt-oss's blocks [E, N, K/32, 16] / scales [E, N, K/32] -> `quant`'s "mxfp4" values
    [E, N, K/2] (`mx_words.mxfp4_pack`'s words of k = r.. and K/2 + r..) and scales [E, K/32, N]:
    integer ops only, the codes unchanged."""
    codes = jnp.stack([blocks & 0xF, blocks >> 4], axis=-1).reshape(*blocks.shape[:2], -1)
    half = codes.shape[2] // 2  # codes [E, N, K]
    values = mxfp4_pack(codes[:, :, :half], codes[:, :, half:])
    return values, jnp.swapaxes(scales, 1, 2)


def _stored_mxfp4(tensors, prefix, name, shape, dtype) -> quant.QuantizedWeight:
    blocks, scales = (_get(tensors, f"{prefix}{name}_{part}") for part in ("blocks", "scales"))
    experts, k, n = shape
    if k % 64:
        raise ValueError(
            f"{name}: its input dimension {k} is not a multiple of 64, which the stored MXFP4 "
            "layout needs (quant's two halves of K); pass dequantize=True."
        )
    for part, array, want in (
        ("blocks", blocks, (experts, n, k // 32, 16)),
        ("scales", scales, (experts, n, k // 32)),
    ):
        if array.dtype != jnp.uint8:
            raise ValueError(f"{name}_{part} must be uint8 (MXFP4), got {array.dtype}.")
        _check_shape(f"{name}_{part}", array, want)
    if bool(jnp.any(scales == _E8M0_NAN)):
        raise ValueError(
            f"{name}_scales holds the NaN scale code {_E8M0_NAN}: the checkpoint is corrupt."
        )
    values, stored_scales = _mxfp4_stored(blocks, scales)
    return quant.with_scale_bound(
        quant.QuantizedWeight(values, stored_scales, "mxfp4", jnp.dtype(dtype))
    )


def _load_gpt_oss(tensors, prefix, quantised_dtype, dequantize=True):
    if prefix + "gate_up_proj_blocks" in tensors:
        blocks = _get(tensors, prefix + "gate_up_proj_blocks")
        if blocks.ndim != 4 or blocks.shape[3] != 16:
            raise ValueError(
                f"gate_up_proj_blocks must be [E, 2I, H/32, 16] (MXFP4), got {list(blocks.shape)}."
            )
        experts, two_inter, hidden = blocks.shape[0], blocks.shape[1], 32 * blocks.shape[2]
    else:
        w_gate_up = _get(tensors, prefix + "gate_up_proj")
        if w_gate_up.ndim != 3:
            raise ValueError(f"gate_up_proj must be [E, H, 2I], got {list(w_gate_up.shape)}.")
        experts, hidden, two_inter = w_gate_up.shape
    if two_inter % 2:
        raise ValueError(f"gate_up_proj's 2I = {two_inter} must be even (gate/up pairs).")
    shapes = {
        "w_gate_up": (experts, hidden, two_inter),
        "b_gate_up": (experts, two_inter),
        "w_down": (experts, two_inter // 2, hidden),
        "b_down": (experts, hidden),
    }
    params = {}
    for name, source in _GPT_OSS.items():
        if prefix + source + "_blocks" in tensors:
            load = _dequantize_mxfp4 if dequantize else _stored_mxfp4
            params[name] = load(tensors, prefix, source, shapes[name], quantised_dtype)
        else:
            params[name] = _get(tensors, prefix + source)
            _check_shape(source, params[name], shapes[name])
    return params


_FP8_BLOCK = 128  # the block edge of the FP8 checkpoints' weight_scale_inv
_FLOAT_DTYPES = tuple(jnp.dtype(d) for d in (jnp.float16, jnp.bfloat16, jnp.float32, jnp.float64))


def _per_expert_weight(
    tensors, key: str, shape: tuple[int, int], quantised_dtype, dequantize=True
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """tensors[key] [out, in], checked against shape; an FP8 one times its block factors
    (module doc), in `quantised_dtype`, or without dequantize its (values, factors)."""
    weight = _get(tensors, key)
    _check_shape(key, weight, shape)
    scale_key = key + "_scale_inv"
    if jnp.dtype(weight.dtype) in _FLOAT_DTYPES:
        if scale_key in tensors:
            raise ValueError(f"{scale_key} scales an FP8 weight, but {key} is {weight.dtype}.")
        return weight
    if not (jnp.issubdtype(weight.dtype, jnp.floating) and jnp.finfo(weight.dtype).bits == 8):
        raise ValueError(f"{key} is {weight.dtype}: expert weights must be float (or FP8).")
    if scale_key not in tensors:
        raise ValueError(
            f"{key} is {weight.dtype} but tensors has no {scale_key!r} (its 128 x 128 block "
            "factors); FP8 values alone are not the weights."
        )
    scale = _get(tensors, scale_key)
    _check_shape(scale_key, scale, tuple(-(-d // _FP8_BLOCK) for d in shape))
    if not dequantize:
        if weight.dtype != jnp.float8_e4m3fn:
            raise ValueError(f"{key} is {weight.dtype}; kept as stored it must be float8_e4m3fn.")
        return weight, scale.astype(jnp.float32)
    return _fp8_dense(weight, scale, quantised_dtype)


@functools.partial(jax.jit, static_argnames="dtype")
def _fp8_dense(weight, scale, dtype):
    """weight [out, in] times the float32 factor of its 128 x 128 block, in float32, as dtype."""
    factor = jnp.repeat(jnp.repeat(scale.astype(jnp.float32), _FP8_BLOCK, 0), _FP8_BLOCK, 1)
    return (weight.astype(jnp.float32) * factor[: weight.shape[0], : weight.shape[1]]).astype(dtype)


def _stack_fp8(parts, inter, dtype, fp8) -> quant.QuantizedWeight:
    """Per expert the ([out, in] values, [out/128, in/128] factors) of each part (gate and up, or
    down) in `quant`'s "fp8_block" layout: values as stored, [E, N, K] (rows padded to
    `quant.row_pitch`), factors transposed, [E, K/128, N/128], the parts concatenated along N;
    where I is not a multiple of 128, the up half's columns start inside a block, and the
    factors are stored per column, [E, K/128, N]."""
    if not all(fp8):
        raise ValueError(
            "an expert mixes FP8 and float weights; pass dequantize=True to load it dense."
        )
    per_column = len(parts[0]) > 1 and inter % _FP8_BLOCK

    def columns(v, s):  # [K/128, N/128] factors, per column where gate|up split a block
        s = s.T
        return jnp.repeat(s, _FP8_BLOCK, axis=1)[:, : v.shape[0]] if per_column else s

    values = jnp.stack([jnp.concatenate([v for v, _ in expert], axis=0) for expert in parts])
    scales = jnp.stack([jnp.concatenate([columns(*p) for p in expert], axis=1) for expert in parts])
    return quant.with_row_pitch(
        quant.QuantizedWeight(values, scales, "fp8_block", jnp.dtype(dtype))
    )


def _load_per_expert(tensors, prefix, quantised_dtype, dequantize=True):
    found = {}
    for key in tensors:
        match = _PER_EXPERT.fullmatch(key[len(prefix) :]) if key.startswith(prefix) else None
        if match:
            found.setdefault(int(match.group(1)), set()).add(match.group(2))
    if not found:
        raise ValueError(
            f"tensors has no '{prefix}{{e}}.gate_proj.weight' (or Mixtral's '{prefix}{{e}}.w1.weight') "
            "keys; check `layout` and `prefix`."
        )
    mixtral = any("w1" in names for names in found.values())
    name = {p: _MIXTRAL[p] if mixtral else p for p in _MIXTRAL}
    num_experts = max(found) + 1
    for e in range(num_experts):
        for proj in name.values():
            if proj not in found.get(e, ()):
                raise ValueError(
                    f"tensors is missing {prefix}{e}.{proj}.weight (experts 0..{num_experts - 1} "
                    "must all be present, with one naming: gate/up/down_proj or w1/w3/w2)."
                )
    gate0 = _get(tensors, f"{prefix}0.{name['gate_proj']}.weight")
    if gate0.ndim != 2:
        raise ValueError(
            f"{prefix}0.{name['gate_proj']}.weight must be [I, H], got {list(gate0.shape)}."
        )
    inter, hidden = gate0.shape
    gate_up, down = [], []
    shapes = {
        "gate_proj": (inter, hidden),
        "up_proj": (inter, hidden),
        "down_proj": (hidden, inter),
    }
    stored = []
    for e in range(num_experts):
        weight = {
            p: _per_expert_weight(
                tensors, f"{prefix}{e}.{name[p]}.weight", shape, quantised_dtype, dequantize
            )
            for p, shape in shapes.items()
        }
        stored += [isinstance(w, tuple) for w in weight.values()]
        if any(stored):
            gate_up.append((weight["gate_proj"], weight["up_proj"]))
            down.append((weight["down_proj"],))
            continue
        gate_up.append(jnp.concatenate([weight["gate_proj"].T, weight["up_proj"].T], axis=1))
        down.append(weight["down_proj"].T)
    if any(stored):
        return {
            "w_gate_up": _stack_fp8(gate_up, inter, quantised_dtype, stored),
            "w_down": _stack_fp8(down, inter, quantised_dtype, stored),
        }
    return {"w_gate_up": jnp.stack(gate_up), "w_down": jnp.stack(down)}


def load_experts(
    tensors: Mapping[str, Any],
    layout: Layout,
    *,
    prefix: str = "",
    dtype: Any = None,
    dequantize: bool = True,
) -> dict[str, jax.Array]:
    """Build `moe_experts` params (`w_gate_up [E, H, 2I]`, `w_down [E, I, H]`, biases for gpt_oss)
    from checkpoint tensors in `layout` (see the module doc); cast to `dtype` if given. MXFP4 and
    FP8 weights are dequantised to `dtype`, by default bfloat16 (MXFP4 exactly: e2m1 values carry
    2 significant bits); ValueError for a NaN scale code, a value `dtype` cannot hold, or FP8
    values without their block factors. With dequantize=False the quantised weights come back
    as stored, `moe_pallas.QuantizedWeight`s of logical dtype `dtype` (default bfloat16): gpt-oss
    MXFP4 as "mxfp4" (input dimensions multiples of 64), FP8 with block factors as "fp8_block"
    (per-column factors where the intermediate size is not a multiple of 128), transposed to the [K, N] layout once here."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r}; use one of {LAYOUTS}.")
    if not isinstance(tensors, Mapping):
        raise TypeError(
            f"tensors must be a mapping of names to arrays, got {type(tensors).__name__}; "
            "e.g. moe_pallas.read_safetensors(path)."
        )
    quantised_dtype = jnp.dtype(_DEFAULT_QUANTISED_DTYPE if dtype is None else dtype)
    load = _load_gpt_oss if layout == "gpt_oss" else _load_per_expert
    params = load(tensors, prefix, quantised_dtype, dequantize)
    return {
        k: v if dtype is None or quant.is_quantized(v) else v.astype(dtype)
        for k, v in params.items()
    }


_WEIGHTS, _BIASES = ("w_gate_up", "w_down"), ("b_gate_up", "b_down")


def _expert_names(layer: MoE) -> tuple[str, ...]:
    """The NNX layer's expert parameters: the weights, and the biases with expert_bias."""
    return _WEIGHTS + (_BIASES if layer.config.expert_bias else ())


def set_expert_params(layer, params: Mapping[str, jax.Array]) -> None:
    """Write expert `params` (from `load_experts`) into an NNX `moe_pallas.MoE` layer, in place,
    cast to the layer's parameter dtype. Shapes and bias presence must match the layer's config;
    the layer's activation must match the layout ("gptoss" for gpt_oss, "swiglu" for per_expert).
    A `QuantizedWeight` (`load_experts(..., dequantize=False)`, `quantize_experts`) is stored in
    the layer as it is, its logical dtype set to the parameter dtype: the layer's forward and
    gradients of x run on it; train on dense weights (`dequantize_experts`)."""
    if not isinstance(layer, MoE):
        raise TypeError(f"layer must be a moe_pallas.MoE, got {type(layer).__name__}.")
    expected = set(_expert_names(layer))
    given = {k for k, v in params.items() if v is not None}
    extra = given - expected
    if extra and extra <= set(_BIASES):
        raise ValueError(
            "params hold expert biases but the layer has expert_bias=False; build it with "
            "MoE(..., expert_bias=True)."
        )
    if given != expected:
        raise ValueError(
            f"params must hold exactly {sorted(expected)} for this layer "
            f"(expert_bias={layer.config.expert_bias}), got {sorted(given)}."
        )
    values = {
        name: params[name] if quant.is_quantized(params[name]) else jnp.asarray(params[name])
        for name in sorted(expected)
    }
    for name, value in values.items():  # check all before writing any: no half-loaded layer
        _check_shape(f"params[{name!r}]", value, tuple(getattr(layer, name).shape))
    for name, value in values.items():
        variable = getattr(layer, name)
        if quant.is_quantized(value) or quant.is_quantized(variable[...]):
            variable.set_value(value.astype(variable.dtype))  # a QuantizedWeight stays as stored
        else:
            variable[...] = value.astype(variable.dtype)


def export_experts(
    params: "Mapping[str, jax.Array] | MoE", layout: Layout, *, prefix: str = "", dtype: Any = None
) -> dict[str, jax.Array]:
    """The inverse of `load_experts`: checkpoint tensors in `layout`, named with `prefix`, from
    `moe_experts` params or an NNX `MoE` layer's experts, dense ones cast to `dtype` if given;
    e.g. for `safetensors.flax.save_file`. gpt_oss needs the expert biases (GptOssExperts has
    them); per_expert has no place for them. `QuantizedWeight`s are written as stored, bit for
    bit, in the form their layout's checkpoints publish: "mxfp4" as gpt_oss's `_blocks` /
    `_scales`, "fp8_block" as per_expert's float8_e4m3fn weights with their 128 x 128 block
    factors `_scale_inv` (both weights quantised: the loader takes no mix there)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r}; use one of {LAYOUTS}.")
    if isinstance(params, MoE):
        params = {name: getattr(params, name)[...] for name in _expert_names(params)}
    given = {k for k, v in params.items() if v is not None}
    expected = set(_GPT_OSS) if layout == "gpt_oss" else set(_WEIGHTS)
    if given != expected:
        raise ValueError(
            f"layout {layout!r} takes exactly {sorted(expected)}, got {sorted(given)}"
            + ("; build the layer with expert_bias=True." if layout == "gpt_oss" else ".")
        )
    cast = (lambda v: v) if dtype is None else (lambda v: v.astype(dtype))
    stored = {n: params[n] for n in _WEIGHTS if quant.is_quantized(params[n])}
    want = "mxfp4" if layout == "gpt_oss" else "fp8_block"
    for name, w in stored.items():
        if w.fmt != want:
            raise ValueError(
                f"params[{name!r}] is stored as {w.fmt!r}, which {layout!r} checkpoints do not "
                f"hold (they store {want!r}); quantize with fmt={want!r}, export the other "
                "layout, or dequantize_experts(params) first."
            )
    if layout == "gpt_oss":
        tensors = {}
        for n, source in _GPT_OSS.items():
            if n in stored:
                blocks, scales = _mxfp4_checkpoint(stored[n].values, stored[n].scales)
                tensors[f"{prefix}{source}_blocks"] = blocks
                tensors[f"{prefix}{source}_scales"] = scales
            else:
                tensors[prefix + source] = cast(jnp.asarray(params[n]))
        return tensors
    if stored:
        return _fp8_checkpoint(stored, prefix)
    w_gate_up, w_down = jnp.asarray(params["w_gate_up"]), jnp.asarray(params["w_down"])
    inter = w_gate_up.shape[2] // 2
    tensors = {}
    for e in range(w_gate_up.shape[0]):
        tensors[f"{prefix}{e}.gate_proj.weight"] = cast(w_gate_up[e, :, :inter].T)
        tensors[f"{prefix}{e}.up_proj.weight"] = cast(w_gate_up[e, :, inter:].T)
        tensors[f"{prefix}{e}.down_proj.weight"] = cast(w_down[e].T)
    return tensors


@jax.jit
def _mxfp4_checkpoint(values, scales):
    """`quant`'s "mxfp4" values [E, N, K/2] / scales [E, K/32, N] -> gpt-oss's blocks
    [E, N, K/32, 16] / scales [E, N, K/32] (the inverse of `_mxfp4_stored`): integer ops only,
    an expert at a time (the int32 codes are 8x the stored bytes)."""

    def one(v):
        codes = jnp.concatenate(mxfp4_unpack(v), axis=-1)  # [N, K]
        pairs = codes.reshape(codes.shape[0], -1, 16, 2)
        return (pairs[..., 0] | (pairs[..., 1] << 4)).astype(jnp.uint8)

    blocks = jax.lax.map(one, values, batch_size=min(quant.QUANTIZE_CHUNK, values.shape[0]))
    return blocks, jnp.swapaxes(scales, 1, 2)


def _fp8_checkpoint(stored, prefix):
    """per_expert tensors of "fp8_block" weights: each projection's float8_e4m3fn [out, in]
    values and its [ceil(out/128), ceil(in/128)] factors. A weight's factors are per column
    block of its N (gate and up side by side in w_gate_up) or per column; a projection's 128
    columns must share one factor, as the checkpoints' blocks do (true of what `load_experts`
    and `quantize_experts` make, but for an up half that starts inside a block of a
    `quantize_experts` weight whose I is not a multiple of 128)."""
    if set(stored) != set(_WEIGHTS):
        raise ValueError(
            "per_expert checkpoints hold both weights in FP8 or neither; quantize both "
            "(quantize_experts) or dequantize_experts(params) first."
        )
    inter = stored["w_down"].shape[1]
    projections = {
        "gate_proj": ("w_gate_up", 0, inter),
        "up_proj": ("w_gate_up", inter, inter),
        "down_proj": ("w_down", 0, stored["w_down"].shape[2]),
    }
    tensors = {}
    for proj, (name, c0, width) in projections.items():
        w = stored[name]
        values = w.values[:, c0 : c0 + width, : w.shape[1]]  # [E, out, in], no row padding
        columns = w.scales
        if columns.shape[2] != w.shape[2]:  # block form: each column's block's factor
            columns = jnp.repeat(columns, _FP8_BLOCK, axis=2)[:, :, : w.shape[2]]
        columns = columns[:, :, c0 : c0 + width]  # [E, in/128, out]
        factors = columns[:, :, ::_FP8_BLOCK]
        spread = jnp.repeat(factors, _FP8_BLOCK, axis=2)[:, :, :width]
        if not bool(jnp.array_equal(spread, columns)):
            raise ValueError(
                f"params[{name!r}]'s {proj} columns do not share one factor per 128-column "
                "block, which per_expert checkpoints need; quantize with I a multiple of 128 "
                "or export dequantize_experts(params)."
            )
        for e in range(values.shape[0]):
            tensors[f"{prefix}{e}.{proj}.weight"] = values[e]
            tensors[f"{prefix}{e}.{proj}.weight_scale_inv"] = factors[e].T
    return tensors
