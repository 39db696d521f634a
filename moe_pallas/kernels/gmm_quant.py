"""Grouped matmul on quantised weights, converted on chip: Pallas Triton lowering.

Math. `kernels.gmm.gmm`'s forward (out[m] = epilogue(lhs[src(m)] @ w[group(m)]), bias, GLU
activation, row scale, rows past the groups zero) with w a `moe_pallas.quant.QuantizedWeight`
(formats in `moe_pallas.quant`). The weights stream in their stored precision (1 byte per value
for fp8, half a byte for mxfp4) and become lhs's dtype in registers; accumulation is float32.
Each format puts its scale where it costs least:
  - "fp8": the scale is per output column and commutes with the K sum, so the accumulator is
    multiplied once after the K loop: acc[m, n] · s[n], not each weight element.
  - "fp8_block": the scale is constant over each 128-row K block and block_k divides 128. On
    tiles of at least FOLD_MIN_ROWS rows (the wgmma tiles, whose weight operand goes through
    shared memory anyway) the scale multiplies the float16 weights, q · s'[k0 // 128, n], and
    the dots accumulate in place: s' is the scale divided by a power of two per column
    (`_column_powers`: the column's largest lands in [1/2, 1), exactly, which keeps the
    products in float16's range whatever the scales' magnitude), the power multiplies the
    accumulator after the K loop, and each product carries a float16 rounding of the scale and
    of itself (2^-11 relative, under bf16's 2^-8), for no float32 multiply of the accumulator
    per K step, which also kept wgmma from running ahead (offline SASS, 64 x 128 x 64 GLU:
    352 -> 217 instructions a thread). Shorter tiles, whose accumulators are small, scale each
    step's partial dot in float32: acc += dot(x, q) · s[k0 // 128, n] (s' in a call that also
    has tall tiles; decode-sized calls read the scales as stored). [E, K/128, N/128] scales are
    read in place, column n's from block n // 128 (a gather of a few words a step), so a tile
    needs no alignment to the 128-column blocks (SwiGLU's up half starts at column I) and no
    per-call widening to [E, K/128, N] (1/32 of the fp8 bytes, written each call); [E, K/128,
    N] per-column scales (the loader's form) are read as they are.
  - "mxfp4": a scale per 32 values of K: each sub-block of 32 bytes of K, r0.., holds
    k = r0..r0+31 (the low half's codes) and k = K/2 + r0.. (the high half's), 8 codes to a
    32-bit word (`mx_words.MX_WORD_BITS`); read as uint16 byte pairs, each word decodes to bf16
    by bit placement in four quarters of 2 values, each scaled in bf16 by its half's power of
    two per column, exactly (`e2m1`: inline PTX on the GPU, 17 integer or bf16x2 instructions
    per word of 8 values, 21 where a scale code passes 128), each quarter a 16-deep dot against
    its 16 columns of x (x's columns reordered once per call, `_mx_x_order`):
    acc += dot(x[:, k_lo], lo · 2^(s_lo − 127)) + dot(x[:, k_hi], hi · 2^(s_hi − 127)).
    A loop step takes block_k / 64 sub-blocks (more weight bytes in flight per step); K is a
    multiple of 64, so there is no K tail.
With fp8 activations (`lhs_scales` given: lhs float8_e4m3fn values q_x with a float32 scale per
row and 128 values of K, `quant.quantize_rows`; "fp8" and "fp8_block" weights) nothing is
decoded: each K step of 128 is one e4m3 x e4m3 product on the FP8 tensor cores
(`kernels.fp8_dot`: the step's partial sum kept in the tensor core, the DeepSeek-V3 recipe's
promotion interval), scaled into the float32 accumulator by the step's row and weight scales:
    acc += fp8_dot(q_x[:, k0:k0+128], q_w[cols, k0:k0+128]) · s_x[:, k0 // 128] · s_w,
s_w the "fp8_block" scale of the step's block (one scalar a step where the tile's columns lie in
one 128-column block, else a column's own), or 1 for "fp8", whose column scale stays in the
epilogue. The weight tile goes from the pipelined shared-memory buffer to wgmma as loaded, which
needs an unmasked float8 load (a masked one's fill value does not lower, and a bitcast of a byte
tile, even to its own type, makes Triton copy the tile through registers into a second
shared-memory layout each step): block_n is narrowed to divide N (`_common.dividing_block`, not
below DIRECT_MIN_BLOCK_N) and a K tail is a step of its own after the loop, whose window ends at
K, x's columns before the tail masked to zero (K a multiple of 16, for aligned loads); calls
where neither fits read bytes. Offline SASS of the K loop (`benchmarks.sass --fp8-activations`),
bytes -> as loaded, instructions a thread per 128 weight values (registers; programs an SM):
gpt-oss's down 64 x 128 at 4 warps 223 -> 64 x 64 147 (202 -> 119; 2 -> 3), its GLU 64 x 64 221
-> 194 (207 -> 192; 2), SwiGLU-256's down 64 x 128 199 -> 188 (220 -> 201; 2); per 64 values,
gpt-oss's down 128 x 128 at 8 warps 195 -> 128 x 64 140 (209 -> 119; 1 -> 2); no STS.128 of the
tile (4-8 a step before). Calls that read the values as byte pairs (decode-sized tiles, and values
past 2^31 bytes: Offsets) convert both operands exactly to float16 instead (e4m3's values are
float16s) and scale each 128-deep block's float16 dots alike (a step of the table's 256 values of K
is two): at 16 rows fp8 wgmma does not apply (its M is 64) and mma.sync has no e4m3 form on sm_90.
x's values enter as float16 (converted once per call: the dot's operand layout repeats x in every
warp, which would convert it once a warp), and the weights' pairs convert as without fp8
activations (offline SASS of the K loop, instructions a thread: 16 x 64 x 128 fp8 136 and fp8_block
146, against 120 and 135 without; 169 with x's bytes converted in the kernel; gpt-oss's GLU entry
16 x 2·32 x 256 251 against 210).
The result is the float32 product of the quantised operands, up to the tensor core's summation
within a step (docs/reliability.md).
Every other scale product is exact (mxfp4's in bf16, `e2m1`) or one float32 multiply of a
float32 partial sum, so the result equals the float32-accumulated product with the exactly
decoded weights up to float32 summation order (fp8_block's folded tiles: up to the two float16
roundings a weight).
fp8 weights multiply in float16, where e4m3 decodes in one hardware conversion per two values
(`e4m3_f16`); a bf16 lhs enters as float16 with a power of two per row (`rows_as_f16`: bf16's 8
significant bits fit float16's 11, the power keeps each row in float16's range), restored on the
float32 accumulator before the bias, so the products are bf16's own but for terms under 2^-28 of
a row's largest.

Tiling. As `kernels.gmm`: a 1-D grid of (visit, n-tile) pairs over `dispatch.tile_schedule`'s
visits, the in-kernel row gather, one compiled path per tile height (`BlockConfig.m_paths`), K
and N tails masked. No `tail_m` second dot and no transposed weights: the backward's products
with wᵀ are `kernels.gmm_quant_t`'s. With `BlockConfig.weights_first`, mxfp4's paths of
WEIGHTS_FIRST_MIN_ROWS rows or more compute accᵀ[n, m] = Σ_k w[k, n] x[m, k] and transpose
the accumulator once before the epilogue: the decoded weights are then wgmma's A operand, which
Triton keeps in registers (the decode, scale factors included, runs in the operand's layout),
and x its B operand from the pipelined shared-memory buffers, so the wgmma runs asynchronously
across the next step's decode; as acc = x · w the decoded tile is stored to shared memory
for wgmma's B operand each step (STS, fences, barriers) and each step's wgmma is waited on
before the next decode (a B operand staged in the loop is never multi-buffered). Offline SASS of
the K loop, instructions a thread, weights first / x first: mxfp4 64 x 128 x 64 259 / 290
(BAR.SYNC 5 / 12, STS.128 0 / 8), 128 x 128 x 64 at 8 warps 182 / 204. fp8 values' tiles stay x
first: swapped (byte pairs converted by inline PTX into the asynchronous wgmma's register
operand), "fp8" gave NaN or wrong outputs in some calls on an H100 at 64 rows per expert
([128, 2880, 5760], [64, 4096, 4096]) and "fp8_block" outputs that differed between calls
(gpt-oss's layer at T = 2048), where x first was bitwise repeatable and within bf16 rounding
(`tests/test_quant.py` repeats these products on the GPU). Paths shorter than 64 rows stay x
first (a 16-row mxfp4 tile swapped: 329 against 289, its barriers kept), as do weight blocks
narrower than 16 rows a warp (wgmma's A). The H200's tuning table sets it on mxfp4's small- and
large-class entries: the layer at 64 rows per expert ran 6-18% faster with it, and at 256-512
rows up to 21%.
Values are stored N-major ([E, N, P], P >= K: rows padded to `quant.row_pitch`, whose padding no
load reaches, K being the masks' bound; mxfp4 [E, N, K/2]; `moe_pallas.quant`): a tile is
[block_n, K depth] bytes with K contiguous, fed to the dot as its transposed second operand, so
the 16-row tensor-core fragment reads 4 bytes of K per shared-memory load where a [K, N] layout
read each byte alone. fp8 is loaded as bytes (a masked fp8 load's fill value does not lower in
Triton 3.6) and bitcast in registers; e2m1 decodes by bit placement (`e2m1`) on the integer and
bf16x2 pipes (sm_90 has no e2m1 conversion instruction).

Offsets. Pallas addresses an array in int32 element offsets unless it spans more than 2^32 bytes, so
a byte array of more than 2^31 elements, up to 2^32 (fp8 SwiGLU-256 gate_up, [256, 4096, 4096];
gpt-oss's, [128, 5760, 3072] with its rows padded), would overflow them. Such fp8 values are read as
uint16 [E, N, K/2] byte pairs along K (half the elements, the same bytes), as are those of every
call of tiles up to PAIRED_MAX_ROWS rows whose K is a multiple of 4 (decode sizes: fewer
instructions a value), two pairs to a 32-bit register: a word of 4 bytes holds k = 4m..4m+3, its
first pair (k = 4m, 4m+1) one half-depth dot's operand, its second (4m+2, 4m+3) the other's, against
x's columns reordered once per call (`_word_x_order`: each 4m, 4m+1, then each 4m+2, 4m+3), so that
both x tiles are contiguous loads (a pair offset written as a product, i · bk/2: Triton proves its
alignment, and vectorises and pipelines the loads, where k0 // 2 left them scalar). Each pair
decodes by one hardware conversion of its register half (`_e4m3_pair_f16`, inline PTX) in the dot
operand's registers after the shared-memory load: the 16-row fragment's 2 K values are one pair, so
no byte moves. Offline SASS of the K loop at [256, 4096, 4096], instructions a thread, words / a
pair's bytes split over the two dots (even k against odd) / unpaired bytes (at [128, 4096, 4096]):
16 x 64 x 128 113 / 144 / 171, its SwiGLU GLU 178 / 242 / 310, 64 x 128 x 64 153 / 185 / 141, 128 x
128 x 64 at 8 warps 126 / 142 / 113. Past 2^31 bytes K must be a multiple of 4.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from moe_pallas import dispatch
from moe_pallas.activations import glu
from moe_pallas.kernels import _common
from moe_pallas.kernels.config import BlockConfig
from moe_pallas.kernels.fp8_dot import fp8_dot
from moe_pallas.kernels.mx_words import mxfp4_unpack

FP8_BLOCK = 128
MX_BLOCK = 32
# Byte arrays from this many elements (an offset past int32) up to 2^32 bytes are read as
# uint16 pairs (module docstring, Offsets).
PAIRED_MIN_ELEMENTS = 2**31 + 1
# Calls whose tiles are at most this many rows (the mma.sync tiles, decode sizes) read fp8 values
# as byte pairs at any size, K a multiple of 4: the 16-row fragment's 2 K values are one pair, so
# the decode is one conversion a pair and no byte moves (module docstring, Offsets). Offline SASS
# of the K loop at [128, 2880, 2880], instructions a thread, pairs / bytes: 16 x 64 x 128 120 /
# 196 (fp8_block 135 / 200), 32 x 64 x 128 155 / 287 (181 / 321), gpt-oss GLU 16 x 32 x 256 (the
# table's entry) 210 / 347 (220 / 292). The wgmma tiles stage the weights in shared memory,
# where bytes load as well and the pairs cost their split (64 x 128 x 64 at [256, 4096, 4096]:
# 153 / 141).
PAIRED_MAX_ROWS = 32
# mxfp4's e8m0 scales are plain loads (a few bytes a thread, below what cp.async moves), so tiles
# of at most this many rows, whose dots are too short to cover a load's latency, load them a loop
# step ahead (the last step reloads its own, to stay in range); taller tiles load them in their
# step. The loop-carried factors are also what keeps these tiles' decode in a blocked layout, its
# tile staged through shared memory for the dot: loaded in the step, the decode runs in the dot
# operand's registers (offline SASS, 16 x 64 x 128: BAR.SYNC 2 against 16, no STS.128 against 8,
# but 335 instructions a thread against 289; carrying the codes instead of the factors: 293, the
# staging kept), where the step's load latency was measured to cost more (docs/decisions.md).
MX_SCALES_AHEAD_MAX_ROWS = 32
# `BlockConfig.weights_first` applies to paths of at least this many rows: wgmma's M is 64.
WEIGHTS_FIRST_MIN_ROWS = 64
# fp8 activations' unmasked tiles narrow block_n to divide N down to this (Math: fp8 activations)
DIRECT_MIN_BLOCK_N = 32
# fp8_block tiles of at least this many rows fold the block scale into the weights (Math:
# fp8_block): the wgmma tiles, whose weight operand goes through shared memory anyway.
FOLD_MIN_ROWS = 64


def byte_pairs(values):
    """uint8 [E, N, K'] (K' even) -> the same bytes as uint16 [E, N, K'/2], byte 2i the low."""
    e, n, k = values.shape
    return jax.lax.bitcast_convert_type(values.reshape(e, n, k // 2, 2), jnp.uint16)


# fp8 weights multiply in float16: e4m3 -> f16 is exact and one hardware conversion (cvt e4m3x2
# -> f16x2, on the conversion pipe) per two values, where e4m3 -> bf16 costs a second conversion
# per value (f16 -> bf16), or, by bit placement, 3.25 integer and bf16x2 instructions a value.
def e4m3_f16(q):
    """uint8 [r, n] of e4m3 codes -> their values as float16 (exact; NaN codes NaN)."""
    return jax.lax.bitcast_convert_type(q, jnp.float8_e4m3fn).astype(jnp.float16)


def _inline_asm(ptx: str, args, constraints: str, pack: int, dtype):
    """The elements of args (arrays of one shape), `pack` to a PTX block, through `ptx` -> an
    array of that shape in dtype."""
    [w] = plgpu.elementwise_inline_asm(
        ptx,
        args=args,
        constraints=constraints,
        pack=pack,
        result_shape_dtypes=[jax.ShapeDtypeStruct(args[0].shape, dtype)],
    )
    return w


# The byte-pair view (module docstring, Offsets): two uint16 pairs a 32-bit register, the first
# pair ("low") or the second ("high") converted by the hardware to f16x2 in one instruction.
E4M3_PAIR_PTX = {
    half: f"""{{
.reg .b16 p, q;
mov.b32 {{p, q}}, $1;
cvt.rn.f16x2.e4m3x2 $0, {reg};
}}"""
    for half, reg in (("low", "p"), ("high", "q"))
}


def _e4m3_pair_f16(pairs, half: str):
    """uint16 [r, n] byte pairs (n even) -> float16 [r, n]: elements 2i and 2i + 1 are the e4m3
    values of the low and high byte of pair 2i ("low") or pair 2i + 1 ("high") (exact; NaN codes
    NaN)."""
    if not _common.interpret_mode():
        return _inline_asm(E4M3_PAIR_PTX[half], [pairs], "=r,r", 2, jnp.float16)
    r, n = pairs.shape
    pair = pairs.reshape(r, n // 2, 2)[:, :, int(half == "high")]
    q = jnp.stack([pair & 0xFF, pair >> 8], axis=-1).reshape(r, n).astype(jnp.uint8)
    return e4m3_f16(q)


def _word_x_order(lhs):
    """lhs [M, K] (K a multiple of 4) with columns 4m, 4m + 1 (m = 0..K/4 - 1) first, then
    4m + 2, 4m + 3: the byte-pair view's two half-depth dots' columns (Offsets)."""
    m, k = lhs.shape
    return lhs.reshape(m, k // 4, 2, 2).transpose(0, 2, 1, 3).reshape(m, k)


def rows_as_f16(lhs):
    """bf16 lhs [M, K] as float16 lhs16 and a float32 power of two per row, lhs = lhs16 · p:
    p = 2^(e − 15) with e the exponent of the row's largest magnitude (frexp: |x| < 2^e), so the
    row's values lie below 2^15 (float16's largest is 65504) and keep bf16's 8 significant bits in
    float16's 11 down to 2^-14 · p, 2^-29 of the row's largest (float16's subnormals below that):
    the dot of such a row equals the bf16 one up to terms under 2^-28 of its largest product.
    Rows of zeros, infinities or NaN keep p = 1."""
    x = lhs.astype(jnp.float32)
    p = _power_above(jnp.max(jnp.abs(x), axis=1), -15)
    return (x / p[:, None]).astype(jnp.float16), p


def _power_above(amax, shift: int):
    """2^(e + shift) with e the exponent of amax (frexp: amax < 2^e), 1 where amax is 0, infinite
    or NaN."""
    ok = jnp.isfinite(amax) & (amax > 0)
    _, e = jnp.frexp(jnp.where(ok, amax, 1.0))
    return jnp.where(ok, jnp.ldexp(jnp.ones_like(amax), e + shift), 1.0)


def _column_powers(scales):
    """fp8_block scales [E, K/128, C] (C: column blocks, or columns) -> (scales / p, p): p [E, C]
    the power of two 2^e with e the exponent of the column's largest magnitude over K (frexp), so
    each column's normalised scales lie below 1, its largest at least 1/2 (exact: a power of two
    divides them). Columns of zeros, infinities or NaN keep p = 1."""
    p = _power_above(jnp.max(jnp.abs(scales), axis=1), 0)
    return scales / p[:, None, :], p


# e2m1 -> bf16 by bit placement: a code's exponent and mantissa bits (E1 E0 M) in bf16's lowest
# two exponent bits and top mantissa bit (bits 8, 7, 6), its sign in the sign bit (15), read as
# e2m1(code) · 2^-126 (E = 0, M = 1 is bf16's subnormal 2^-127, i.e. 0.5 · 2^-126). The stored
# words (`mx_words.MX_WORD_BITS`) keep three of a word's four pairs of codes one shift and one and
# away from those bits of a bf16x2 lane: (L0, L1) an and, (L2, L3) and (H0, H1) a shift and an
# and, (H2, H3), whose bits fill the word's remainder, 8 (13 a word; a code a nibble would need
# byte permutes).
# Each pair is its own quarter of the tile: the values are read as uint16 byte pairs, two to a
# word, and one PTX block makes one bf16x2 of a word, so each thread's dot operand registers hold
# 2 K values, as the 16-bit x's do (a byte tile's 4 made Triton shuffle x's fragments: offline
# SASS of the 16 x 64 x 128 K loop 399 -> 343 instructions a thread).
# The e8m0 scale 2^(s - 127) of the value's sub-block and column then enters as one bf16x2
# multiply by 2^(s - 1) where every code is at most 128 (`QuantizedWeight.small_scales`, as in
# gpt-oss's checkpoints: 13 + 4 instructions a word), else two (`e8m0_factors`),
# 2^(min(s, 128) - 1) and 2^(max(s, 128) - 128), since 2^(s - 1) is past bf16's largest power
# of two (2^127) for s > 128 (13 + 8; offline SASS of the K loop at K = N = 2880, one against
# two: 16 x 128 x 128 gpt-oss GLU 426 / 525 instructions a thread, 16 x 256 x 128 GLU 748 / 937,
# 16 x 64 x 128 289 / 329, 64 x 128 x 64 290 / 332; `benchmarks.sass --large-scales`).
# e2m1's 2 significant bits times a power of two are a bf16 wherever that power keeps them in
# range (and overflow where float32's 2^(s - 127) · e2m1 does), so the products are exact and
# the dots take the scaled weights: no float32 multiply of the accumulator per sub-block (2 a
# value of it per 32 K), which halves the 64-row tile's K loop (offline SASS, 64 x 128 x 64:
# 592 -> 327 instructions a thread; the layer at 64 rows per expert 28-31% faster). On 16- and
# 32-row tiles the factors, a broadcast operand, keep Triton from moving the decode past the
# shared-memory load into the dot operand's registers, so the decoded tile takes a shared-memory
# round trip; those tiles still run fewer instructions (16 x 64 x 128: 343 -> 329) and the layer
# at decode sizes (T = 16-256) 5% faster.
_PAIR_BITS = "0x81C081C0"  # bits 15, 8, 7, 6 of both bf16 halves
_E2M1_BODY = {
    "lo01": f"and.b32 t, $1, {_PAIR_BITS};",
    "lo23": f"shl.b32 t, $1, 3;\nand.b32 t, t, {_PAIR_BITS};",
    "hi01": f"shl.b32 t, $1, 6;\nand.b32 t, t, {_PAIR_BITS};",
    "hi23": """shr.b32 a, $1, 4;
and.b32 a, a, 0x00C000C0;
shr.b32 b, $1, 5;
and.b32 b, b, 0x01000100;
or.b32 a, a, b;
shl.b32 b, $1, 1;
and.b32 b, b, 0x80008000;
or.b32 t, a, b;""",
}
_E2M1_SCALE = {  # by the scale's one or two factors, $2 (and $3)
    1: "mul.rn.bf16x2 $0, t, $2;",
    2: "mul.rn.bf16x2 t, t, $2;\nmul.rn.bf16x2 $0, t, $3;",
}
E2M1_PTX = {  # (quarter, factors): $1 the byte pairs, $0 the scaled values
    (quarter, factors): "{\n.reg .b32 t, a, b;\n" + body + "\n" + scale + "\n}"
    for quarter, body in _E2M1_BODY.items()
    for factors, scale in _E2M1_SCALE.items()
}
MX_QUARTERS = tuple(_E2M1_BODY)  # in x's column order within a 32-column block (`_mx_x_order`)


def _mx_x_order(lhs):
    """lhs [M, K] with each 32-column block's columns in the quarters' order: k = 4i, 4i + 1
    (i = 0..7), then k = 4i + 2, 4i + 3, so a quarter's K values are 16 contiguous columns."""
    m, k = lhs.shape
    quads = lhs.reshape(m, k // MX_BLOCK, MX_BLOCK // 4, 2, 2)  # [block, i, pair, value]
    return quads.transpose(0, 1, 3, 2, 4).reshape(m, k)


def e8m0_factors(codes, small: bool):
    """e8m0 codes s [n] -> bf16 [n] factors whose product times the decode's e2m1 · 2^-126 is
    e2m1 · 2^(s - 127): small (every s at most 128), the one 2^(s - 1); else 2^(min(s, 128) - 1)
    and 2^(max(s, 128) - 128). Each by placing its exponent in bf16's exponent field (an add and
    a shift on the integer pipe, where exp2 takes a conversion and a MUFU op). s = 255 reads as
    2^128 · e2m1 (inf, or 0 for a zero code)."""
    c = codes.astype(jnp.int32)
    bf16 = lambda field: jax.lax.bitcast_convert_type((field << 7).astype(jnp.uint16), jnp.bfloat16)
    if small:
        return (bf16(c + 126),)
    return bf16(jnp.minimum(c, 128) + 126), bf16(jnp.maximum(c, 128) - 1)


def e2m1(pairs, quarter: str, factors):
    """Stored values as uint16 [r, n] byte pairs (n even: whole words) and their scale factors
    (`e8m0_factors`, one or two, each bf16 [r]: a row's, or [r, n]: a pair's) -> bf16 [r, n]
    e2m1 · 2^(s - 127), exact: element 2i + d of quarter "lo01" is word i's code L(d), of "lo23"
    L(2 + d), "hi01" H(d), "hi23" H(2 + d) (`mx_words.mxfp4_unpack`'s low and high halves)."""
    r, n = pairs.shape
    if not _common.interpret_mode():
        fs = [f if f.ndim == 2 else jnp.broadcast_to(f[:, None], (r, n)) for f in factors]
        ptx = E2M1_PTX[quarter, len(factors)]
        return _inline_asm(ptx, [pairs, *fs], "=r" + ",r" * (1 + len(fs)), 2, jnp.bfloat16)
    # The same value without bf16's subnormal (XLA on CPU flushes it): magnitude codes m >= 2 are
    # 0x3F00 + (m << 6) (1.0 is 0x3F80), m = 1 is 0.5 (0x3F00), m = 0 is 0; scaled in float32.
    q = jax.lax.bitcast_convert_type(pairs, jnp.uint8).reshape(r, 2 * n)
    codes = mxfp4_unpack(q)[quarter.startswith("hi")].reshape(r, n // 2, 2, 2)
    codes = codes[:, :, int(quarter.endswith("23")), :].reshape(r, n)
    m = codes & 7
    mag = jnp.where(m >= 2, 0x3F00 + (m << 6), jnp.where(m == 1, 0x3F00, 0))
    bits = (mag | ((codes & 8) << 12)).astype(jnp.uint16)
    value = jax.lax.bitcast_convert_type(bits, jnp.bfloat16).astype(jnp.float32)
    first, *rest = (f.astype(jnp.float32).reshape(r, -1) for f in factors)
    value = value * (first * 2.0**-126)  # in float32's range
    return functools.reduce(jnp.multiply, rest, value).astype(jnp.bfloat16)


def _kernel(
    *refs,
    fmt: str,
    num_groups: int,
    num_visits: int,
    k_dim: int,
    n_out: int,
    cfg: BlockConfig,
    gather: bool,
    has_bias: bool,
    activation: str | None,
    has_row_scale: bool,
    compute_dtype,
    paired: bool,
    f16_rows: bool,
    block_cols: bool,
    folded: bool,
    small_scales: bool,
    weights_first: bool,
    fp8_lhs: bool,
    uniform_block_scale: bool,
    direct: bool,
):
    it = iter(refs)
    group_ref, m_start_ref, row_end_ref = (next(it) for _ in range(3))
    row_index_ref = next(it) if gather else None
    lhs_ref, values_ref, scales_ref = next(it), next(it), next(it)
    lhs_scale_ref = next(it) if f16_rows or fp8_lhs else None
    col_power_ref = next(it) if folded else None
    bias_ref = next(it) if has_bias else None
    row_scale_ref = next(it) if has_row_scale else None
    out_ref = next(it)
    bm, bn = cfg.block_m, cfg.block_n
    bk = cfg.block_k
    unroll = bk // (2 * MX_BLOCK)  # mxfp4: 32-byte sub-blocks of K per loop step

    v, n_tile = _common.swizzled_tile(num_visits, pl.cdiv(n_out, bn), cfg.group_m)
    n0 = n_tile * bn

    g = group_ref[v]
    m0 = m_start_ref[v]
    row_end = row_end_ref[v]
    cols = n0 + jnp.arange(bn, dtype=jnp.int32)
    n_mask = cols < n_out if n_out % bn else None
    used = m0 < row_end
    # Weight column blocks of the tile: (first column, width, valid columns or None if all are).
    if activation == "gptoss":
        blocks = ((2 * n0, 2 * bn, None if n_mask is None else 2 * (n_out - n0)),)
    elif activation == "swiglu":
        valid = None if n_mask is None else n_out - n0
        blocks = ((n0, bn, valid), (n_out + n0, bn, valid))
    else:
        blocks = ((n0, bn, None if n_mask is None else n_out - n0),)

    def col_mask(width, valid):
        return None if valid is None else jnp.arange(width, dtype=jnp.int32) < valid

    def block_scale_cols(c0, width):
        """fp8_block: where the scales of columns c0.. are (their block's, n // 128, read in
        place from [E, K/128, N/128] scales; their own in the per-column form)."""
        if block_cols:
            return (c0 + jnp.arange(width, dtype=jnp.int32)) // FP8_BLOCK
        return pl.ds(c0, width)

    def block_scale_row(k, c0, width, valid):
        """fp8_block: the scales of columns c0.. in the 128-row K block of index k."""
        return _common.masked_load(
            scales_ref.at[g, k // FP8_BLOCK, block_scale_cols(c0, width)], col_mask(width, valid)
        )

    def load_values(c0, width, valid, k0, depth, k_mask=None):
        """A weight tile of the N-major values [E, N, P] (mxfp4: [E, N, K/4] uint16 byte pairs;
        fp8's paired view: [E, N, P/2] uint16): [width, depth] from column c0 and K index k0
        (in the view's elements)."""
        c_mask = col_mask(width, valid)
        mask = _common.and_masks(
            None if c_mask is None else c_mask[:, None],
            None if k_mask is None else k_mask[None, :],
        )
        return _common.masked_load(values_ref.at[g, pl.ds(c0, width), pl.ds(k0, depth)], mask)

    def masks(h):
        rows = m0 + jnp.arange(h, dtype=jnp.int32)
        row_ok = rows < row_end
        return row_ok, _common.and_masks(
            row_ok[:, None], None if n_mask is None else n_mask[None, :]
        )

    @pl.when(used & (g == num_groups))
    def _tail_rows():
        plgpu.store(
            out_ref.at[pl.ds(m0, bm), pl.ds(n0, bn)],
            jnp.zeros((bm, bn), out_ref.dtype),
            mask=masks(bm)[1],
        )

    def grouped_rows(h):
        row_ok, out_mask = masks(h)
        src = _common.masked_load(row_index_ref.at[pl.ds(m0, h)], row_ok) if gather else None

        def lhs_tile(k0, depth, k_mask):
            ks = k0 + jnp.arange(depth, dtype=jnp.int32)
            a_mask = _common.and_masks(row_ok[:, None], None if k_mask is None else k_mask[None, :])
            if gather:
                tile = _common.masked_load(lhs_ref.at[src[:, None], ks[None, :]], a_mask)
            else:
                tile = _common.masked_load(lhs_ref.at[pl.ds(m0, h), pl.ds(k0, depth)], a_mask)
            return tile.astype(compute_dtype)

        sub_blocks = k_dim // (2 * MX_BLOCK)

        swapped = weights_first and h >= WEIGHTS_FIRST_MIN_ROWS  # (Tiling)

        def dot(a, w):
            """x [h, depth] against the decoded weights [width, depth]: x · wᵀ, or (swapped)
            the transposed product w · xᵀ, accumulated as such."""
            return plgpu.dot(w, a, trans_b=True) if swapped else plgpu.dot(a, w, trans_b=True)

        def mx_scales(s_row):
            """Per column block, the scale factors of sub-block s_row's low and high halves."""
            return [
                tuple(
                    e8m0_factors(
                        _common.masked_load(
                            scales_ref.at[g, row, pl.ds(c0, width)], col_mask(width, valid)
                        ),
                        small_scales,
                    )
                    for row in (s_row, sub_blocks + s_row)
                )
                for c0, width, valid in blocks
            ]

        def mx_step(j, accs, scales):
            """Sub-block j, 32 bytes of K: k = 32j.. (the low half's codes) and K/2 + 32j.. (the
            high half's), with its scales: four 16-deep dots of the scaled values, one per
            quarter, against x's reordered columns (`_mx_x_order`), each accumulating in place."""
            r0 = j * MX_BLOCK
            xs = [
                lhs_tile(half + r0 + part, MX_BLOCK // 2, None)
                for half in (0, k_dim // 2)
                for part in (0, MX_BLOCK // 2)
            ]
            new = list(accs)
            for c, (c0, width, valid) in enumerate(blocks):
                pairs = load_values(c0, width, valid, j * (MX_BLOCK // 2), MX_BLOCK // 2)
                for a_q, q in zip(xs, MX_QUARTERS):
                    w_q = e2m1(pairs, q, scales[c][q.startswith("hi")]).astype(compute_dtype)
                    new[c] = new[c] + dot(a_q, w_q)
            return tuple(new)

        ahead = h <= MX_SCALES_AHEAD_MAX_ROWS

        def mx_body(i, carry):
            accs, scales = carry
            nxt = []
            for u in range(unroll):
                j = i * unroll + u
                if ahead:
                    nxt.append(mx_scales(jnp.minimum(j + unroll, sub_blocks - 1)))
                accs = mx_step(j, accs, scales[u] if ahead else mx_scales(j))
            return accs, tuple(nxt)

        def x_tiles(i, j, depth, tail=False):
            """x's tiles of K values [k0, k0 + depth), k0 = i·bk + j·depth, with the offset and
            K mask of the weight tile that meets them: in the paired view (K a multiple of 4,
            pair p holds k = 2p, 2p + 1) the [h, depth/2] tiles of the two halves of x's
            reordered columns (`_word_x_order`) at pair offset i·bk/2 + j·depth/2 (a product
            keeps its alignment for Triton; k0 // 2 does not), else the [h, depth] tile at k0."""
            if paired:
                p0 = i * (bk // 2) + j * (depth // 2)
                pair_ks = p0 + jnp.arange(depth // 2, dtype=jnp.int32)
                mask = None if k_dim % bk == 0 else pair_ks < k_dim // 2
                halves = (p0, k_dim // 2 + p0)
                return p0, tuple(lhs_tile(p, depth // 2, mask) for p in halves), mask
            k0 = i * bk + j * depth
            if tail:  # the K tail's window ends at K (Math: fp8 activations): the weights
                # unmasked, x's columns before k0 masked
                w0 = k_dim - depth
                ks = w0 + jnp.arange(depth, dtype=jnp.int32)
                return w0, (lhs_tile(w0, depth, ks >= k0),), None
            ks = k0 + jnp.arange(depth, dtype=jnp.int32)
            mask = ks < k_dim if k_dim % bk and not direct else None
            return k0, (lhs_tile(k0, depth, mask),), mask

        def fp8_body(i, accs):
            """acc += x[:, k0:k0+bk] @ the weight tile: the N-major tile [width, bk] decoded and
            fed to the dot transposed; in the paired view its [width, bk/2] byte pairs are two
            half-depth dots' operands, each word's first pair (low) and second (high), against
            the two halves of x's reordered columns (`x_tiles`)."""
            k0 = i * bk
            offset, xs, mask = x_tiles(i, 0, bk)
            new = list(accs)
            for c, (c0, width, valid) in enumerate(blocks):
                if paired:
                    pairs = load_values(c0, width, valid, offset, bk // 2, mask)
                    terms = [
                        (a_half, _e4m3_pair_f16(pairs, half).astype(compute_dtype))
                        for a_half, half in zip(xs, ("low", "high"))
                    ]
                else:
                    q = load_values(c0, width, valid, offset, bk, mask)
                    terms = [(xs[0], e4m3_f16(q).astype(compute_dtype))]
                if fmt == "fp8_block":
                    block_scales = block_scale_row(k0, c0, width, valid)
                    if h < FOLD_MIN_ROWS:  # the step's partial dot scaled in float32
                        d = functools.reduce(jnp.add, (dot(a_t, w_t) for a_t, w_t in terms))
                        new[c] = new[c] + d * block_scales[None, :]
                        continue
                    # the scale folded into the weights (Math: fp8_block), dots in place
                    s_w = block_scales.astype(compute_dtype)[:, None]
                    terms = [(a_t, w_t * s_w) for a_t, w_t in terms]
                for a_t, w_t in terms:  # each dot accumulates in place (one mma chain)
                    new[c] = new[c] + dot(a_t, w_t)
            return tuple(new)

        def fp8_lhs_body(i, accs, tail=False):
            """(Math: fp8 activations) each 128-deep K block of the step (bk // 128 of them, or
            the step itself when shorter) one partial dot, scaled into acc in float32: an fp8
            dot of x's e4m3 bytes and the weight bytes, or in the paired view the two
            half-depth float16 dots of x's values (float16 from the wrapper) and the decoded
            byte pairs."""
            new = list(accs)
            depth = min(bk, FP8_BLOCK)
            for j in range(max(bk // FP8_BLOCK, 1)):
                kj = i * bk + j * depth
                s_x = _common.masked_load(
                    lhs_scale_ref.at[src, kj // FP8_BLOCK]
                    if gather
                    else lhs_scale_ref.at[pl.ds(m0, h), kj // FP8_BLOCK],
                    row_ok,
                )
                offset, xs, mask = x_tiles(i, j, depth, tail)
                for c, (c0, width, valid) in enumerate(blocks):
                    if paired:
                        pairs = load_values(c0, width, valid, offset, depth // 2, mask)
                        d = dot(xs[0], _e4m3_pair_f16(pairs, "low")) + dot(
                            xs[1], _e4m3_pair_f16(pairs, "high")
                        )
                    else:
                        q = load_values(c0, width, valid, offset, depth, mask)
                        a8 = jax.lax.bitcast_convert_type(xs[0], jnp.float8_e4m3fn)
                        if not direct:  # bytes (a bitcast, even to itself, stages the tile)
                            q = jax.lax.bitcast_convert_type(q, jnp.float8_e4m3fn)
                        d = fp8_dot(a8, q)
                    if fmt == "fp8":  # (the column scale is the epilogue's)
                        step_scale = s_x[:, None]
                    elif uniform_block_scale:  # the tile's columns lie in one scale block
                        step_scale = (s_x * scales_ref[g, kj // FP8_BLOCK, c0 // FP8_BLOCK])[
                            :, None
                        ]
                    else:
                        step_scale = s_x[:, None] * block_scale_row(kj, c0, width, valid)[None, :]
                    new[c] = new[c] + d * step_scale
            return tuple(new)

        accs = tuple(
            jnp.zeros((width, h) if swapped else (h, width), jnp.float32) for _, width, _ in blocks
        )
        if fp8_lhs and direct:  # the full K steps, then the tail's own (x_tiles)
            accs = jax.lax.fori_loop(0, k_dim // bk, fp8_lhs_body, accs)
            if k_dim % bk:
                accs = fp8_lhs_body(jnp.int32(k_dim // bk), accs, tail=True)
        elif fp8_lhs:
            accs = jax.lax.fori_loop(0, pl.cdiv(k_dim, bk), fp8_lhs_body, accs)
        elif fmt == "mxfp4":
            first = (mx_scales(jnp.int32(min(u, sub_blocks - 1))) for u in range(unroll))
            carry = (accs, tuple(first) if ahead else ())
            accs, _ = jax.lax.fori_loop(0, sub_blocks // unroll, mx_body, carry)
            accs = jax.lax.fori_loop(
                sub_blocks - sub_blocks % unroll,
                sub_blocks,
                lambda j, accs: mx_step(j, accs, mx_scales(j)),
                accs,
            )
        else:
            accs = jax.lax.fori_loop(0, pl.cdiv(k_dim, bk), fp8_body, accs)
        if swapped:
            accs = tuple(acc.T for acc in accs)

        if f16_rows:  # lhs = lhs16 · p per lhs row (`rows_as_f16`), exact in float32
            p_rows = _common.masked_load(
                lhs_scale_ref.at[src] if gather else lhs_scale_ref.at[pl.ds(m0, h)], row_ok
            )

        def epilogue(acc, cols, mask):
            if f16_rows:
                acc = acc * p_rows[:, None]
            if fmt == "fp8":
                acc = acc * _common.masked_load(scales_ref.at[g, cols], mask)[None, :]
            if folded:  # the columns' powers of two (`_column_powers`)
                powers = col_power_ref.at[g, block_scale_cols(cols.start, cols.size)]
                acc = acc * _common.masked_load(powers, mask)[None, :]
            if has_bias:
                acc = (
                    acc
                    + _common.masked_load(bias_ref.at[g, cols], mask).astype(jnp.float32)[None, :]
                )
            return acc

        accs = [
            epilogue(acc, pl.ds(c0, width), col_mask(width, valid))
            for acc, (c0, width, valid) in zip(accs, blocks)
        ]
        if activation == "gptoss":  # gate and up columns interleave: the even and odd ones
            accs = jnp.unstack(accs[0].reshape(h, bn, 2), axis=-1)
        out = glu(accs[0], accs[1], activation) if activation else accs[0]
        if has_row_scale:
            scale = _common.masked_load(row_scale_ref.at[pl.ds(m0, h)], row_ok)
            out = out * scale.astype(jnp.float32)[:, None]
        plgpu.store(
            out_ref.at[pl.ds(m0, h), pl.ds(n0, bn)], out.astype(out_ref.dtype), mask=out_mask
        )

    _common.run_paths(cfg.m_paths(), row_end - m0, used & (g < num_groups), grouped_rows)


def _format_tile(fmt: str, cfg: BlockConfig) -> BlockConfig:
    """K values per loop step: mxfp4 64, 128 or 256 (1, 2 or 4 sub-blocks of 32 bytes of K, each
    scale row its own pair of dots); fp8 at most 256; fp8_block at most 128 (one scale row per
    step), a tile that asks for more K (fp8's entries, which fp8_block shares) reading the same
    weight bytes a step as that much wider N."""
    if fmt == "mxfp4":
        return dataclasses.replace(cfg, block_k=min(max(cfg.block_k, 2 * MX_BLOCK), 8 * MX_BLOCK))
    if fmt == "fp8_block" and cfg.block_k > FP8_BLOCK:
        wider = cfg.block_n * cfg.block_k // FP8_BLOCK
        return dataclasses.replace(cfg, block_k=FP8_BLOCK, block_n=wider)
    return dataclasses.replace(cfg, block_k=min(cfg.block_k, 2 * FP8_BLOCK))


def _one_scale_block(cfg: BlockConfig, activation, n_out: int) -> bool:
    """Whether every weight column block of a tile (`_kernel`'s blocks) lies in one 128-column
    scale block: its width divides 128 and its first column is a multiple of the width."""
    width = cfg.block_n * (2 if activation == "gptoss" else 1)
    return FP8_BLOCK % width == 0 and (activation != "swiglu" or n_out % width == 0)


def gmm_quant(
    lhs: jax.Array,
    rhs,
    group_sizes: jax.Array,
    *,
    lhs_row_index: jax.Array | None = None,
    bias: jax.Array | None = None,
    activation: str | None = None,
    row_scale: jax.Array | None = None,
    out_dtype=None,
    lhs_scales: jax.Array | None = None,
    config: BlockConfig | None = None,
) -> jax.Array:
    """`kernels.gmm.gmm` (no transpose_rhs) with rhs a `QuantizedWeight` of logical shape
    [G, K, N] (module docstring); config's tail_m is ignored and its K step fitted to the format
    (`_format_tile`). With lhs_scales (float32 [M, ceil(K/128)]) lhs holds float8_e4m3fn values,
    lhs = lhs · lhs_scales per row and 128 values of K (`quant.quantize_rows`), and the products
    run on the FP8 tensor cores (Math: fp8 activations); out_dtype is then required."""
    fmt = rhs.fmt
    num_groups, k_dim, n_dim = rhs.shape
    if lhs.ndim != 2 or lhs.shape[1] != k_dim:
        raise ValueError(f"lhs must be [M, K={k_dim}], got {lhs.shape}.")
    fp8_lhs = lhs_scales is not None
    if fp8_lhs:
        if fmt == "mxfp4" or lhs.dtype != jnp.float8_e4m3fn or out_dtype is None:
            raise ValueError(
                "fp8 activations (lhs_scales) need float8_e4m3fn lhs values, 'fp8' or "
                f"'fp8_block' weights and an out_dtype; got lhs {lhs.dtype}, weights {fmt!r}, "
                f"out_dtype {out_dtype}."
            )
        if lhs_scales.shape != (lhs.shape[0], -(-k_dim // FP8_BLOCK)):
            raise ValueError(
                f"lhs_scales must be [{lhs.shape[0]}, {-(-k_dim // FP8_BLOCK)}] (a scale per row "
                f"and {FP8_BLOCK} values of K), got {lhs_scales.shape}."
            )
    if group_sizes.shape != (num_groups,):
        raise ValueError(f"group_sizes must be [{num_groups}], got {group_sizes.shape}.")
    if activation is not None and n_dim % 2:
        raise ValueError("a GLU activation needs an even weight column count.")
    gather = lhs_row_index is not None
    num_rows = lhs_row_index.shape[0] if gather else lhs.shape[0]
    _common.check_epilogue(num_groups, n_dim, num_rows, bias, row_scale)
    n_out = n_dim // 2 if activation else n_dim
    _common.check_int32_sizes("gmm_quant", lhs=lhs.shape, rhs=rhs.shape, out=(num_rows, n_out))
    out_dtype = jnp.dtype(out_dtype or lhs.dtype)
    if num_rows == 0 or n_out == 0:
        return jnp.zeros((num_rows, n_out), out_dtype)
    cfg = _format_tile(fmt, config or BlockConfig())
    cfg = dataclasses.replace(cfg.fit(num_rows, k_dim, n_out), tail_m=0)
    values, scales = rhs.values, rhs.scales
    if fmt == "mxfp4":  # byte pairs and x's columns in the quarters' order (`e2m1`)
        values, lhs = byte_pairs(values), _mx_x_order(lhs)
    offsets = PAIRED_MIN_ELEMENTS <= values.size <= 2**32  # (Offsets)
    # (Tiling) mxfp4's weights first where a path can take it: wgmma's A holds 16 rows a warp, so
    # each weight block (a GLU tile's gate and up halves, or its interleaved pairs) spans the warps
    block_width = cfg.block_n * (2 if activation == "gptoss" else 1)
    weights_first = (
        cfg.weights_first
        and cfg.block_m >= WEIGHTS_FIRST_MIN_ROWS
        and block_width >= 16 * cfg.num_warps
        and fmt == "mxfp4"  # (Tiling) fp8 values' swapped tiles raced on the GPU
    )
    pairs_pay = cfg.block_m <= PAIRED_MAX_ROWS and k_dim % 4 == 0
    paired = fmt != "mxfp4" and (offsets or pairs_pay)
    if fp8_lhs:  # bytes for the fp8 dots, a K step of one scale block (the promotion interval);
        # the exact float16 values for the paired view's dots, a step of at least one scale block
        # (a partial dot scaled per step: 64 x 128 x 64 242 instructions a thread, x 128 327)
        lhs = lhs.astype(jnp.float16) if paired else jax.lax.bitcast_convert_type(lhs, jnp.uint8)
        block_k = _common.pow2_block(FP8_BLOCK, k_dim)
        cfg = dataclasses.replace(cfg, block_k=max(cfg.block_k, block_k) if paired else block_k)
    # (Math: fp8 activations) fp8 dots on the weights as loaded, where no tile needs a mask:
    # block_n divides N, the K tail is a step of its own
    direct = fp8_lhs and not paired and k_dim % 16 == 0 and k_dim >= cfg.block_k
    if direct:
        block_n = _common.dividing_block(cfg.block_n, n_out, DIRECT_MIN_BLOCK_N)
        direct = n_out % block_n == 0
        cfg = dataclasses.replace(cfg, block_n=block_n if direct else cfg.block_n)
    if fmt != "mxfp4" and not direct:  # bytes: a masked fp8 load's fill value does not lower
        values = jax.lax.bitcast_convert_type(values, jnp.uint8)
    if paired:
        if k_dim % 4:
            raise ValueError(
                f"{fmt} weights of {values.size} bytes (over 2^31, at most 2^32) are read as "
                f"byte pairs along K, which needs K a multiple of 4; got K={k_dim}. Pad the "
                "weight's K or use the bf16 weights (dequantize_experts)."
            )
        values = byte_pairs(values)
    block_cols = fmt == "fp8_block" and scales.shape[2] != n_dim  # (Math: fp8_block)
    sched = dispatch.tile_schedule(
        _common.clamp_group_ends(group_sizes, num_rows), num_rows, cfg.block_m
    )
    num_visits = sched.group.shape[0]
    operands = [sched.group, sched.m_start, sched.row_end]
    if gather:
        operands.append(lhs_row_index.astype(jnp.int32))
    f16_rows = fmt != "mxfp4" and lhs.dtype == jnp.bfloat16  # (Math: fp8 in float16)
    lhs_scale = lhs_scales.astype(jnp.float32) if fp8_lhs else None
    if f16_rows:
        lhs, lhs_scale = rows_as_f16(lhs)
    if paired:  # the two halves of each word's columns (module docstring, Offsets)
        lhs = _word_x_order(lhs)
    # fp8_block with a tile path of FOLD_MIN_ROWS rows: the scales normalised per column (Math:
    # fp8_block), the powers to the epilogue; decode-sized calls (16-row tiles) take them as
    # stored, with no XLA pass over them per call.
    folded = fmt == "fp8_block" and cfg.block_m >= FOLD_MIN_ROWS and not fp8_lhs
    col_power = []
    if folded:
        scales, power = _column_powers(scales)
        col_power = [power]
    operands += [lhs, values, scales, *([lhs_scale] if f16_rows or fp8_lhs else []), *col_power]
    if bias is not None:
        operands.append(bias)
    if row_scale is not None:
        operands.append(row_scale)
    kernel = functools.partial(
        _kernel,
        fmt=fmt,
        num_groups=num_groups,
        num_visits=num_visits,
        k_dim=k_dim,
        n_out=n_out,
        cfg=cfg,
        gather=gather,
        has_bias=bias is not None,
        activation=activation,
        has_row_scale=row_scale is not None,
        compute_dtype=lhs.dtype,
        paired=paired,
        f16_rows=f16_rows,
        block_cols=block_cols,
        folded=folded,
        small_scales=rhs.small_scales,
        weights_first=weights_first,
        fp8_lhs=fp8_lhs,
        uniform_block_scale=fp8_lhs and block_cols and _one_scale_block(cfg, activation, n_out),
        direct=direct,
    )
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((num_rows, n_out), out_dtype),
        grid=(num_visits * pl.cdiv(n_out, cfg.block_n),),
        compiler_params=plgpu.CompilerParams(num_warps=cfg.num_warps, num_stages=cfg.num_stages),
        interpret=_common.interpret_mode(),
        name=f"gmm_{fmt}",
    )(*operands)
