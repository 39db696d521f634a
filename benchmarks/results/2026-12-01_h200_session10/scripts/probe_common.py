"""The timing helper of the session-10 probes (run from the same folder)."""

import json

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from benchmarks.bench_gmm import time_op


def record(out, shape, label, fn, *args):
    """Time fn(*args) with bench_gmm.time_op, print the row as JSON and append it to out; an error
    is recorded as the row, not raised."""
    try:
        s = time_op(lambda c, *a: fn(*a), jnp.zeros((1,), jnp.float32), *args)
        row = {"shape": shape, "impl": label, "ms": s * 1e3}
    except Exception as ex:  # noqa: BLE001
        row = {"shape": shape, "impl": label, "error": f"{type(ex).__name__}: {str(ex)[:300]}"}
    print(json.dumps(row), flush=True)
    out.append(row)


def fused_dw_dx_loop(x, dh_ref, w_ref, dw_ref, *, e, r0, rows, k0, kmask, bn, n_dim, row_ok=None):
    """The fused probes' loop over n-tiles: each dh tile (rows r0.., masked by row_ok) is loaded
    once for dw[e][k-tile, n-tile] = xᵀ dh (stored) and dx += dh @ w[e][k-tile, n-tile]ᵀ (returned,
    [rows, bk] float32)."""

    def body(nt, dx_acc):
        n0 = nt * bn
        dh_tile = dh_ref.at[pl.ds(r0, rows), pl.ds(n0, bn)]
        if row_ok is None:
            dh = plgpu.load(dh_tile)
        else:
            dh = plgpu.load(dh_tile, mask=row_ok[:, None], other=0)
        w = plgpu.load(
            w_ref.at[e, pl.ds(k0, kmask.shape[0]), pl.ds(n0, bn)], mask=kmask[:, None], other=0
        )
        dw = plgpu.dot(x, dh, trans_a=True)
        plgpu.store(
            dw_ref.at[e, pl.ds(k0, kmask.shape[0]), pl.ds(n0, bn)],
            dw.astype(dw_ref.dtype),
            mask=kmask[:, None],
        )
        return dx_acc + plgpu.dot(dh, w, trans_b=True)

    return jax.lax.fori_loop(0, n_dim // bn, body, jnp.zeros((rows, kmask.shape[0]), jnp.float32))
