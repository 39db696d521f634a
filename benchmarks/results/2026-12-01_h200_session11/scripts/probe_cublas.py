"""Weight gradients through cuBLAS on capacity-padded groups vs our Triton tgmm (the layer's calls,
with the bias sums). Padded: x_pad[g, c] = x[row_token[start_g + c]] (zero past the group),
dh_pad likewise, dW = einsum('gck,gcn->gkn') in bf16 out (f32 accumulation), d_b = dh_pad summed
over c. Uniform random top-k routing; C must cover the largest group here (probe only)."""

import importlib
import json
import os
import time

import jax
import jax.numpy as jnp

from moe_pallas import dispatch
from probe_common import wall_time

tg = importlib.import_module("moe_pallas.kernels.tgmm")
out = []


CASES = [  # name, T, k, E, K (lhs cols), N (dh cols), gather
    ("gptoss_dw_gate_up", 2048, 4, 128, 2880, 5760, True),
    ("gptoss_dw_down", 2048, 4, 128, 2880, 2880, False),
    ("gptoss_dw_gate_up", 4096, 4, 128, 2880, 5760, True),
    ("swiglu_dw_gate_up", 2048, 8, 256, 4096, 4096, True),
    ("swiglu_dw_down", 2048, 8, 256, 2048, 4096, False),
]


def rec(name, t, label, fn, *args, extra=None):
    try:
        t0 = time.perf_counter()
        s = wall_time(fn, *args)
        row = dict(shape=name, tokens=t, impl=label, ms=s * 1e3, wall=time.perf_counter() - t0, **(extra or {}))
    except Exception as ex:  # noqa: BLE001
        row = dict(shape=name, tokens=t, impl=label, error=f"{type(ex).__name__}: {str(ex)[:300]}")
    print(json.dumps(row), flush=True)
    out.append(row)


for name, t, k, e, kd, nd, gather in CASES:
    m = t * k
    k1, k2, k3 = jax.random.split(jax.random.key(t + nd), 3)
    idx = jnp.argsort(jax.random.uniform(k1, (t, e)), axis=1)[:, :k].astype(jnp.int32)
    d = dispatch.dispatch(idx, e)
    gs = d.group_sizes
    biggest = int(gs.max())
    x = jax.random.normal(k2, (t if gather else m, kd), jnp.bfloat16)
    dh = jax.random.normal(k3, (m, nd), jnp.bfloat16)
    rows = d.row_token if gather else None

    def triton(x, dh, gs, rows):
        return tg.tgmm(x, dh, gs, lhs_row_index=rows, out_dtype=jnp.bfloat16, rhs_sums=True)

    rec(name, t, "triton", triton, x, dh, gs, rows, extra=dict(max_group=biggest))
    ref = triton(x, dh, gs, rows)
    for cap in sorted({-(-biggest // 32) * 32, -(-biggest // 64) * 64, 2 * m // e}):
        if cap < biggest:
            continue

        def padded(x, dh, gs, rows, cap=cap):
            ends = jnp.cumsum(gs)
            starts = ends - gs
            c = jnp.arange(cap, dtype=jnp.int32)
            src = starts[:, None] + c[None, :]
            ok = c[None, :] < gs[:, None]
            src = jnp.where(ok, src, 0)
            xr = src if rows is None else rows[src]
            x_pad = jnp.where(ok[..., None], x[xr], 0)
            dh_pad = jnp.where(ok[..., None], dh[src], 0)
            dw = jnp.einsum("gck,gcn->gkn", x_pad, dh_pad, preferred_element_type=jnp.bfloat16)
            db = jnp.sum(dh_pad.astype(jnp.float32), axis=1)
            return dw, db

        try:
            o = padded(x, dh, gs, rows)
            err = float(jnp.max(jnp.abs(o[0].astype(jnp.float32) - ref[0].astype(jnp.float32))) / jnp.max(jnp.abs(ref[0].astype(jnp.float32))))
            errb = float(jnp.max(jnp.abs(o[1] - ref[1])) / jnp.max(jnp.abs(ref[1])))
        except Exception as ex:  # noqa: BLE001
            err = errb = str(ex)[:100]
        rec(name, t, f"cublas_cap{cap}", padded, x, dh, gs, rows, extra=dict(rel_dw=err, rel_db=errb))

        def einsum_only(x_pad, dh_pad):
            return (jnp.einsum("gck,gcn->gkn", x_pad, dh_pad, preferred_element_type=jnp.bfloat16),)

        xp = jax.random.normal(k2, (e, cap, kd), jnp.bfloat16)
        dp = jax.random.normal(k3, (e, cap, nd), jnp.bfloat16)
        rec(name, t, f"einsum_only_cap{cap}", einsum_only, xp, dp)
        del xp, dp
    del x, dh

json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "cublas.json"), "w"), indent=1)
