"""Low-precision expert weights kept as stored: `QuantizedWeight`, `quantize_experts`,
`dequantize_experts`.

A quantised expert weight takes the place of a `[E, K, N]` array (`w_gate_up`, `w_down`) in the
params of `moe_experts` (with or without a mesh: values and scales both lead with E, so expert
parallelism splits them alike), `ragged_dot` and the `MoE` layer's forward. Its logical value
w[e, k, n]:

  - "fp8": values float8_e4m3fn [E, N, K] (N-major: each output channel's K values contiguous,
    as checkpoints store their [out, in] matrices), scales float32 [E, N] (one per output
    channel):
        w[e, k, n] = values[e, n, k] · scales[e, n]
  - "fp8_block": values float8_e4m3fn [E, N, K] as "fp8", scales float32
    [E, ceil(K/128), ceil(N/128)] (DeepSeek-V3's `weight_scale_inv`, transposed):
        w[e, k, n] = values[e, n, k] · scales[e, k // 128, n // 128]
    or scales [E, ceil(K/128), N], one per column and 128-row block, w = values · scales[e,
    k // 128, n] (the loader's form for a gate|up pair whose halves do not fill whole 128-column
    blocks; the two forms coincide at N = 1).
    Why N-major (also "mxfp4"'s): a kernel tile of one output column's K values is contiguous
    bytes, which the 16-row tensor-core fragment reads 4 at a time (K-major bytes are read one
    by one: on the H200 the fp8 gmm in [K, N] ran 1.2-1.8x slower at 2 rows per expert).
  - "mxfp4" (OCP microscaling, as gpt-oss publishes its experts): values uint8 [E, N, K/2]
    (N-major, as fp8's), two e2m1 codes per byte, scales uint8 [E, K/32, N] (e8m0:
    2^(code − 127), one per 32 values of K):
        w[e, k, n] = e2m1(code[e, n, k]) · 2^(scales[e, k // 32, n] − 127)
    Bytes (n, r..r+3), r a multiple of 4, read as a little-endian 32-bit word, hold the 8 codes
    of k = r..r+3 (the low half) and k = K/2 + r..r+3 (the high half) at the bits
    `kernels.mx_words.MX_WORD_BITS` names (`mxfp4_pack`, `mxfp4_unpack`): a kernel tile of bytes
    is four plain dots, one per pair of a word's codes, against column slices of x, and the bits
    are placed so that the kernel's decode takes 17 instructions per word (`kernels.gmm_quant`).
    K must be a multiple of 64. e2m1 code bits: sign 3, exponent 2-1 (bias 1, 0 subnormal),
    mantissa 0: codes 0-7 are 0, 0.5, 1, 1.5, 2, 3, 4, 6.

Row pitch. "fp8" and "fp8_block" values are stored [E, N, P]: each output column's row of K bytes
padded with zeros to P, the next multiple of ROW_PITCH (256) bytes, where that adds at most
PITCH_MAX_OVERHEAD of the row (gpt-oss's K = 2880 -> 3072, 6.7% more bytes; SwiGLU-256's 4096 and
2048 are whole already), and `QuantizedWeight.k` keeps K. The Triton kernels read each row's first
K bytes only (every tile's loads are masked at K); Mosaic GPU's FP8-activation kernel, whose TMA
boxes cannot stop inside a row, reads a K tail's last 128-value box on into the padding against
x's zero-filled columns, so the padding must be finite (zeros, as written here; `debug_checks`
checks it). The padding only makes every row start on a 256-byte boundary, where gpt-oss's rows
of 2880 bytes start on 64-byte ones, every other one across a 128-byte line (on an H100, gpt-oss's
fp8 decode calls read 5.5-6.0% faster per byte with 256-byte rows: docs/decisions.md).
`dequantize` and the checkpoint writers drop it. Weights with FP8 activations keep unpadded rows
where the padding would take the values past AS_LOADED_MAX_BYTES (gpt-oss's gate_up at E = 128:
2.12 -> 2.26 GB): past it the kernel reads them as uint16 byte pairs (`kernels.gmm_quant`, Offsets)
and multiplies in float16, where the FP8 tensor cores take the tiles as loaded, one byte an
element.

`dtype` is the weight's logical dtype (what `dequantize_experts` returns and what it must match
in `moe_experts`, x's dtype); `astype` changes only it. The stored values never become a bf16
copy on the device in the Pallas forward (`moe_pallas.kernels.gmm_quant` converts them on chip),
nor in the backward's products with wᵀ (`kernels.gmm_quant_t`); the xla backend, and those
products with per-column fp8_block scales or float32 activations, dequantise per call.

Quantisation rules (`quantize_experts`): "fp8" scales = per-channel absmax / 448 (e4m3's largest
finite value), "fp8_block" = per 128 x 128 block absmax / 448, values rounded to nearest even;
"mxfp4" per 32 values of K a power-of-two scale 2^(floor(log2(absmax)) − 2) (the OCP MX rule: the
largest value lands in [4, 8)), values rounded to nearest even on the e2m1 grid, saturating at 6.
Decoding is exact: every fp8 and e2m1 value times a power of two or a float32 scale is computed
in float32 and rounded once to the requested dtype. The weights must be finite: a NaN or an
infinity would set the scale of its whole block (fp8: the column, fp8_block: the 128 x 128 block,
mxfp4: the 32 values), so `quantize_experts` refuses concrete weights holding one (a ValueError
names the weight and the first position); under `jit` they are not checked.

FP8 activations (`QuantizedWeight.fp8_activations`, "fp8" and "fp8_block" weights; set by
`quantize_experts(..., fp8_activations=True)` or `use_fp8_activations`): the products with such a
weight quantise their activations as DeepSeek-V3 does, e4m3 values with a float32 scale per row
and 128 values of K (`quantize_rows`: absmax / 448, round to nearest even), and multiply on the
FP8 tensor cores (`kernels.gmm_quant`; with implementation="mosaic_gpu" `kernels.gmm_fp8_mgpu`
where it tiles the shapes), twice bf16's rate, on tiles of 64 rows or more (decode-sized
calls multiply the same values in float16). On the H200 the gpt-oss layer ran
1.16x bf16's speed at 64 rows per expert and 9% faster than fp8 weights alone, but slower than
bf16 at 512 (docs/decisions.md): the kernel waits on each step's fp8 dot before scaling it.
Mosaic GPU's kernel overlaps that scaling with the other warpgroup's dot: SwiGLU-256's layer ran
1.42-1.57x bf16's speed at 64-256 rows per expert on an H100, gpt-oss's 1.17-1.27x at 64-512 on
the H200 ("auto" takes it where the tuning table has its entries: both workloads on the H200 and
the H100, gpt-oss's on the H100 above 128 rows per expert). The result is then the product of the
quantised activations with the weights (e4m3 keeps 4 significant bits: each activation within
2^-4 of its value, relative), no longer the bf16 layer's within bf16 rounding
(docs/reliability.md); the xla backend computes the same quantised product. The backward's
products (dx, the routing weights' gradient) stay in x's dtype.
"""

import dataclasses
import functools
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from moe_pallas.kernels.fp8_blocks import FP8_MAX, fp8_blocks
from moe_pallas.kernels.gmm_quant import FP8_BLOCK, PAIRED_MIN_ELEMENTS
from moe_pallas.kernels.mx_words import mxfp4_pack, mxfp4_unpack

FORMATS: tuple[str, ...] = ("fp8", "fp8_block", "mxfp4")
MX_BLOCK = 32  # values of K per "mxfp4" scale
# The largest e8m0 code whose power 2^(code - 1) is a bf16 (`QuantizedWeight.small_scales`).
MX_SMALL_CODE = 128
# Experts quantised (and mxfp4 decoded) this many at a time: the float32 temporaries of a whole
# SwiGLU-256 weight ([256, 4096, 4096]) took 48 GiB; a chunk's are a few hundred MiB.
QUANTIZE_CHUNK = 8
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)
_WEIGHT_NAMES = ("w_gate_up", "w_down")
# fp8 values' rows are padded to a multiple of ROW_PITCH bytes where that adds at most
# PITCH_MAX_OVERHEAD of a row (module docstring, Row pitch).
ROW_PITCH = 256
PITCH_MAX_OVERHEAD = 1 / 8
# The largest fp8 values the kernel reads as bytes, not byte pairs (`kernels.gmm_quant`, Offsets):
# FP8 activations' weights are not padded past it (module docstring, Row pitch).
AS_LOADED_MAX_BYTES = PAIRED_MIN_ELEMENTS - 1


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class QuantizedWeight:
    """A `[E, K, N]` expert weight in a stored low-precision format (module docstring).

    values, scales: the stored arrays of `fmt`; fmt: "fp8" | "fp8_block" | "mxfp4" (static);
    dtype: the logical dtype (static); small_scales (static, "mxfp4"): every scale code is at
    most MX_SMALL_CODE, i.e. every scale at most 2 and |w| < 16 in every 32-value block, which
    lets the kernel scale each decoded pair with one multiply instead of two
    (`kernels.gmm_quant`). `quantize_experts` and `load_experts` set it where the scales are
    concrete (not under `jit`; `with_scale_bound` sets it later); False is always correct, True
    on larger codes gives wrong weights (`moe_pallas.debug_checks` catches that).
    fp8_activations (static, "fp8" and "fp8_block"): products with this weight quantise their
    activations to e4m3 per row and 128 values of K and run on the FP8 tensor cores (module
    docstring). k (static, "fp8" and "fp8_block"): the logical K where the values' rows are
    padded past it (module docstring, Row pitch; `with_row_pitch`), None where they are not."""

    values: jax.Array
    scales: jax.Array
    fmt: str = dataclasses.field(metadata={"static": True})
    dtype: jnp.dtype = dataclasses.field(metadata={"static": True})
    small_scales: bool = dataclasses.field(default=False, metadata={"static": True})
    fp8_activations: bool = dataclasses.field(default=False, metadata={"static": True})
    k: int | None = dataclasses.field(default=None, metadata={"static": True})

    def __post_init__(self):
        if self.fp8_activations and self.fmt not in ("fp8", "fp8_block"):
            raise ValueError(
                f"fp8_activations needs 'fp8' or 'fp8_block' weights (the FP8 tensor cores take "
                f"e4m3 operands), got fmt={self.fmt!r}."
            )
        if self.k is not None and self.fmt not in ("fp8", "fp8_block"):
            raise ValueError(f"k (padded rows) applies to 'fp8' and 'fp8_block', not {self.fmt!r}.")

    @property
    def shape(self) -> tuple[int, int, int]:
        e, n, row = self.values.shape
        k = self.k if self.k is not None else row
        return (e, 2 * row if self.fmt == "mxfp4" else k, n)

    @property
    def ndim(self) -> int:
        return 3

    @property
    def unpadded_values(self) -> jax.Array:
        """values with each row cut back to K where it is padded (module docstring, Row pitch)."""
        return self.values if self.k is None else self.values[:, :, : self.k]

    @property
    def element_dtype(self) -> jnp.dtype:
        """The stored values' element type (float8_e4m3fn or float4_e2m1fn): the dtype key of
        the quantised gmm's tuning-table entries."""
        return jnp.dtype(jnp.float4_e2m1fn if self.fmt == "mxfp4" else jnp.float8_e4m3fn)

    def __getitem__(self, index):
        # `variable[...]` of an `nnx.Param` holding this weight (the `MoE` layer reads its
        # parameters so); slicing the stored arrays has no meaning for the logical weight.
        if index is Ellipsis:
            return self
        raise TypeError("a QuantizedWeight supports only w[...]; dequantize() it to slice.")

    def astype(self, dtype) -> "QuantizedWeight":
        return dataclasses.replace(self, dtype=jnp.dtype(dtype))

    def dequantize(self, dtype=None) -> jax.Array:
        """The dense `[E, K, N]` weight in `dtype` (default the logical dtype), computed in
        float32 and rounded once."""
        return _dequantize(self, jnp.dtype(dtype or self.dtype))


def is_quantized(w) -> bool:
    return isinstance(w, QuantizedWeight)


def with_row_pitch(w: QuantizedWeight) -> QuantizedWeight:
    """w with its fp8 values' rows padded with zeros to a multiple of ROW_PITCH bytes and `k`
    set (module docstring, Row pitch); w unchanged where that would add more than
    PITCH_MAX_OVERHEAD of a row or, with FP8 activations, take the values past
    AS_LOADED_MAX_BYTES, where its rows are whole or padded already, or in "mxfp4"."""
    e, n, k = w.values.shape
    if w.fmt == "mxfp4" or w.k is not None or row_pitch(k) == k:
        return w
    if w.fp8_activations and not _pitch_keeps_offsets(e, n, k):
        return w
    values = jnp.pad(w.values, ((0, 0), (0, 0), (0, row_pitch(k) - k)))
    return dataclasses.replace(w, values=values, k=k)


def _pitch_keeps_offsets(e: int, n: int, k: int) -> bool:
    """Whether padding [e, n, k] fp8 values' rows leaves them on the same side of
    AS_LOADED_MAX_BYTES."""
    return e * n * row_pitch(k) <= AS_LOADED_MAX_BYTES or e * n * k > AS_LOADED_MAX_BYTES


def _with_fp8_activations(w: QuantizedWeight, enable: bool) -> QuantizedWeight:
    """w with `fp8_activations` set to enable, its rows padded or cut back as the setting wants
    (module docstring, Row pitch)."""
    w = dataclasses.replace(w, fp8_activations=enable)
    e, n, _ = w.values.shape
    if enable and w.k is not None and not _pitch_keeps_offsets(e, n, w.k):
        return dataclasses.replace(w, values=w.unpadded_values, k=None)
    return with_row_pitch(w)


def row_pitch(k: int) -> int:
    """The stored row length of fp8 values of K = k (module docstring, Row pitch)."""
    pitch = -(-k // ROW_PITCH) * ROW_PITCH
    return pitch if pitch - k <= PITCH_MAX_OVERHEAD * k else k


def with_scale_bound(w: QuantizedWeight) -> QuantizedWeight:
    """w with `small_scales` set from its scales where they are concrete ("mxfp4"; a device
    reduction and a host read); w unchanged under tracing or in another format."""
    if w.fmt != "mxfp4" or isinstance(w.scales, jax.core.Tracer) or w.scales.size == 0:
        return w
    return dataclasses.replace(w, small_scales=bool(jnp.max(w.scales) <= MX_SMALL_CODE))


def quantize_rows(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Activations x [M, K] -> (values float8_e4m3fn [M, K], scales float32 [M, ceil(K/128)]):
    per row and 128 values of K, scale = absmax / 448 (1 for a block of zeros) and values =
    x / scale rounded to nearest even, so x ≈ values · scale (module docstring, FP8
    activations). A NaN or infinite entry makes its row's products NaN."""
    m, k = x.shape
    kb = -(-k // FP8_BLOCK)
    xf = jnp.pad(x.astype(jnp.float32), ((0, 0), (0, kb * FP8_BLOCK - k)))
    blocks = xf.reshape(m, kb, FP8_BLOCK)
    scales = _safe_scale(jnp.max(jnp.abs(blocks), axis=2))
    values = jnp.clip(blocks / scales[:, :, None], -FP8_MAX, FP8_MAX).astype(jnp.float8_e4m3fn)
    return values.reshape(m, kb * FP8_BLOCK)[:, :k], scales


def dequantize_rows(values: jax.Array, scales: jax.Array, dtype) -> jax.Array:
    """`quantize_rows`' inverse: values · scales in float32, rounded once to dtype."""
    k = values.shape[1]
    s = jnp.repeat(scales, FP8_BLOCK, axis=1)[:, :k]
    return (values.astype(jnp.float32) * s).astype(dtype)


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def fp8_rows(x: jax.Array, dtype=None) -> jax.Array:
    """x through `quantize_rows` and back, in dtype (default x's; float32 holds every value
    exactly): the activations an FP8 product multiplies (the xla backend's form of it). Its
    derivative is the identity (straight through), as the Pallas backends' backward, which
    multiplies the upstream gradient by the weights alone."""
    return dequantize_rows(*quantize_rows(x), dtype or x.dtype)


@fp8_rows.defjvp
def _fp8_rows_jvp(dtype, primals, tangents):
    out = fp8_rows(primals[0], dtype)
    return out, tangents[0].astype(out.dtype)


def _check_fmt(fmt):
    if fmt not in FORMATS:
        raise ValueError(f"fmt={fmt!r} is not one of {FORMATS}.")


def _expand_blocks(scales, k, n):
    """[E, ceil(K/128), ceil(N/128)] block (or [E, ceil(K/128), N] column) scales -> [E, K, N]."""
    s = jnp.repeat(scales, FP8_BLOCK, axis=1)
    if s.shape[2] != n:
        s = jnp.repeat(s, FP8_BLOCK, axis=2)
    return s[:, :k, :n]


def mxfp4_codes(values):
    """uint8 [E, N, K/2] -> int32 e2m1 codes [E, K, N] (module layout)."""
    return jnp.swapaxes(jnp.concatenate(mxfp4_unpack(values), axis=2), 1, 2)


@functools.partial(jax.jit, static_argnames="dtype")
def _dequantize(qw: QuantizedWeight, dtype) -> jax.Array:
    if qw.fmt in ("fp8", "fp8_block"):
        values = jnp.swapaxes(qw.unpadded_values, 1, 2).astype(jnp.float32)  # [E, K, N]
        _, k, n = values.shape
        if qw.fmt == "fp8":
            w = values * qw.scales.astype(jnp.float32)[:, None, :]
        else:
            w = values * _expand_blocks(qw.scales.astype(jnp.float32), k, n)
        return w.astype(dtype)

    def one(values, scales):  # a chunk of experts: mxfp4's temporaries are 3x the output
        codes = mxfp4_codes(values[None])[0]
        exps = jnp.repeat(scales.astype(jnp.int32) - 127, MX_BLOCK, axis=0)
        return jnp.ldexp(jnp.asarray(E2M1)[codes], exps).astype(dtype)

    chunk = min(QUANTIZE_CHUNK, qw.values.shape[0])
    return jax.lax.map(lambda vs: one(*vs), (qw.values, qw.scales), batch_size=chunk)


def _e4m3(w, scale):
    """w / scale rounded to nearest even in e4m3, saturating at ±FP8_MAX."""
    return jnp.clip(w / scale, -FP8_MAX, FP8_MAX).astype(jnp.float8_e4m3fn)


def _fp8_values(w, scale):
    """[E, K, N] weights over their scales -> e4m3 values stored N-major, [E, N, row_pitch(K)]
    (zeros past K)."""
    k = w.shape[1]
    q = jnp.pad(_e4m3(w, scale), ((0, 0), (0, row_pitch(k) - k), (0, 0)))
    return jnp.swapaxes(q, 1, 2)


def _block_scales(w_e):
    """One expert's [K, N] float32 weight -> its "fp8_block" scales [ceil(K/128), ceil(N/128)]:
    each 128 x 128 block's absmax / FP8_MAX."""
    k, n = w_e.shape
    kb, nb = -(-k // FP8_BLOCK), -(-n // FP8_BLOCK)
    padded = jnp.pad(jnp.abs(w_e), ((0, kb * FP8_BLOCK - k), (0, nb * FP8_BLOCK - n)))
    return _safe_scale(padded.reshape(kb, FP8_BLOCK, nb, FP8_BLOCK).max(axis=(1, 3)))


def _safe_scale(absmax):
    return jnp.where(absmax > 0, absmax / FP8_MAX, 1.0).astype(jnp.float32)


def _e2m1_codes(v):
    """Round-to-nearest-even onto the e2m1 grid (saturating at 6) -> int32 codes."""
    a = jnp.abs(v)
    step = jnp.where(a < 2, 0.5, jnp.where(a < 4, 1.0, 2.0))
    q = jnp.minimum(jnp.round(a / step) * step, 6.0)
    mag = jnp.where(q <= 2, q * 2, jnp.where(q == 3, 5, jnp.where(q == 4, 6, 7))).astype(jnp.int32)
    return jnp.where((v < 0) & (mag > 0), mag | 8, mag)


def quantize_weight(w: jax.Array, fmt: str, name: str = "the weight") -> QuantizedWeight:
    """One dense `[E, K, N]` weight in `fmt` (module docstring's rules); logical dtype w's. name
    is what errors call it."""
    _check_fmt(fmt)
    w = jnp.asarray(w)
    if w.ndim != 3 or not jnp.issubdtype(w.dtype, jnp.floating):
        raise ValueError(
            f"quantize_experts needs floating [E, K, N] weights, got {w.dtype}{list(w.shape)}."
        )
    if not isinstance(w, jax.core.Tracer):
        _check_finite(w, name)
    if fmt == "mxfp4" and w.shape[1] % (2 * MX_BLOCK):
        raise ValueError(
            f"mxfp4 packs K values as two halves of 32-value blocks: K={w.shape[1]} must be a "
            "multiple of 64 (gpt-oss's 2880 is); use fmt='fp8' for this weight."
        )
    return with_scale_bound(_quantize(w, fmt))


def fp8_training_weight(w: jax.Array, transposed: bool = False) -> QuantizedWeight:
    """A dense `[E, K, N]` weight as "fp8_block" with FP8 activations, for `fused`'s FP8 training:
    w itself, or with `transposed` wᵀ `[E, N, K]` (the backward's products with wᵀ). One rule
    serves both: a 128 x 128 block of w is a block of wᵀ, so wᵀ holds the same e4m3 values and
    scales, stored in its own N-major order (its values in w's [E, K, N] order, the scales
    transposed), as the FP8 tensor cores take both operands K-major; w's is the weight
    `quantize_weight(w, "fp8_block")` gives. Under jit; an expert chunk at a time
    (`QUANTIZE_CHUNK`), each chunk written in its stored order, so a call holds one 1-byte copy
    of the weight."""

    def one(w_e):  # [K, N] -> its e4m3 values and [ceil(K/128), ceil(N/128)] scales, as stored
        wf = w_e.astype(jnp.float32)
        scales = _block_scales(wf)
        values = _e4m3(wf, _expand_blocks(scales[None], *wf.shape)[0])
        return (values, scales.T) if transposed else (values.T, scales)

    values, scales = jax.lax.map(one, w, batch_size=min(QUANTIZE_CHUNK, max(w.shape[0], 1)))
    qw = QuantizedWeight(values, scales, "fp8_block", w.dtype)
    return _with_fp8_activations(qw, True)


def fp8_training_weights(
    w: jax.Array, both: bool, kernel: bool
) -> tuple[QuantizedWeight, QuantizedWeight | None]:
    """(q(w), q(w)ᵀ or None): `fp8_training_weight(w)` and, with both, `fp8_training_weight(w,
    transposed=True)`. With kernel, `kernels.fp8_blocks` writes them (both from one read of w),
    rows zero-padded to the pitch FP8 activations keep (module docstring, Row pitch); where a
    row length is odd, or without kernel, the jnp rule above does (the "xla" backend's)."""
    e, k, n = w.shape
    pitch, pitch_t = (_activation_pitch(e, rows, length) for rows, length in ((n, k), (k, n)))
    if not kernel or pitch % 2 or (both and pitch_t % 2):
        return fp8_training_weight(w), fp8_training_weight(w, transposed=True) if both else None
    out = fp8_blocks(w, pitch, pitch_t if both else None)

    def stored(values, scales, length):
        return QuantizedWeight(
            values,
            scales,
            "fp8_block",
            w.dtype,
            fp8_activations=True,
            k=length if values.shape[2] != length else None,
        )

    return stored(out[0], out[1], k), stored(out[2], out[3], n) if both else None


def _activation_pitch(e: int, rows: int, length: int) -> int:
    """The row length of FP8-activation fp8 values [e, rows, length] as stored
    (`_with_fp8_activations`): padded to `row_pitch` where that keeps their offsets' side."""
    pitch = row_pitch(length)
    return pitch if pitch != length and _pitch_keeps_offsets(e, rows, length) else length


def _check_finite(w: jax.Array, name: str) -> None:
    """A ValueError if the concrete weight w holds a NaN or an infinity (module docstring)."""
    per_expert = np.asarray(non_finite_counts(w), np.int64)
    if per_expert.any():
        e = int(np.flatnonzero(per_expert)[0])
        k, n = (int(i) for i in _first_non_finite(w[e]))
        raise ValueError(
            f"{name} holds {int(per_expert.sum())} NaN or infinite value(s), the first at "
            f"[expert, k, n] = [{e}, {k}, {n}]; quantising would let it set the scale of its "
            "whole block and spoil the block's other values. Fix or mask those weights first."
        )


@jax.jit
def non_finite_counts(w):
    """Per expert, how many of w's values are NaN or infinite (one fused pass, no mask kept)."""
    return jnp.sum(~jnp.isfinite(w), axis=(1, 2), dtype=jnp.int32)


@jax.jit
def _first_non_finite(w_e):
    """(k, n) of one expert's first NaN or infinite value, row then column (each index under
    2^31, where a flat index over K·N might not be)."""
    k = jnp.argmax(jnp.any(~jnp.isfinite(w_e), axis=1))
    return k, jnp.argmin(jnp.isfinite(w_e[k]))


@functools.partial(jax.jit, static_argnames="fmt")
def _quantize(w, fmt):
    values, scales = jax.lax.map(
        functools.partial(_quantize_one, fmt=fmt), w, batch_size=min(QUANTIZE_CHUNK, w.shape[0])
    )
    k = w.shape[1]
    padded = fmt != "mxfp4" and row_pitch(k) != k  # (padded per expert, in `_quantize_one`)
    return QuantizedWeight(values, scales, fmt, w.dtype, k=k if padded else None)


def _quantize_one(w, fmt):
    """One expert's [K, N] weight -> its (values, scales) in `fmt`'s stored layout."""
    k, n = w.shape
    wf = w.astype(jnp.float32)[None]
    if fmt == "fp8":
        scales = _safe_scale(jnp.max(jnp.abs(wf), axis=1))
        return _fp8_values(wf, scales[:, None, :])[0], scales[0]
    if fmt == "fp8_block":
        scales = _block_scales(wf[0])
        return _fp8_values(wf, _expand_blocks(scales[None], k, n))[0], scales
    blocks = wf.reshape(k // MX_BLOCK, MX_BLOCK, n)
    absmax = jnp.max(jnp.abs(blocks), axis=1)
    _, exp = jnp.frexp(absmax)  # absmax = m · 2^exp, m in [0.5, 1): floor(log2) = exp - 1
    code = jnp.where(absmax > 0, jnp.clip(exp - 1 - 2 + 127, 0, 254), 0)
    scaled = jnp.ldexp(blocks, 127 - code[:, None, :]).reshape(k, n)
    codes = _e2m1_codes(scaled)
    packed = mxfp4_pack(codes[: k // 2].T, codes[k // 2 :].T)  # [N, K/2]
    return packed, code.astype(jnp.uint8)


def quantize_experts(params: Mapping, fmt: str, *, fp8_activations: bool = False) -> dict:
    """params with `w_gate_up` and `w_down` replaced by `QuantizedWeight`s of `fmt` ("fp8",
    "fp8_block", "mxfp4"); biases and other entries unchanged. fp8_activations ("fp8",
    "fp8_block"): their products also quantise the activations and run on the FP8 tensor cores
    (module docstring)."""
    _check_fmt(fmt)
    qparams = {
        name: quantize_weight(v, fmt, f"params[{name!r}]")
        if name in _WEIGHT_NAMES and v is not None
        else v
        for name, v in dict(params).items()
    }
    return use_fp8_activations(qparams) if fp8_activations else qparams


def use_fp8_activations(qparams: Mapping, enable: bool = True) -> dict:
    """qparams with every `QuantizedWeight`'s `fp8_activations` set to `enable` (e.g. on
    checkpoint weights from `load_experts(..., dequantize=False)`); to enable it each must be
    "fp8" or "fp8_block", and `w_gate_up` and `w_down` must be quantised (a ValueError names a
    dense one rather than leave its products in bf16). Rows are padded or cut back as the
    setting wants (module docstring, Row pitch): a copy of the values where that changes."""
    dense = [k for k in _WEIGHT_NAMES if k in qparams and not is_quantized(qparams[k])]
    if enable and dense:
        raise ValueError(
            f"fp8_activations needs quantised expert weights, but {dense} are dense: quantize "
            "them first (quantize_experts(params, 'fp8_block', fp8_activations=True)) or load "
            "them as stored (load_experts(..., dequantize=False))."
        )
    return {
        k: _with_fp8_activations(v, enable) if is_quantized(v) else v
        for k, v in dict(qparams).items()
    }


def dequantize_experts(qparams: Mapping, dtype=None) -> dict:
    """The inverse of `quantize_experts`: every `QuantizedWeight` decoded exactly (float32 math,
    one rounding) to `dtype` (default its logical dtype), other entries unchanged."""
    return {k: v.dequantize(dtype) if is_quantized(v) else v for k, v in dict(qparams).items()}


@jax.custom_jvp
def _no_weight_grad(values):
    return values


@_no_weight_grad.defjvp
def _no_weight_grad_jvp(primals, tangents):
    raise TypeError(
        "gradients with respect to quantised expert weights (QuantizedWeight) are not defined: "
        "differentiate with respect to x and the routing weights only, or train on "
        "moe_pallas.dequantize_experts(params) first."
    )


def guard_gradients(w):
    """w, with a clear TypeError if a transformation differentiates a QuantizedWeight's floating
    values (integer "mxfp4" leaves are refused by jax.grad itself); dense weights pass."""
    if not is_quantized(w) or not jnp.issubdtype(w.values.dtype, jnp.floating):
        return w
    return dataclasses.replace(w, values=_no_weight_grad(w.values))
