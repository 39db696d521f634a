"""`moe_pallas.linen.MoE`: the MoE layer for Flax Linen codebases (same config and math as the
NNX `moe_pallas.MoE`; see `moe_pallas.layer`).

Collections: "params" (same names, shapes, initialisers and `nn.Partitioned` "expert" annotations
as the NNX layer), "moe_buffers" (the DeepSeek-V3 "correction_bias", not trained; pass
`mutable=["moe_buffers"]` to `update_correction_bias`), "intermediates" (the sown aux values).
"""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from moe_pallas.activations import Activation
from moe_pallas.backends import Implementation
from moe_pallas.layer import AUX_NAMES, MoEConfig, corrected_bias, moe_apply
from moe_pallas.routing import RouterMethod


class MoE(nn.Module):
    """Mixture-of-Experts layer; arguments as in `moe_pallas.MoE` (without `rngs`)."""

    hidden_size: int
    intermediate_size: int
    num_experts: int
    top_k: int
    activation: Activation = "swiglu"
    router: RouterMethod = "softmax_topk"
    renormalize: bool = False
    router_bias: bool = False
    n_group: int | None = None
    topk_group: int | None = None
    routed_scaling_factor: float = 1.0
    expert_bias: bool = False
    shared_intermediate_size: int = 0
    aux_loss_coef: float = 0.01
    z_loss_coef: float = 0.0
    dtype: Any = None
    param_dtype: Any = jnp.float32
    implementation: Implementation = "auto"
    mesh: jax.sharding.Mesh | None = None
    expert_axis: str = "expert"
    exchange: str | None = None
    capacity_factor: float | None = None

    def setup(self):
        config = MoEConfig(
            **{field: getattr(self, field) for field in MoEConfig.__dataclass_fields__}
        )
        self.config = config
        self.weights = {
            name: self.param(name, nn.with_partitioning(init, names), shape, self.param_dtype)
            for name, (shape, init, names) in config.param_specs().items()
        }
        if config.router == "sigmoid_group_topk":
            self.correction_bias = self.variable(
                "moe_buffers", "correction_bias", jnp.zeros, (config.num_experts,), jnp.float32
            )

    def __call__(self, x: jax.Array, *, return_aux: bool = False):
        """y = layer(x) for x[..., H]; (y, aux) with `return_aux=True`; aux is also sown."""
        params = dict(self.weights)
        if self.config.router == "sigmoid_group_topk":
            params["correction_bias"] = self.correction_bias.value
        y, aux = moe_apply(self.config, params, x)
        for name in AUX_NAMES:
            self.sow("intermediates", name, aux[name])
        return (y, aux) if return_aux else y

    def update_correction_bias(self, expert_counts: jax.Array, rate: float = 1e-3) -> None:
        """DeepSeek-V3 balancing rule on "moe_buffers"; a no-op for other routers."""
        if self.config.router == "sigmoid_group_topk":
            self.correction_bias.value = corrected_bias(
                self.correction_bias.value, expert_counts, rate
            )
