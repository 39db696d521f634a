"""moe_pallas: Mixture-of-Experts dispatch, grouped matmul and combine for JAX on NVIDIA GPUs."""

from moe_pallas.debug import debug_checks
from moe_pallas.experts import moe_experts
from moe_pallas.layer import MoE
from moe_pallas.ops import ragged_dot, tgmm
from moe_pallas.parallel import expert_mesh
from moe_pallas.quant import (
    QuantizedWeight,
    dequantize_experts,
    quantize_experts,
    use_fp8_activations,
)
from moe_pallas.routing import route
from moe_pallas.safetensors_io import read_safetensors
from moe_pallas.weights import export_experts, load_experts, set_expert_params

__all__ = [
    "MoE",
    "QuantizedWeight",
    "debug_checks",
    "dequantize_experts",
    "expert_mesh",
    "export_experts",
    "load_experts",
    "moe_experts",
    "quantize_experts",
    "ragged_dot",
    "read_safetensors",
    "route",
    "set_expert_params",
    "tgmm",
    "use_fp8_activations",
]
__version__ = "0.1.0"
