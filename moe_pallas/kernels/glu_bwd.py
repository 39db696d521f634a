"""The backward's GLU pass: (dh, a, dw) from h, g and the routing weight, Pallas Triton lowering.

Math. Per expert-sorted row m, with (gate, up) the halves of h[m] in the activation's layout
(`moe_pallas.activations`) and g[m] = d out[token] @ w_down[e]ᵀ:
    a[m]  = glu(gate, up)
    dh[m] = merge(glu_bwd(gate, up, g[m] · row_weight[m]))
    dw[m] = Σ_i g[m, i] · a[m, i]        (the routing weight's gradient, before the bias term)
in float32; dh and a are rounded once to h's dtype. Rows past the routed ones have h = g = 0 and
give zeros.

Tiling. A 1-D grid over blocks of block_m rows; each program walks I in block_i column steps
(gpt-oss: one contiguous [block_m, 2·block_i] block of interleaved (gate, up) pairs; SwiGLU: the
gate and the up block), so h and g are read once and dh and a written once, and dw accumulates in
registers in a fixed column order (bitwise reproducible). XLA's fusions of the same math read h
and g several times (three kernels on the H200). Blocks are powers of 2 (Triton); block_i shrinks
to divide I where it can (2880 = 45 · 64), any I tail is masked; block_m halves (down to 8) while
the grid has fewer than 1024 programs, as the bytes in flight come from programs running at once
(8192 rows ran faster in 8-row blocks than in 16-row ones on the H200; from 16384 rows on 16 are
as fast as any).
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from moe_pallas.activations import glu, glu_bwd
from moe_pallas.kernels import _common

_MIN_PROGRAMS = 1024


def _glu_bwd_kernel(
    h_ref, g_ref, w_ref, dh_ref, a_ref, dw_ref, *, num_rows, inter, activation, bm, bi
):
    m0 = pl.program_id(0) * bm
    rows = pl.ds(m0, bm)
    row_ok = m0 + jnp.arange(bm, dtype=jnp.int32) < num_rows
    weight = plgpu.load(w_ref.at[rows], mask=row_ok, other=0.0)[:, None]

    def block_mask(cols, width):
        c_ok = None if inter % bi == 0 else cols < width
        mask = row_ok[:, None] if c_ok is None else row_ok[:, None] & c_ok[None, :]
        return jnp.broadcast_to(mask, (bm, cols.shape[0]))

    def body(step, dw):
        c0 = step * bi
        cols = c0 + jnp.arange(bi, dtype=jnp.int32)
        mask = block_mask(cols, inter)
        g = plgpu.load(g_ref.at[rows, pl.ds(c0, bi)], mask=mask, other=0.0)
        if activation == "gptoss":  # [bm, 2·bi] of (gate, up) pairs, split in registers
            pair_mask = block_mask(2 * c0 + jnp.arange(2 * bi, dtype=jnp.int32), 2 * inter)
            h = plgpu.load(h_ref.at[rows, pl.ds(2 * c0, 2 * bi)], mask=pair_mask, other=0)
            gate, up = jnp.unstack(h.astype(jnp.float32).reshape(bm, bi, 2), axis=-1)
        else:
            gate = plgpu.load(h_ref.at[rows, pl.ds(c0, bi)], mask=mask, other=0)
            up = plgpu.load(h_ref.at[rows, pl.ds(inter + c0, bi)], mask=mask, other=0)
            gate, up = gate.astype(jnp.float32), up.astype(jnp.float32)
        a = glu(gate, up, activation)
        d_gate, d_up = glu_bwd(gate, up, g * weight, activation)
        plgpu.store(a_ref.at[rows, pl.ds(c0, bi)], a.astype(a_ref.dtype), mask=mask)
        if activation == "gptoss":
            dh = jnp.stack([d_gate, d_up], axis=-1).reshape(bm, 2 * bi)
            plgpu.store(
                dh_ref.at[rows, pl.ds(2 * c0, 2 * bi)], dh.astype(dh_ref.dtype), mask=pair_mask
            )
        else:
            plgpu.store(dh_ref.at[rows, pl.ds(c0, bi)], d_gate.astype(dh_ref.dtype), mask=mask)
            plgpu.store(
                dh_ref.at[rows, pl.ds(inter + c0, bi)], d_up.astype(dh_ref.dtype), mask=mask
            )
        return dw + jnp.sum(g * a, axis=1)

    dw = jax.lax.fori_loop(0, jnp.int32(pl.cdiv(inter, bi)), body, jnp.zeros((bm,), jnp.float32))
    plgpu.store(dw_ref.at[rows], dw, mask=row_ok)


def glu_backward(
    h: jax.Array,
    g: jax.Array,
    row_weight: jax.Array,
    activation: str,
    *,
    block_m: int = 16,
    block_i: int = 128,
    num_warps: int = 4,
    num_stages: int = 3,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(dh `[M, 2I]` and a `[M, I]` in h's dtype, dw `[M]` float32) of the module docstring.

    h `[M, 2I]` (the gate_up projection, in the layout of `activation`); g `[M, I]`;
    row_weight `[M]`.
    """
    num_rows, width = h.shape
    inter = width // 2
    if activation not in ("swiglu", "gptoss") or width % 2:
        raise ValueError(f"glu_backward needs a GLU activation and an even h width; got {h.shape}.")
    if g.shape != (num_rows, inter) or row_weight.shape != (num_rows,):
        raise ValueError(
            f"g must be [{num_rows}, {inter}] and row_weight [{num_rows}]; got {g.shape}, "
            f"{row_weight.shape}."
        )
    out_shapes = (
        jax.ShapeDtypeStruct((num_rows, width), h.dtype),
        jax.ShapeDtypeStruct((num_rows, inter), h.dtype),
        jax.ShapeDtypeStruct((num_rows,), jnp.float32),
    )
    if num_rows == 0 or inter == 0:
        return tuple(jnp.zeros(s.shape, s.dtype) for s in out_shapes)
    bm = _common.pow2_block(block_m, num_rows)
    while bm > 8 and pl.cdiv(num_rows, bm) < _MIN_PROGRAMS:
        bm //= 2
    bi = _common.dividing_block(_common.pow2_block(block_i, inter), inter, 16)
    kernel = functools.partial(
        _glu_bwd_kernel, num_rows=num_rows, inter=inter, activation=activation, bm=bm, bi=bi
    )
    return pl.pallas_call(
        kernel,
        out_shape=out_shapes,
        grid=(pl.cdiv(num_rows, bm),),
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        interpret=_common.interpret_mode(),
        name="glu_bwd",
    )(h, g.astype(jnp.float32), row_weight.astype(jnp.float32))
