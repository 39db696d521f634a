"""Probe 2: the fused dx + weight-gradient kernel of probe_fused_bwd.py on ragged groups (uniform
routing at gpt-oss / SwiGLU T = 2048: every group fits one block_m-row step, masked), lhs rows
gathered in the kernel (row_token) as the layer's tgmm does. Against tgmm + gmm_t on the same
inputs, each timed alone."""

import functools
import importlib
import json
import os
import sys

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from probe_common import fused_dw_dx_loop, record
from moe_pallas import _backend, dispatch

gmm_mod = importlib.import_module("moe_pallas.kernels.gmm")
tgmm_mod = importlib.import_module("moe_pallas.kernels.tgmm")


def _kernel(off_ref, idx_ref, x_ref, dh_ref, w_ref, dw_ref, dx_ref, *, bm, bk, bn, k_dim, n_dim):
    kt, e = pl.program_id(0), pl.program_id(1)
    start, end = off_ref[e], off_ref[e + 1]
    k0 = kt * bk
    ks = k0 + jnp.arange(bk, dtype=jnp.int32)
    kmask = ks < k_dim
    row_ok = (start + jnp.arange(bm, dtype=jnp.int32)) < end
    src = plgpu.load(idx_ref.at[pl.ds(start, bm)], mask=row_ok, other=0)
    x = plgpu.load(x_ref.at[src[:, None], ks[None, :]], mask=row_ok[:, None] & kmask[None, :], other=0)

    dx = fused_dw_dx_loop(
        x, dh_ref, w_ref, dw_ref, e=e, r0=start, rows=bm, k0=k0, kmask=kmask, bn=bn, n_dim=n_dim,
        row_ok=row_ok,
    )
    plgpu.store(
        dx_ref.at[pl.ds(start, bm), pl.ds(k0, bk)], dx.astype(dx_ref.dtype),
        mask=row_ok[:, None] & kmask[None, :],
    )


def fused(x, row_token, dh, w, offsets, *, bm, bk, bn, warps, stages):
    e, k_dim, n_dim = w.shape
    m = dh.shape[0]
    assert n_dim % bn == 0
    kern = functools.partial(_kernel, bm=bm, bk=bk, bn=bn, k_dim=k_dim, n_dim=n_dim)
    return pl.pallas_call(
        kern,
        out_shape=(
            jax.ShapeDtypeStruct(w.shape, w.dtype),
            jax.ShapeDtypeStruct((m, k_dim), x.dtype),
        ),
        grid=(pl.cdiv(k_dim, bk), e),
        compiler_params=plgpu.CompilerParams(num_warps=warps, num_stages=stages),
        interpret=_backend.interpret_mode(),
        name="fused_bwd",
    )(offsets, row_token, x, dh, w)


def main():
    small = "--small" in sys.argv
    # name: (T, k, E, H(K), N)
    shapes = (
        {"gptoss_gu": (2048, 4, 128, 2880, 5760), "swiglu_gu": (2048, 8, 256, 4096, 4096)}
        if not small else {"tiny": (24, 2, 4, 80, 256)}
    )
    configs = (
        [(128, 64, 128, 8, 3), (128, 64, 128, 4, 3), (128, 64, 64, 4, 4), (128, 64, 64, 8, 3),
         (128, 32, 128, 4, 3)]
        if not small else [(32, 32, 64, 4, 2)]
    )
    out = []
    for name, (t, top_k, e, k_dim, n_dim) in shapes.items():
        m = t * top_k
        k0, k1, k2, k3 = jax.random.split(jax.random.key(0), 4)
        idx = jnp.argsort(jax.random.uniform(k0, (t, e)), axis=1)[:, :top_k].astype(jnp.int32)
        d = dispatch.dispatch(idx, e)
        sizes = d.group_sizes
        offsets = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(sizes).astype(jnp.int32)])
        x = jax.random.normal(k1, (t, k_dim), jnp.bfloat16)
        dh = jax.random.normal(k2, (m, n_dim), jnp.bfloat16)
        w = (jax.random.normal(k3, (e, k_dim, n_dim), jnp.bfloat16) * 0.05).astype(jnp.bfloat16)
        print(name, "max group", int(sizes.max()), flush=True)
        dw_ref = tgmm_mod.tgmm(x, dh, sizes, lhs_row_index=d.row_token)
        dx_ref = gmm_mod.gmm(dh, w, sizes, transpose_rhs=True)

        rec = functools.partial(record, out, name)

        if not small:
            rec("tgmm", lambda a, b, g, r: tgmm_mod.tgmm(a, b, g, lhs_row_index=r), x, dh, sizes, d.row_token)
            rec("gmm_t", lambda a, b, g: gmm_mod.gmm(a, b, g, transpose_rhs=True), dh, w, sizes)
        for bm, bk, bn, warps, stages in configs:
            if int(sizes.max()) > bm:
                print("skip", bm, "max group exceeds"); continue
            f = functools.partial(fused, bm=bm, bk=bk, bn=bn, warps=warps, stages=stages)
            try:
                dw, dx = f(x, d.row_token, dh, w, offsets)
                err_w = float(jnp.max(jnp.abs(dw.astype(jnp.float32) - dw_ref.astype(jnp.float32))))
                err_x = float(jnp.max(jnp.abs(dx.astype(jnp.float32) - dx_ref.astype(jnp.float32))))
                print(json.dumps(dict(shape=name, cfg=[bm, bk, bn, warps, stages], err_w=err_w, err_x=err_x)), flush=True)
            except Exception as ex:  # noqa: BLE001
                print("error", bm, bk, bn, warps, stages, type(ex).__name__, str(ex)[:300], flush=True)
                continue
            if not small:
                rec(f"fused_{bm}_{bk}_{bn}_{warps}w_{stages}s", lambda *a: f(*a)[0], x, d.row_token, dh, w, offsets)
    json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "fused_bwd2.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
