"""mxfp4's stored word layout: where a word of 4 stored bytes keeps its 8 e2m1 codes.

`quant`'s "mxfp4" values are uint8 [E, N, K/2]; bytes (n, r..r+3), r a multiple of 4, read as a
little-endian 32-bit word (byte i is bits 8i..8i+7), hold the codes of k = r..r+3 (the low half
of K, L0..L3) and k = K/2 + r..r+3 (the high half, H0..H3). `MX_WORD_BITS` names the bits of
each code's (sign, exponent 1, exponent 0, mantissa), chosen for `gmm_quant`'s decode, which
places each pair of codes into bf16x2 bits 15, 8, 7, 6 (+16): L0 L1 unshifted, L2 L3 shifted
left 3, H0 H1 left 6 (one shift and one and each; 0, 3 and 6 are the only three shifts whose
sources tile the word without overlap), H2 H3 from the 8 bits left over. Pure jnp, so `quant`
(quantise, dequantise, the checkpoint loader) and the kernel's interpret-mode decode share it.
"""

import jax.numpy as jnp

# (sign, exponent 1, exponent 0, mantissa) bit positions: the low half's L0..L3, the high half's
# H0..H3.
MX_WORD_BITS = (
    ((15, 8, 7, 6), (31, 24, 23, 22), (12, 5, 4, 3), (28, 21, 20, 19)),
    ((9, 2, 1, 0), (25, 18, 17, 16), (14, 13, 11, 10), (30, 29, 27, 26)),
)


def mxfp4_pack(lo, hi):
    """int codes [..., K/2] of the low (k < K/2) and high halves -> the stored uint8 [..., K/2]."""
    shape = lo.shape
    word = jnp.zeros((*shape[:-1], shape[-1] // 4), jnp.uint32)
    for half, codes in enumerate((lo, hi)):
        codes = codes.astype(jnp.uint32).reshape(*shape[:-1], -1, 4)
        for i, places in enumerate(MX_WORD_BITS[half]):
            for bit, place in zip((3, 2, 1, 0), places):
                word = word | (((codes[..., i] >> bit) & 1) << place)
    parts = [(word >> (8 * b)) & 0xFF for b in range(4)]
    return jnp.stack(parts, axis=-1).reshape(shape).astype(jnp.uint8)


def mxfp4_unpack(values):
    """The stored uint8 [..., K/2] -> int32 codes (low half, high half), each [..., K/2]."""
    v = values.astype(jnp.int32)
    shape = v.shape
    b = v.reshape(*shape[:-1], -1, 4)
    word = b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16) | (b[..., 3] << 24)
    halves = []
    for places_of in MX_WORD_BITS:
        codes = [
            sum(((word >> place) & 1) << bit for bit, place in zip((3, 2, 1, 0), places))
            for places in places_of
        ]
        halves.append(jnp.stack(codes, axis=-1).reshape(shape))
    return tuple(halves)
