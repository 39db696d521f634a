"""Pallas GPU kernels (Triton lowering), one per file."""

from moe_pallas.kernels.config import BlockConfig
from moe_pallas.kernels.gmm import gmm
from moe_pallas.kernels.tgmm import tgmm

__all__ = ["BlockConfig", "gmm", "tgmm"]
