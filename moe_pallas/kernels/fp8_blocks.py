"""FP8 training's weight quantisation: w [E, K, N] -> e4m3 per 128 x 128 block, written in the
layouts the FP8 tensor cores read, Pallas Triton lowering.

Math. For each expert e and 128 x 128 block B of w[e] (smaller at the K and N tails): the scale
s = max|B| / 448 (1 for a block of zeros) and the values q = B / s rounded to nearest even in
e4m3, saturating at ±448, so B ≈ q · s. This is `quant.fp8_training_weight`'s rule, which the
"xla" backend runs as jnp; here the division is Triton's float32 `/` (div.full.f32, within 2 ulp
of the exact quotient), so a quotient within 2 ulp of a point halfway between two e4m3 values may
round to the other one, one e4m3 step away (none did among gpt-oss's 2.1e9 w_gate_up values on an
H100); each value stays the quantisation of its block under the stored s.

Layouts. The FP8 tensor cores take both operands K-major, so the product with w reads
`values [E, N, P]` (q of w[e] transposed: a row of K values per output column, zero-padded to
the row pitch P) with `scales [E, ⌈K/128⌉, ⌈N/128⌉]`, and a product with wᵀ reads
`values_t [E, K, P_t]` (q in w's own order, rows of N padded to P_t) with
`scales_t [E, ⌈N/128⌉, ⌈K/128⌉]`. A 128 x 128 block of w is one of wᵀ, so one quantisation
serves both (`both=True` writes the two).

Tiling. One program per (expert, 128 values of K, 128 of N). It loads its block once, as four
64 x 64 quadrants (even or odd K, even or odd N), reduces them to s and writes the e4m3 values as
byte pairs (uint16): a row-pair quadrant pair makes the pairs of values along K, a column-pair
one those along N. Written as uint16, a values array of up to 2^32 bytes has fewer than 2^31
elements, within the int32 offsets Pallas computes for arrays of that size (an array of 1-byte
elements could pass them). The grid reaches the pitches: programs past K (or N) write the rows'
zero padding. Memory-bound: each weight element is read once (2 bytes) and written once per
layout (1 byte).
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from moe_pallas.kernels import _common
from moe_pallas.kernels.gmm_quant import FP8_BLOCK as BLOCK

FP8_MAX = 448.0  # the largest finite float8_e4m3fn
_HALF = BLOCK // 2


def _pairs(lo, hi):
    """Two e4m3 arrays -> uint16 words of (lo, hi) bytes, lo first in memory (little-endian)."""
    lo, hi = (jax.lax.bitcast_convert_type(q, jnp.uint8).astype(jnp.uint16) for q in (lo, hi))
    return lo | (hi << jnp.uint16(8))


def _kernel(w_ref, *out_refs, k, n, p, p_t, both):
    values_ref, scales_ref = out_refs[:2]
    e, kb, nb = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    k_blocks, n_blocks = pl.cdiv(k, BLOCK), pl.cdiv(n, BLOCK)
    half = jnp.arange(_HALF, dtype=jnp.int32)
    ks = [kb * BLOCK + 2 * half + parity for parity in (0, 1)]  # even and odd rows of K
    ns = [nb * BLOCK + 2 * half + parity for parity in (0, 1)]  # even and odd columns of N
    # w viewed [E·K, N]: row e·K + k (the load's offsets are int64 past 2^32 bytes).
    quads = [
        [
            plgpu.load(
                w_ref.at[(e * k + rk)[:, None], cn[None, :]],
                mask=(rk < k)[:, None] & (cn < n)[None, :],
                other=0,
            ).astype(jnp.float32)
            for cn in ns
        ]
        for rk in ks
    ]
    absmax = functools.reduce(jnp.maximum, [jnp.max(jnp.abs(q)) for row in quads for q in row])
    s = jnp.where(absmax > 0, absmax / FP8_MAX, 1.0)
    q = [
        [jnp.clip(v / s, -FP8_MAX, FP8_MAX).astype(jnp.float8_e4m3fn) for v in row] for row in quads
    ]
    in_block = jnp.broadcast_to((kb < k_blocks) & (nb < n_blocks), (1, 1))
    one = jnp.broadcast_to(s, (1, 1))
    # values [E·N, P/2] words: row e·N + n holds K's pairs (2k, 2k + 1); values_t [E·K, P_t/2]
    # words: row e·K + k holds N's pairs (2n, 2n + 1).
    k_pairs, n_pairs = kb * _HALF + half, nb * _HALF + half
    layouts = [(values_ref, scales_ref, e * k_blocks + kb, nb, e * n, n, k_pairs, p)]
    if both:
        values_t_ref, scales_t_ref = out_refs[2:]
        layouts.append((values_t_ref, scales_t_ref, e * n_blocks + nb, kb, e * k, k, n_pairs, p_t))
    for i, (v_ref, s_ref, s_row, s_col, base, rows, pairs, length) in enumerate(layouts):
        plgpu.store(s_ref.at[pl.ds(s_row, 1), pl.ds(s_col, 1)], one, mask=in_block)
        for parity in (0, 1):
            # The layout's row parity: N's for values (K pairs), K's for values_t (N pairs).
            words = _pairs(q[0][parity], q[1][parity]).T if i == 0 else _pairs(*q[parity])
            row = (ns if i == 0 else ks)[parity]
            plgpu.store(
                v_ref.at[(base + row)[:, None], pairs[None, :]],
                words,
                mask=(row < rows)[:, None] & (pairs < length // 2)[None, :],
            )


def fp8_blocks(w: jax.Array, pitch: int, pitch_t: int | None = None, *, num_warps: int = 4):
    """w `[E, K, N]` -> (values `[E, N, pitch]` e4m3, scales `[E, ⌈K/128⌉, ⌈N/128⌉]` float32),
    followed with pitch_t given by (values_t `[E, K, pitch_t]`, scales_t `[E, ⌈N/128⌉,
    ⌈K/128⌉]`), see module docstring. pitch >= K and pitch_t >= N, both even; rows are zero past
    K (N)."""
    e, k, n = w.shape
    both = pitch_t is not None
    for name, length, row in (("pitch", pitch, k), ("pitch_t", pitch_t, n)):
        if length is not None and (length < row or length % 2):
            raise ValueError(f"fp8_blocks: {name} must be even and at least {row}, got {length}.")
    kb, nb = pl.cdiv(k, BLOCK), pl.cdiv(n, BLOCK)
    for dim in (e * k, e * n, kb * e, nb * e):
        if dim > _common.MAX_DIM:
            raise ValueError(f"fp8_blocks: w {w.shape} has more than 2^31 - 1 rows of blocks.")
    out_shape = [
        jax.ShapeDtypeStruct((e * n, pitch // 2), jnp.uint16),
        jax.ShapeDtypeStruct((e * kb, nb), jnp.float32),
    ]
    if both:
        out_shape += [
            jax.ShapeDtypeStruct((e * k, pitch_t // 2), jnp.uint16),
            jax.ShapeDtypeStruct((e * nb, kb), jnp.float32),
        ]
    grid = (e, pl.cdiv(max(k, pitch), BLOCK), pl.cdiv(max(n, pitch_t or 0), BLOCK))
    outs = pl.pallas_call(
        functools.partial(_kernel, k=k, n=n, p=pitch, p_t=pitch_t or 0, both=both),
        out_shape=out_shape,
        grid=grid,
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=1),
        interpret=_common.interpret_mode(),
        name="fp8_blocks",
    )(w.reshape(e * k, n))

    def as_e4m3(words, rows, length):
        pairs = jax.lax.bitcast_convert_type(words, jnp.float8_e4m3fn)  # [..., length/2, 2]
        return pairs.reshape(e, rows, length)

    result = (as_e4m3(outs[0], n, pitch), outs[1].reshape(e, kb, nb))
    if both:
        result += (as_e4m3(outs[2], k, pitch_t), outs[3].reshape(e, nb, kb))
    return result
