"""Probe: a persistent Triton gmm (grid = P programs, each walking its (visit, n-tile) items in
ONE flat loop over (item, k-step) pairs, so loads of the next item are in flight during this
item's last steps and store; no per-program prologue bubble) against the committed gmm, plain
(down projection: no gather, no GLU), memory-bound shapes."""
import functools, importlib, json, os, sys
import jax, jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu
from probe_common import record
from moe_pallas import _backend, dispatch

gmm_mod = importlib.import_module("moe_pallas.kernels.gmm")


def _kernel(nused_ref, group_ref, m_start_ref, row_end_ref, lhs_ref, rhs_ref, out_ref, *,
            P, bm, bn, bk, k_dim, n_out, group_m, num_groups):
    pid = pl.program_id(0)
    n_tiles = pl.cdiv(n_out, bn)
    nv = nused_ref[0]
    total = nv * n_tiles
    count = jnp.maximum(total - pid + P - 1, 0) // P
    ksteps = pl.cdiv(k_dim, bk)
    band = group_m * n_tiles

    def body(it, acc):
        j = jax.lax.div(it, ksteps)
        i = it - j * ksteps
        q = pid + j * P
        first_v = jax.lax.div(q, band) * group_m
        band_rows = jnp.minimum(nv - first_v, group_m)
        v = first_v + jax.lax.rem(jax.lax.rem(q, band), band_rows)
        n0 = jax.lax.div(jax.lax.rem(q, band), band_rows) * bn
        g = group_ref[v]
        m0 = m_start_ref[v]
        r_end = row_end_ref[v]
        row_ok = (m0 + jnp.arange(bm, dtype=jnp.int32)) < r_end
        real = g < num_groups
        k0 = i * bk
        ks = k0 + jnp.arange(bk, dtype=jnp.int32)
        ns = n0 + jnp.arange(bn, dtype=jnp.int32)
        kmask, nmask = ks < k_dim, ns < n_out
        a = plgpu.load(lhs_ref.at[pl.ds(m0, bm), pl.ds(k0, bk)],
                       mask=(row_ok & real)[:, None] & kmask[None, :], other=0)
        b = plgpu.load(rhs_ref.at[jnp.minimum(g, num_groups - 1), pl.ds(k0, bk), pl.ds(n0, bn)],
                       mask=kmask[:, None] & nmask[None, :], other=0)
        acc = jnp.where(i == 0, 0.0, acc) + plgpu.dot(a, b)

        @pl.when(i == ksteps - 1)
        def _():
            plgpu.store(out_ref.at[pl.ds(m0, bm), pl.ds(n0, bn)], acc.astype(out_ref.dtype),
                        mask=row_ok[:, None] & nmask[None, :])
        return acc

    jax.lax.fori_loop(0, count * ksteps, body, jnp.zeros((bm, bn), jnp.float32))


def pgmm(lhs, rhs, sizes, *, bm, bn, bk, warps, stages, P, group_m=8):
    m = lhs.shape[0]
    g_, k_dim, n_out = rhs.shape
    sched = dispatch.tile_schedule(sizes, m, bm)
    nused = jnp.sum((sched.row_start < sched.row_end).astype(jnp.int32))[None]
    kern = functools.partial(_kernel, P=P, bm=bm, bn=bn, bk=bk, k_dim=k_dim, n_out=n_out,
                             group_m=group_m, num_groups=g_)
    return pl.pallas_call(
        kern, out_shape=jax.ShapeDtypeStruct((m, n_out), lhs.dtype), grid=(P,),
        compiler_params=plgpu.CompilerParams(num_warps=warps, num_stages=stages),
        interpret=_backend.interpret_mode(), name="pgmm",
    )(nused, sched.group, sched.m_start, sched.row_end, lhs, rhs)


def main():
    small = "--small" in sys.argv
    shapes = ({"gptoss_down_2048": (2048, 4, 128, 2880, 2880), "swiglu_down_2048": (2048, 8, 256, 2048, 4096),
               "gptoss_down_4096": (4096, 4, 128, 2880, 2880)}
              if not small else {"tiny": (24, 2, 4, 80, 96)})
    configs = ([(128, 256, 64, 8, 4, 132), (128, 256, 64, 8, 3, 132), (64, 256, 64, 4, 4, 132),
                (64, 256, 64, 4, 3, 264), (128, 128, 64, 4, 4, 132), (64, 128, 64, 4, 4, 264),
                (128, 256, 64, 8, 4, 264)]
               if not small else [(16, 32, 32, 4, 2, 3)])
    out = []
    for name, (t, top_k, e, k_dim, n_dim) in shapes.items():
        m = t * top_k
        k0, k1, k2 = jax.random.split(jax.random.key(0), 3)
        idx = jnp.argsort(jax.random.uniform(k0, (t, e)), axis=1)[:, :top_k].astype(jnp.int32)
        sizes = dispatch.dispatch(idx, e).group_sizes
        if small:
            sizes = sizes.at[1].set(0)
            m = int(sizes.sum()) + 5
        lhs = jax.random.normal(k1, (m, k_dim), jnp.bfloat16)
        rhs = (jax.random.normal(k2, (e, k_dim, n_dim), jnp.bfloat16) * 0.05).astype(jnp.bfloat16)
        ref = gmm_mod.gmm(lhs, rhs, sizes)

        rec = functools.partial(record, out, name)

        if not small:
            rec("gmm", lambda a, b, g: gmm_mod.gmm(a, b, g), lhs, rhs, sizes)
        for c in configs:
            bm, bn, bk, warps, stages, P = c
            f = functools.partial(pgmm, bm=bm, bn=bn, bk=bk, warps=warps, stages=stages, P=P)
            try:
                o = f(lhs, rhs, sizes)
                err = float(jnp.max(jnp.abs(o.astype(jnp.float32) - ref.astype(jnp.float32))))
                print(json.dumps(dict(shape=name, cfg=c, maxabs=err)), flush=True)
            except Exception as ex:  # noqa: BLE001
                print("error", c, type(ex).__name__, str(ex)[:300], flush=True)
                continue
            if not small:
                rec(f"pgmm_{'_'.join(map(str, c))}", f, lhs, rhs, sizes)
    json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "persist.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
