"""moe_pallas: Mixture-of-Experts dispatch, grouped matmul and combine for JAX on NVIDIA GPUs."""

from moe_pallas.debug import debug_checks
from moe_pallas.experts import moe_experts
from moe_pallas.routing import route

__all__ = ["debug_checks", "moe_experts", "route"]
__version__ = "0.1.0"
