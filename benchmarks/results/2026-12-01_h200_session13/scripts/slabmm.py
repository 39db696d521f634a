"""Probe: batched slab matmul out[g] = lhs[g]^T @ rhs[g] in Triton (lhs [G,C,K], rhs [G,C,N]),
and a ragged variant reading sorted rows directly (static trip count over capacity)."""
import functools
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu


def _kernel(*refs, cap, bc, bm, bn, k_dim, n_dim, ragged, gather):
    it = iter(refs)
    offs_ref = next(it) if ragged else None
    idx_ref = next(it) if gather else None
    lhs_ref, rhs_ref, out_ref = next(it), next(it), next(it)
    nt = pl.cdiv(n_dim, bn)
    t, g = pl.program_id(0), pl.program_id(1)
    i, j = t // nt, t % nt
    ks = i * bm + jnp.arange(bm, dtype=jnp.int32)
    ns = j * bn + jnp.arange(bn, dtype=jnp.int32)
    kmask = (ks < k_dim)[None, :] if k_dim % bm else None
    nmask = (ns < n_dim)[None, :] if n_dim % bn else None
    if ragged:
        start = offs_ref[g]
        end = jnp.minimum(offs_ref[g + 1], start + cap)

    def body(c, acc):
        if ragged:
            rows = start + c * bc + jnp.arange(bc, dtype=jnp.int32)
            rok = (rows < end)[:, None]
            src = plgpu.load(idx_ref.at[rows], mask=rok[:, 0], other=0) if gather else rows
            am = rok if kmask is None else rok & kmask
            bmk = rok if nmask is None else rok & nmask
            a = plgpu.load(lhs_ref.at[src[:, None], ks[None, :]], mask=am, other=0)
            b = plgpu.load(rhs_ref.at[rows[:, None], ns[None, :]], mask=bmk, other=0)
        else:
            a = plgpu.load(lhs_ref.at[g, pl.ds(c * bc, bc), pl.ds(i * bm, bm)],
                           mask=None if kmask is None else jnp.broadcast_to(kmask, (bc, bm)), other=0)
            b = plgpu.load(rhs_ref.at[g, pl.ds(c * bc, bc), pl.ds(j * bn, bn)],
                           mask=None if nmask is None else jnp.broadcast_to(nmask, (bc, bn)), other=0)
        return acc + plgpu.dot(a, b, trans_a=True)

    acc = jax.lax.fori_loop(0, cap // bc, body, jnp.zeros((bm, bn), jnp.float32))
    m = None
    if kmask is not None or nmask is not None:
        m = jnp.broadcast_to((ks < k_dim)[:, None] & (ns < n_dim)[None, :], (bm, bn))
    plgpu.store(out_ref.at[g, pl.ds(i * bm, bm), pl.ds(j * bn, bn)], acc.astype(out_ref.dtype), mask=m)


def slabmm(lhs, rhs, *, bm=128, bn=128, bc=32, warps=4, stages=2, out_dtype=jnp.bfloat16):
    g, cap, k = lhs.shape
    n = rhs.shape[2]
    kern = functools.partial(_kernel, cap=cap, bc=bc, bm=bm, bn=bn, k_dim=k, n_dim=n,
                             ragged=False, gather=False)
    return pl.pallas_call(
        kern, out_shape=jax.ShapeDtypeStruct((g, k, n), out_dtype),
        grid=(pl.cdiv(k, bm) * pl.cdiv(n, bn), g),
        compiler_params=plgpu.CompilerParams(num_warps=warps, num_stages=stages),
        name="slabmm")(lhs, rhs)


def raggedmm(lhs, rhs, offsets, cap, row_index=None, *, bm=128, bn=128, bc=32, warps=4,
             stages=2, out_dtype=jnp.bfloat16):
    k, n = lhs.shape[1], rhs.shape[1]
    g = offsets.shape[0] - 1
    kern = functools.partial(_kernel, cap=cap, bc=bc, bm=bm, bn=bn, k_dim=k, n_dim=n,
                             ragged=True, gather=row_index is not None)
    ops = [offsets] + ([row_index] if row_index is not None else [])
    return pl.pallas_call(
        kern, out_shape=jax.ShapeDtypeStruct((g, k, n), out_dtype),
        grid=(pl.cdiv(k, bm) * pl.cdiv(n, bn), g),
        compiler_params=plgpu.CompilerParams(num_warps=warps, num_stages=stages),
        name="raggedmm")(*ops, lhs, rhs)
