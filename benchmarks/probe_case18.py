"""Probe (history only): the N-major mxfp4 gmm_glu that memcheck computed off its bound and
synccheck could not load (tests/sanitize.py case 18: 128 x 128 x 64, 8 warps, 4 stages, paths of
128 and 64 rows), in variants, one per process, so a tool run tells the tool from the kernel:

    python -m benchmarks.probe_case18 VARIANT [RUNS]     # prints the relative error of each run
    bash benchmarks/probe_case18.sh OUT_DIR               # every variant plain and under the tools

VARIANT: "case18" (as shipped), "stages3", "one_path" (min_block_m 128), "bn64", "fp8" (the same
config on fp8 weights, clean under all tools), "swiglu" (the other GLU).
"""

import dataclasses
import sys

import jax

from moe_pallas.kernels.config import BlockConfig
from tests import sanitize

BASE = BlockConfig(
    block_m=128,
    block_n=128,
    block_k=64,
    group_m=8,
    num_warps=8,
    num_stages=4,
    min_block_m=64,
    tail_m=64,
)
VARIANTS = {
    "case18": ("mxfp4", "gmm_glu", BASE),
    "stages3": ("mxfp4", "gmm_glu", dataclasses.replace(BASE, num_stages=3)),
    "one_path": ("mxfp4", "gmm_glu", dataclasses.replace(BASE, min_block_m=128, tail_m=0)),
    "bn64": ("mxfp4", "gmm_glu", dataclasses.replace(BASE, block_n=64)),
    "fp8": ("fp8", "gmm_glu", BASE),
    "plain_gmm": ("mxfp4", "gmm", BASE),
}


def main(variant: str, runs: int = 2) -> int:
    fmt, kernel, cfg = VARIANTS[variant]
    worst = 0.0
    for run in range(runs):
        out, ref = sanitize.quant_gmm_case(fmt, kernel, cfg, 18)
        err = sanitize._rel(jax.block_until_ready(out), ref)
        worst = max(worst, err)
        print(f"{variant} run {run}: relative error {err:.2e}", flush=True)
    print(f"{variant}: {'ok' if worst <= 1e-3 else 'OFF'} (worst {worst:.2e})")
    return 0 if worst <= 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], *map(int, sys.argv[2:3])))
