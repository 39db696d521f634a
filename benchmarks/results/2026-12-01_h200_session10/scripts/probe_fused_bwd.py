"""Probe: the backward's dx matmul (gmm_t: dx = dh @ w[e]ᵀ) and weight gradient (tgmm:
dw[e] = x_eᵀ @ dh_e) fused at tile level, for groups of exactly `rows` rows (no masking of rows).
Program (k-tile, expert): x_e[:, k-tile] held; loop over n-tiles: load dh_e[:, n-tile] once for
both products, load w[e][k-tile, n-tile], store dw tile, accumulate dx[:, k-tile].
Against our tgmm + gmm_t on the same inputs (equal and uniform group sizes)."""

import functools
import importlib
import itertools
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from probe_common import fused_dw_dx_loop, record
from moe_pallas import _backend, dispatch

gmm_mod = importlib.import_module("moe_pallas.kernels.gmm")
tgmm_mod = importlib.import_module("moe_pallas.kernels.tgmm")


def _kernel(x_ref, dh_ref, w_ref, dw_ref, dx_ref, *, rows, bk, bn, k_dim, n_dim):
    kt, e = pl.program_id(0), pl.program_id(1)
    r0, k0 = e * rows, kt * bk
    kmask = (k0 + jnp.arange(bk, dtype=jnp.int32)) < k_dim
    x = plgpu.load(x_ref.at[pl.ds(r0, rows), pl.ds(k0, bk)], mask=kmask[None, :], other=0)

    dx = fused_dw_dx_loop(
        x, dh_ref, w_ref, dw_ref, e=e, r0=r0, rows=rows, k0=k0, kmask=kmask, bn=bn, n_dim=n_dim
    )
    plgpu.store(
        dx_ref.at[pl.ds(r0, rows), pl.ds(k0, bk)], dx.astype(dx_ref.dtype), mask=kmask[None, :]
    )


def fused(x, dh, w, *, rows, bk, bn, warps, stages):
    e, k_dim, n_dim = w.shape
    assert n_dim % bn == 0 and x.shape[0] == e * rows
    kern = functools.partial(_kernel, rows=rows, bk=bk, bn=bn, k_dim=k_dim, n_dim=n_dim)
    return pl.pallas_call(
        kern,
        out_shape=(
            jax.ShapeDtypeStruct(w.shape, w.dtype),
            jax.ShapeDtypeStruct(x.shape, x.dtype),
        ),
        grid=(pl.cdiv(k_dim, bk), e),
        compiler_params=plgpu.CompilerParams(num_warps=warps, num_stages=stages),
        interpret=_backend.interpret_mode(),
        name="fused_bwd",
    )(x, dh, w)


def main():
    small = "--small" in sys.argv
    shapes = (
        {"gu": (128, 64, 2880, 5760), "down": (128, 64, 2880, 2880), "gu_T4096": (128, 128, 2880, 5760)}
        if not small
        else {"tiny": (4, 16, 80, 256)}
    )
    configs = (
        [(64, 128, 4, 3), (64, 128, 8, 3), (128, 128, 8, 3), (128, 64, 4, 3), (64, 64, 4, 4),
         (128, 128, 8, 2), (64, 128, 4, 2)]
        if not small
        else [(32, 64, 4, 2)]
    )
    out = []
    for name, (e, rows, k_dim, n_dim) in shapes.items():
        m = e * rows
        k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
        x = jax.random.normal(k1, (m, k_dim), jnp.bfloat16)
        dh = jax.random.normal(k2, (m, n_dim), jnp.bfloat16)
        w = (jax.random.normal(k3, (e, k_dim, n_dim), jnp.bfloat16) * 0.05).astype(jnp.bfloat16)
        sizes = jnp.full((e,), rows, jnp.int32)
        dw_ref = tgmm_mod.tgmm(x, dh, sizes)
        dx_ref = gmm_mod.gmm(dh, w, sizes, transpose_rhs=True)

        rec = functools.partial(record, out, name)

        if not small:
            rec("tgmm", lambda a, b, g: tgmm_mod.tgmm(a, b, g), x, dh, sizes)
            rec("gmm_t", lambda a, b, g: gmm_mod.gmm(a, b, g, transpose_rhs=True), dh, w, sizes)
            rec(
                "tgmm+gmm_t",
                lambda a, b, c, g: (
                    tgmm_mod.tgmm(a, b, g),
                    gmm_mod.gmm(b, c, g, transpose_rhs=True),
                )[0],
                x, dh, w, sizes,
            )
        for bk, bn, warps, stages in configs:
            f = functools.partial(fused, rows=rows, bk=bk, bn=bn, warps=warps, stages=stages)
            try:
                dw, dx = f(x, dh, w)
                err_w = float(jnp.max(jnp.abs(dw.astype(jnp.float32) - dw_ref.astype(jnp.float32))))
                err_x = float(jnp.max(jnp.abs(dx.astype(jnp.float32) - dx_ref.astype(jnp.float32))))
                print(json.dumps(dict(shape=name, cfg=[bk, bn, warps, stages], err_w=err_w,
                                      err_x=err_x, scale_w=float(jnp.max(jnp.abs(dw_ref.astype(jnp.float32)))))), flush=True)
            except Exception as ex:  # noqa: BLE001
                print("error", bk, bn, warps, stages, type(ex).__name__, str(ex)[:300], flush=True)
                continue
            if not small:
                rec(f"fused_{bk}_{bn}_{warps}w_{stages}s", lambda a, b, c: f(a, b, c)[0], x, dh, w)
    json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "fused_bwd.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
