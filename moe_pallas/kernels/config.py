"""Block configurations of the grouped matmuls, per shape class, for the H200.

The table below is rewritten by `benchmarks/autotune_gmm.py`; edit it there, not by hand.
Shape class: the kernel ("gmm", "gmm_glu" for gmm with a GLU epilogue, whose block_n counts output
columns, i.e. half the weight columns a tile reads; "gmm_t" for the transposed-rhs gmm; "tgmm")
and the average number
of rows per group (`rows_class`): few rows per group are weight-bandwidth bound (small block_m,
narrow block_n so every SM streams a slice of the weights), many rows are compute bound.
"""

import dataclasses


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
    # Tails, also for why no tail is 16 rows).
    tail_m: int = 0

    def __post_init__(self):
        if self.min_block_m is not None and (
            self.min_block_m < 16 or self.min_block_m & (self.min_block_m - 1)
        ):
            raise ValueError(f"min_block_m={self.min_block_m} must be a power of 2 >= 16.")
        if self.tail_m and (
            self.tail_m < 32 or self.tail_m & (self.tail_m - 1) or self.tail_m > self.block_m
        ):
            raise ValueError(
                f"tail_m={self.tail_m} must be 0 or a power of 2 in [32, block_m={self.block_m}] "
                "(16-row tails computed wrong rows on the H200: kernels/gmm.py, Tails)."
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


def pow2_block(block: int, dim: int) -> int:
    """block, shrunk to the smallest power of 2 covering dim, but at least 16 (the Triton dot's
    minimum)."""
    return min(block, max(16, 1 << max(dim - 1, 0).bit_length()))


def dividing_block(block: int, dim: int, floor: int) -> int:
    """The power-of-2 block halved while it does not divide dim, down to floor: a block that
    divides the dimension needs no masked tail (2880 = 45 * 64)."""
    while dim % block and block > floor:
        block //= 2
    return block


# BEGIN TABLE (autotune_gmm.py)
_TABLE: dict[tuple[str, str], BlockConfig] = {
    ("gmm", "large"): BlockConfig(
        128, 256, 64, group_m=8, num_warps=8, num_stages=4, min_block_m=64
    ),
    ("gmm", "small"): BlockConfig(
        128, 256, 64, group_m=8, num_warps=8, num_stages=4, min_block_m=16, tail_m=64
    ),
    ("gmm", "tiny"): BlockConfig(16, 128, 128, group_m=8, num_warps=4, num_stages=3),
    ("gmm_glu", "large"): BlockConfig(
        128, 128, 64, group_m=8, num_warps=8, num_stages=3, min_block_m=16
    ),
    ("gmm_glu", "small"): BlockConfig(
        128, 128, 64, group_m=8, num_warps=8, num_stages=4, min_block_m=64, tail_m=64
    ),
    ("gmm_glu", "tiny"): BlockConfig(16, 64, 128, group_m=8, num_warps=4, num_stages=3),
    ("gmm_t", "large"): BlockConfig(
        128, 256, 64, group_m=8, num_warps=8, num_stages=3, min_block_m=16
    ),
    ("gmm_t", "small"): BlockConfig(128, 256, 64, group_m=8, num_warps=8, num_stages=4, tail_m=64),
    ("gmm_t", "tiny"): BlockConfig(16, 64, 128, group_m=8, num_warps=4, num_stages=4),
    ("tgmm", "large"): BlockConfig(64, 128, 128, group_m=8, num_warps=4, num_stages=3),
    ("tgmm", "small"): BlockConfig(64, 128, 128, group_m=8, num_warps=4, num_stages=3),
    ("tgmm", "tiny"): BlockConfig(32, 128, 128, group_m=1, num_warps=4, num_stages=4),
}
# END TABLE


def rows_class(num_rows: int, num_groups: int) -> str:
    rows_per_group = num_rows / max(num_groups, 1)
    if rows_per_group <= 16:
        return "tiny"
    if rows_per_group <= 128:
        return "small"
    return "large"


_MIN_PROGRAMS = 4 * 132  # a few programs per H200 SM keep every SM streaming weights


def spread_block_n(
    block_n: int, n: int, num_rows: int, num_groups: int, min_block_n: int, programs: int
) -> int:
    """block_n halved (not below min_block_n) until the min(rows, groups) experts hit have
    `programs` (row tile, column tile) pairs: with few rows, each hit expert's weights must be
    split over every SM to stream at full bandwidth (at T = 1, 4 experts x 45 column tiles would
    leave SMs idle)."""
    while block_n > min_block_n and min(num_rows, num_groups) * -(-n // block_n) < programs:
        block_n //= 2
    return block_n


def pick(
    kernel: str, num_rows: int, num_groups: int, k: int, n: int, activation: str | None = None
) -> BlockConfig:
    """The table's config for this shape, fitted to it, with block_n narrowed by
    `spread_block_n` for the gmm kernels, down to `min_block_n`."""
    cfg = _TABLE[(kernel, rows_class(num_rows, num_groups))].fit(num_rows, k, n)
    if kernel != "tgmm":
        block_n = spread_block_n(
            cfg.block_n, n, num_rows, num_groups, min_block_n(kernel, activation), _MIN_PROGRAMS
        )
        cfg = dataclasses.replace(cfg, block_n=block_n)
    return cfg


def min_block_n(kernel: str, activation: str | None = None) -> int:
    """The narrowest block_n `pick` spreads to: a tile's rows of weights stay at least 64 columns
    (128 bf16 bytes) contiguous. At T = 1 on the H200 narrower tiles streamed the weights slower
    in spite of more programs (2026-12-01 sweep, benchmarks/results/2026-12-01_h200_session8/:
    SwiGLU gate_up 118.5 us at 16 output columns vs 63.1 at 64; down 43.6 at 32 vs 33.5 at 64;
    gpt-oss gate_up 41.7 at 16 vs 34.1 at 32). gpt-oss's GLU reads its gate and up columns
    interleaved, 2·block_n contiguous; SwiGLU's reads two blocks of block_n. gmm_t reads rows of
    the weights' K dimension, contiguous at any block_n."""
    if kernel == "gmm_glu":
        return 32 if activation == "gptoss" else 64
    return 32 if kernel == "gmm_t" else 64
