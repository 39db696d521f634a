"""How fast can a kernel write the weight gradient's [G, K, N] bf16 output on the H200 when it does
nothing else? A persistent Mosaic GPU kernel storing [block_k, block_n] tiles of a constant
(written to shared memory once) in the order of the slab matmuls (item = (group, n-strip), its
k-tiles in turn), asynchronous TMA stores from `buffers` slots; against XLA writing the same array
(a broadcast fill) and copying it (read + write). Run by call3.sh (its PYTHONPATH has this folder,
session 13's slab_mgpu.py and session 11's probe_common.py)."""
import functools
import json
import os

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from probe_common import wall_time
from moe_pallas.kernels.gmm_mgpu import num_sms


def store_tiles(seed, shape, bk, bn, buffers, order="strip"):
    g_dim, k_dim, n_dim = shape
    n_tiles, k_tiles = n_dim // bn, k_dim // bk
    num_ctas = num_sms()

    def kernel(seed_gmem, out_gmem, o_smem):
        cta = jax.lax.axis_index("sm")
        total_tiles = g_dim * n_tiles * k_tiles
        mine = jax.lax.div(total_tiles - cta + num_ctas - 1, num_ctas)
        value = seed_gmem[0]
        for b in range(buffers):
            o_smem[b] = jnp.full((bk, bn), value, o_smem.dtype)
        plgpu.commit_smem()

        def step(s, carry):
            if order == "strip":  # the slab matmuls': item (g, n-strip) per CTA, its k-tiles in turn
                i, ki = jax.lax.div(s, k_tiles), jax.lax.rem(s, k_tiles)
                p = cta + i * num_ctas
                g, ni = jax.lax.div(p, n_tiles), jax.lax.rem(p, n_tiles)
            else:  # "rows": consecutive CTAs write consecutive tiles of one row band
                t = cta + s * num_ctas
                g = jax.lax.div(t, k_tiles * n_tiles)
                r = jax.lax.rem(t, k_tiles * n_tiles)
                ki, ni = jax.lax.div(r, n_tiles), jax.lax.rem(r, n_tiles)
            plgpu.wait_smem_to_gmem(buffers - 1, wait_read_only=True)
            plgpu.copy_smem_to_gmem(
                o_smem.at[jax.lax.rem(s, buffers)],
                out_gmem.at[g, pl.ds(ki * bk, bk), pl.ds(ni * bn, bn)],
            )
            return carry

        jax.lax.fori_loop(0, mine, step, jnp.int32(0))
        plgpu.wait_smem_to_gmem(0)

    return plgpu.kernel(
        kernel,
        out_type=jax.ShapeDtypeStruct(shape, jnp.bfloat16),
        grid=(num_ctas,),
        grid_names=("sm",),
        scratch_types=[plgpu.SMEM((buffers, bk, bn), jnp.bfloat16)],
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
        kernel_name="store_tiles",
    )(seed)


SHAPES = {"gptoss_gate_up": (128, 2880, 5760), "swiglu_gate_up": (256, 4096, 4096)}
rows = []
seed = jnp.array([1.5], jnp.bfloat16)
for name, shape in SHAPES.items():
    nbytes = 2 * shape[0] * shape[1] * shape[2]
    src = jnp.full(shape, 2.0, jnp.bfloat16)
    variants = {
        "xla fill": lambda s: jnp.broadcast_to(s[0], shape).astype(jnp.bfloat16) + 0,
        "xla copy (read+write)": lambda s: src * s[0],
    }
    for bk, bn, buffers, order in [(64, 128, 2, "strip"), (64, 192, 2, "strip"), (64, 128, 4, "strip"),
                                   (64, 128, 2, "rows"), (64, 256, 2, "rows")]:
        if shape[2] % bn:
            continue
        variants[f"tma tiles {bk}x{bn} x{buffers} {order}"] = functools.partial(
            store_tiles, shape=shape, bk=bk, bn=bn, buffers=buffers, order=order)
    for label, fn in variants.items():
        row = dict(shape=name, impl=label)
        try:
            out = jax.jit(fn)(seed)
            want = 3.0 if "copy" in label else 1.5
            row["written"] = bool(jnp.all(out == want))
            del out
            ms = wall_time(fn, seed) * 1e3
            traffic = 2 * nbytes if "copy" in label else nbytes
            row.update(ms=round(ms, 4), tbs=round(traffic / ms / 1e9, 3))
        except Exception as e:  # noqa: BLE001
            row["error"] = f"{type(e).__name__}: {str(e)[-300:]}"
        print(json.dumps(row), flush=True)
        rows.append(row)
    del src
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "store.json"), "w"), indent=1)
