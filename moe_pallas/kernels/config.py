"""Block sizes of the Triton grouped matmuls (`kernels.gmm`, `kernels.tgmm`).

Which config runs for a shape is data: `moe_pallas/tuning.json`, read by the pallas_triton backend
(`moe_pallas.backends.pallas_triton`). Few rows per group are weight-bandwidth bound (small
block_m, narrow block_n so every SM streams a slice of the weights), many rows compute bound.
"""

import dataclasses

from moe_pallas.kernels._common import pow2_block


@dataclasses.dataclass(frozen=True)
class BlockConfig:
    block_m: int = 64
    block_n: int = 128
    block_k: int = 64
    # gmm: m-tiles walked together across n (weight slabs reused from L2);
    # tgmm: output n-tiles one program walks in one pipelined loop.
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3
    # gmm: the smallest tile height of the bucketed-M paths (None: block_m only), see m_paths.
    min_block_m: int | None = None
    # gmm: rows past block_m that a group's last visit may take (0: none), multiplied in the same
    # k-loop by a second [tail_m, block_k] dot on the weight tiles already loaded, so a group a
    # few rows above block_m does not stream its expert's weights a second time (kernels/gmm.py,
    # Tails, also for why tails are at least 32 rows, 64 at 8 warps).
    tail_m: int = 0
    # gmm_quant: tiles of 64 rows or more compute accᵀ = w · xᵀ, the decoded weights wgmma's
    # register operand and x its shared-memory one, instead of staging the decoded weights in
    # shared memory for acc = x · w (kernels/gmm_quant.py, Tiling); other kernels ignore it.
    weights_first: bool = False

    def __post_init__(self):
        if self.min_block_m is not None and (
            self.min_block_m < 16 or self.min_block_m & (self.min_block_m - 1)
        ):
            raise ValueError(f"min_block_m={self.min_block_m} must be a power of 2 >= 16.")
        shortest = 64 if self.num_warps >= 8 else 32
        if self.tail_m and (
            self.tail_m < shortest or self.tail_m & (self.tail_m - 1) or self.tail_m > self.block_m
        ):
            raise ValueError(
                f"tail_m={self.tail_m} must be 0 or a power of 2 in [{shortest}, "
                f"block_m={self.block_m}] at num_warps={self.num_warps}: Triton miscompiles a "
                "short second dot beside the main one at 8 warps (kernels/gmm.py, Tails)."
            )

    def m_paths(self) -> tuple[int, ...]:
        """gmm's tile heights block_m, block_m/2, ..., min_block_m: a visit of r rows runs the
        smallest p with r <= p, so a short last visit of a group does not cost a full tile."""
        low = min(self.min_block_m or self.block_m, self.block_m)
        return tuple(self.block_m >> i for i in range((self.block_m // low).bit_length()))

    def fit(self, m: int, k: int, n: int) -> "BlockConfig":
        """Shrink blocks to the problem (power of 2, at least 16: the Triton dot's minimum)."""

        block_m = pow2_block(self.block_m, m)
        return dataclasses.replace(
            self,
            block_m=block_m,
            block_n=pow2_block(self.block_n, n),
            block_k=pow2_block(self.block_k, k),
            min_block_m=None if self.min_block_m is None else min(self.min_block_m, block_m),
            # a block_m shrunk to the problem holds every row: no group has a tail
            tail_m=self.tail_m if block_m == self.block_m else 0,
        )
