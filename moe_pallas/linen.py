"""`moe_pallas.linen.MoE`: the MoE layer for Flax Linen codebases (same config and math as the
NNX `moe_pallas.MoE`; see `moe_pallas.layer`).

Its attributes are `MoEConfig`'s fields, taken from there (one definition of the layer's
options). Collections: "params" (same names, shapes, initialisers and `nn.Partitioned` "expert"
annotations as the NNX layer), "moe_buffers" (the DeepSeek-V3 "correction_bias", not trained;
pass `mutable=["moe_buffers"]` to `update_correction_bias`), "intermediates" (the sown aux
values). "w_gate_up" / "w_down" may be replaced by `moe_pallas.QuantizedWeight`s of the same
logical shapes (forward and gradients of x, as in the NNX layer).
"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from moe_pallas import quant
from moe_pallas.layer import AUX_NAMES, MoEConfig, corrected_bias, moe_apply


def _param(self, name: str, shape, init, names):
    """The "params" entry `name`. Expert weights stored quantised (`moe_pallas.quantize_experts`,
    `load_experts(..., dequantize=False)`) put into the collection by the caller are used as
    stored, forward only, as in the NNX layer; `self.param` would compare their stored arrays'
    shapes with the dense initialiser's."""
    if self.has_variable("params", name):
        stored = self.get_variable("params", name)
        if quant.is_quantized(stored):
            if stored.shape != tuple(shape):
                raise ValueError(
                    f'params["{name}"] is a quantised weight of logical shape {stored.shape}; '
                    f"this layer's is {tuple(shape)}: quantise weights of the layer's shapes."
                )
            return stored
    return self.param(name, nn.with_partitioning(init, names), shape, self.param_dtype)


def _setup(self):
    config = MoEConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(MoEConfig)})
    self.config = config
    self.weights = {
        name: _param(self, name, shape, init, names)
        for name, (shape, init, names) in config.param_specs().items()
    }
    if config.router == "sigmoid_group_topk":
        self.correction_bias = self.variable(
            "moe_buffers", "correction_bias", jnp.zeros, (config.num_experts,), jnp.float32
        )


def _call(self, x: jax.Array, *, return_aux: bool = False):
    """y = layer(x) for x[..., H]; (y, aux) with `return_aux=True`; aux is also sown."""
    params = dict(self.weights)
    if self.config.router == "sigmoid_group_topk":
        params["correction_bias"] = self.correction_bias.value
    y, aux = moe_apply(self.config, params, x)
    for name in AUX_NAMES:
        self.sow("intermediates", name, aux[name])
    return (y, aux) if return_aux else y


def _update_correction_bias(self, expert_counts: jax.Array, rate: float = 1e-3) -> None:
    """DeepSeek-V3 balancing rule on "moe_buffers"; a no-op for other routers."""
    if self.config.router == "sigmoid_group_topk":
        self.correction_bias.value = corrected_bias(self.correction_bias.value, expert_counts, rate)


def _linen_module() -> type:
    fields = dataclasses.fields(MoEConfig)
    namespace = {
        "__module__": __name__,
        "__qualname__": "MoE",
        "__doc__": "Mixture-of-Experts layer; attributes as the arguments of `moe_pallas.MoE` "
        "(without `rngs`), i.e. the fields of `moe_pallas.layer.MoEConfig`.",
        "__annotations__": {f.name: f.type for f in fields},
        "setup": _setup,
        "__call__": _call,
        "update_correction_bias": _update_correction_bias,
    }
    namespace |= {f.name: f.default for f in fields if f.default is not dataclasses.MISSING}
    return type("MoE", (nn.Module,), namespace)


MoE = _linen_module()
