"""`MoE`: the Mixture-of-Experts layer for Flax NNX (router + experts + optional shared expert).

For `x[..., H]`, flattened to `x2d[T, H]`:

    logits = x2d @ router_kernel (+ router_bias)                               float32, [T, E]
    topk_idx, topk_weight, aux = route(logits, top_k, method=router, ...)      moe_pallas.routing
    y = moe_experts(x2d, topk_idx, topk_weight, experts, activation)            [T, H]
        + act(x2d @ shared_w_gate_up) @ shared_w_down                           if shared experts
    aux_loss = aux_loss_coef * load_balancing_loss + z_loss_coef * z_loss

Expert weights are stored as `moe_experts` takes them (`w_gate_up [E, H, 2I]`, `w_down [E, I, H]`,
optional `b_gate_up [E, 2I]`, `b_down [E, H]`) and annotated with the `expert_axis` mesh axis on E
(`nnx.get_partition_spec(nnx.state(layer))` gives their PartitionSpecs). They are placed sharded at
creation only when a mesh holding `expert_axis` is active (`jax.set_mesh`); otherwise the annotation
is metadata only, so a layer can be built anywhere.

The DeepSeek-V3 correction bias (router="sigmoid_group_topk") is a `RouterCorrectionBias`, not an
`nnx.Param`: optimizers built with `wrt=nnx.Param` leave it alone; `update_correction_bias` applies
the auxiliary-loss-free balancing rule to it.
"""

import dataclasses
import inspect
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from flax.core import meta

from moe_pallas.activations import ACTIVATIONS, Activation, glu, split_gate_up
from moe_pallas.backends import IMPLEMENTATIONS, Implementation
from moe_pallas.experts import moe_experts
from moe_pallas.routing import ROUTER_METHODS, RouterMethod, route

EXPERT_PARAM_NAMES = ("w_gate_up", "w_down", "b_gate_up", "b_down")
AUX_NAMES = ("aux_loss", "load_balancing_loss", "z_loss", "expert_counts", "dropped_rows")


class RouterCorrectionBias(nnx.Variable):
    """Per-expert bias added to router scores for expert selection only (DeepSeek-V3
    `e_score_correction_bias`). Not trained by gradients: update it with
    `MoE.update_correction_bias` from the expert loads of each step."""


def drawn_in_float32(init):
    """`init` drawing in float32 and rounding to the requested dtype. jax.random's truncated normal
    in bfloat16 works from 8-bit uniforms: its mean is biased by -0.018 sigma and it takes 128
    distinct values; drawn in float32 and rounded, the mean is unbiased and every bf16 value in
    range can occur."""

    def draw(key, shape, dtype=jnp.float32):
        return init(key, shape, jnp.float32).astype(dtype)

    return draw


def per_expert(init):
    """`init` of an `[E, ...]` parameter drawn one expert at a time: `jax.lax.map` over E split
    keys, each returning its `[...]` slice in the parameter dtype. Each slice has the law `init`
    gives a `[...]` array (fan-in variance scaling: truncated normal of variance 1 / fan_in, the
    fan-in of a slice being its second-to-last dimension, as with the expert axis batched), and
    the temporaries are one slice's (float32, see `drawn_in_float32`): drawing `[E, H, 2I]` at
    once would hold float32 copies of the whole tensor (31.6 GiB for gpt-oss's 3.96 GiB bf16
    w_gate_up)."""

    def draw(key, shape, dtype=jnp.float32):
        keys = jax.random.split(key, shape[0])
        return jax.lax.map(lambda k: init(k, shape[1:], dtype), keys)

    return draw


@dataclasses.dataclass(frozen=True)
class MoEConfig:
    """Static configuration of a MoE layer, shared by the NNX and Linen layers (see `MoE`)."""

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
    fp8_training: bool = False

    def __post_init__(self):
        for name in ("hidden_size", "intermediate_size", "num_experts", "top_k"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive int.")
        if self.top_k > self.num_experts:
            raise ValueError(
                f"top_k={self.top_k} exceeds num_experts={self.num_experts}; lower top_k."
            )
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation={self.activation!r}; use one of {ACTIVATIONS}.")
        if self.router not in ROUTER_METHODS:
            raise ValueError(
                f"router={self.router!r} is not a router; use one of {ROUTER_METHODS}."
            )
        if self.implementation not in IMPLEMENTATIONS:
            raise ValueError(
                f"implementation={self.implementation!r}; use one of {IMPLEMENTATIONS}."
            )
        if self.shared_intermediate_size < 0:
            raise ValueError(
                f"shared_intermediate_size={self.shared_intermediate_size} must be >= 0 (0: none)."
            )
        if self.router == "sigmoid_group_topk":
            self._check_groups()
        elif self.n_group is not None or self.topk_group is not None:
            raise ValueError("n_group and topk_group only apply to router='sigmoid_group_topk'.")

    def _check_groups(self):
        n_group, topk_group, num_experts = self.n_group or 1, self.topk_group or 1, self.num_experts
        if num_experts % n_group:
            raise ValueError(f"n_group={n_group} must divide num_experts={num_experts}.")
        if not 1 <= topk_group <= n_group:
            raise ValueError(f"topk_group={topk_group} must be in [1, n_group={n_group}].")
        if self.top_k > topk_group * (num_experts // n_group):
            chosen = topk_group * (num_experts // n_group)
            raise ValueError(
                f"top_k={self.top_k} exceeds the {chosen} experts of the "
                f"topk_group={topk_group} chosen groups; raise topk_group."
            )

    def param_specs(self) -> dict[str, tuple[tuple[int, ...], Any, tuple]]:
        """name -> (shape, initializer, logical axis names) of every trained parameter."""
        hidden, inter, experts = self.hidden_size, self.intermediate_size, self.num_experts
        fan_in = drawn_in_float32(
            nnx.initializers.variance_scaling(
                1.0, "fan_in", "truncated_normal", in_axis=-2, out_axis=-1
            )
        )
        expert_fan_in = per_expert(fan_in)
        zeros, ep = nnx.initializers.zeros_init(), self.expert_axis
        specs = {
            "router_kernel": ((hidden, experts), fan_in, (None, None)),
            "w_gate_up": ((experts, hidden, 2 * inter), expert_fan_in, (ep, None, None)),
            "w_down": ((experts, inter, hidden), expert_fan_in, (ep, None, None)),
        }
        if self.router_bias:
            specs["router_bias"] = ((experts,), zeros, (None,))
        if self.expert_bias:
            specs["b_gate_up"] = ((experts, 2 * inter), zeros, (ep, None))
            specs["b_down"] = ((experts, hidden), zeros, (ep, None))
        if self.shared_intermediate_size:
            shared = self.shared_intermediate_size
            specs["shared_w_gate_up"] = ((hidden, 2 * shared), fan_in, (None, None))
            specs["shared_w_down"] = ((shared, hidden), fan_in, (None, None))
        return specs

    def eager_sharding(self) -> bool:
        """Shard parameters at creation only when the active mesh has the expert axis."""
        mesh = meta.get_global_mesh()
        return mesh is not None and self.expert_axis in mesh.axis_names


OPTIONS: tuple[str, ...] = tuple(
    f.name for f in dataclasses.fields(MoEConfig) if f.default is not dataclasses.MISSING
)


def options_of(options: dict) -> dict:
    """`options` checked against MoEConfig's optional fields (the layers' keyword arguments)."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise TypeError(f"MoE got unknown options {unknown}; the options are {list(OPTIONS)}.")
    return options


def moe_apply(
    config: MoEConfig, params: dict[str, jax.Array], x: jax.Array
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The layer's math on plain arrays: `params` holds `config.param_specs()` names and, for the
    sigmoid_group_topk router, "correction_bias". Returns (y like x in compute dtype, aux)."""
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):  # checked here, before the reshape into [T, H]
        raise TypeError(
            f"x must be floating [..., hidden_size={config.hidden_size}] activations, got "
            f"{x.dtype}{list(x.shape)}; cast it (e.g. x.astype(jnp.bfloat16)), or embed token ids "
            "first."
        )
    if x.ndim < 1 or x.shape[-1] != config.hidden_size:
        raise ValueError(f"x must be [..., hidden_size={config.hidden_size}], got {list(x.shape)}.")
    dtype = x.dtype if config.dtype is None else jnp.dtype(config.dtype)
    x2d = x.reshape(-1, config.hidden_size).astype(dtype)

    logits = x2d.astype(jnp.float32) @ params["router_kernel"].astype(jnp.float32)
    if "router_bias" in params:
        logits = logits + params["router_bias"].astype(jnp.float32)
    group_kwargs = {}
    if config.router == "sigmoid_group_topk":
        group_kwargs = {
            "n_group": config.n_group or 1,
            "topk_group": config.topk_group or 1,
            "correction_bias": params.get("correction_bias"),
        }
    topk_idx, topk_weight, aux = route(
        logits,
        config.top_k,
        method=config.router,
        renormalize=config.renormalize,
        routed_scaling_factor=config.routed_scaling_factor,
        **group_kwargs,
    )

    experts = {
        "w_gate_up": params["w_gate_up"].astype(dtype),
        "w_down": params["w_down"].astype(dtype),
    }
    # Biases stay in their parameter dtype: moe_experts adds them in float32.
    experts.update({name: params[name] for name in ("b_gate_up", "b_down") if name in params})
    parallel = {}
    if config.mesh is not None:
        parallel = {"mesh": config.mesh, "expert_axis": config.expert_axis}
        parallel.update(
            {
                k: getattr(config, k)
                for k in ("exchange", "capacity_factor")
                if getattr(config, k) is not None
            }
        )
    out = moe_experts(
        x2d,
        topk_idx,
        topk_weight,
        experts,
        activation=config.activation,
        implementation=config.implementation,
        return_stats=bool(parallel),
        fp8_training=config.fp8_training,
        **parallel,
    )
    y, stats = out if parallel else (out, {"dropped_rows": jnp.zeros((), jnp.int32)})
    # Rows an expert-parallel exchange dropped (capacity_factor set): counted, never silent.
    aux["dropped_rows"] = stats["dropped_rows"]
    if config.shared_intermediate_size:
        h = jnp.dot(
            x2d, params["shared_w_gate_up"].astype(dtype), preferred_element_type=jnp.float32
        )
        a = glu(*split_gate_up(h, config.activation), config.activation).astype(dtype)
        shared = jnp.dot(
            a, params["shared_w_down"].astype(dtype), preferred_element_type=jnp.float32
        )
        y = (y.astype(jnp.float32) + shared).astype(dtype)

    aux["aux_loss"] = (
        config.aux_loss_coef * aux["load_balancing_loss"] + config.z_loss_coef * aux["z_loss"]
    )
    return y.reshape(*x.shape[:-1], config.hidden_size), aux


def corrected_bias(bias: jax.Array, expert_counts: jax.Array, rate: float) -> jax.Array:
    """DeepSeek-V3 balancing rule: bias_e += rate * sign(mean load - load_e) (over the last axis,
    so stacked layers `[L, E]` update at once)."""
    counts = expert_counts.astype(jnp.float32)
    step = jnp.sign(jnp.mean(counts, axis=-1, keepdims=True) - counts)
    return bias + (rate * step).astype(bias.dtype)


# Flax releases whose `sow` takes capture_noop (no-op outside `nnx.capture`); older ones store the
# values as module attributes, which changes the module's state inside nnx.scan/jit (the H200
# image's flax failed the training step on it), so there the layer does not sow: use return_aux.
_SOW_CAPTURE = "capture_noop" in inspect.signature(nnx.Module.sow).parameters


class MoE(nnx.Module):
    """Mixture-of-Experts layer: `y = layer(x)` for `x[..., hidden_size]`.

    Keyword options are the fields of `MoEConfig` (`moe_pallas.layer.OPTIONS`), with these
    defaults there:

    Args:
      hidden_size, intermediate_size, num_experts, top_k: H, I (per expert), E, k.
      activation: "swiglu" (w_gate_up columns [gate | up]) or "gptoss" (interleaved, clamped GLU).
      router: "softmax_topk" (Mixtral/Qwen3; `renormalize` = norm_topk_prob), "topk_softmax"
        (gpt-oss; use `router_bias=True`), "sigmoid_group_topk" (DeepSeek-V3; `n_group`,
        `topk_group` (both default 1: no group limit), `routed_scaling_factor`, `renormalize`;
        adds a `RouterCorrectionBias`).
      router_bias: a trained `[E]` bias on the router logits.
      expert_bias: per-expert biases `b_gate_up [E, 2I]`, `b_down [E, H]`.
      shared_intermediate_size: width of an always-on shared expert (0: none), same activation.
      aux_loss_coef, z_loss_coef: weights of the load-balancing loss and router z-loss in the
        returned/sown "aux_loss".
      dtype: compute dtype (None: x's dtype); the router always computes in float32.
      param_dtype: storage dtype of the parameters.
      implementation: backend of `moe_experts` ("auto", "xla", "pallas_triton", "mosaic_gpu").
      mesh, expert_axis, exchange, capacity_factor: expert parallelism; forwarded to
        `moe_experts` only when `mesh` is given. `expert_axis` also names the sharding annotation.
      fp8_training: the expert matmuls on the FP8 tensor cores, forward and the backward's
        products with wᵀ, the weights quantised per 128 x 128 block at each call
        (`moe_experts`'s fp8_training); the parameters stay in param_dtype.
      rngs: `nnx.Rngs` for initialisation.

    Call: `layer(x)` returns y (x's shape, compute dtype); `layer(x, return_aux=True)` returns
    (y, aux) with aux = {"aux_loss", "load_balancing_loss", "z_loss", "expert_counts",
    "dropped_rows"} (rows an expert-parallel exchange dropped; 0 without a mesh). The same
    values are sown as `nnx.Intermediate` (Flax releases with `nnx.capture`): collect them with
    `nnx.capture(model, nnx.Intermediate)`.
    """

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        num_experts: int,
        top_k: int,
        *,
        rngs: nnx.Rngs,
        **options: Any,
    ):
        config = MoEConfig(
            hidden_size, intermediate_size, num_experts, top_k, **options_of(options)
        )
        self.config = config
        eager = config.eager_sharding()
        for name, (shape, init, names) in config.param_specs().items():
            init = nnx.with_partitioning(init, names, eager_sharding=eager)
            setattr(self, name, nnx.Param(init(rngs.params(), shape, config.param_dtype)))
        if config.router == "sigmoid_group_topk":
            self.correction_bias = RouterCorrectionBias(jnp.zeros((num_experts,), jnp.float32))

    def params_dict(self) -> dict[str, jax.Array]:
        """Current parameter values (and correction bias) by name, as `moe_apply` takes them."""
        names = list(self.config.param_specs())
        if self.config.router == "sigmoid_group_topk":
            names.append("correction_bias")
        return {name: getattr(self, name)[...] for name in names}

    def expert_params(self) -> dict[str, jax.Array]:
        """The expert weights as `moe_experts` takes them: `w_gate_up`, `w_down` and, with
        `expert_bias`, `b_gate_up` and `b_down` (values in `param_dtype`)."""
        params = self.params_dict()
        return {name: params[name] for name in EXPERT_PARAM_NAMES if name in params}

    def __call__(self, x: jax.Array, *, return_aux: bool = False):
        y, aux = moe_apply(self.config, self.params_dict(), x)
        if _SOW_CAPTURE:
            for name in AUX_NAMES:
                self.sow(nnx.Intermediate, name, aux[name], capture_noop=True)
        return (y, aux) if return_aux else y

    def update_correction_bias(self, expert_counts: jax.Array, rate: float = 1e-3) -> None:
        """Auxiliary-loss-free load balancing (DeepSeek-V3): raise the selection bias of
        under-loaded experts and lower it for over-loaded ones by `rate`. `expert_counts` is the
        "expert_counts" aux of a step. A no-op for routers without a correction bias."""
        if self.config.router == "sigmoid_group_topk":
            self.correction_bias[...] = corrected_bias(
                self.correction_bias[...], expert_counts, rate
            )
