"""Probe: what an FP8 x FP8 dot costs in Pallas Triton's K loop (offline SASS for sm_90).

Pallas's Triton lowering emits tt.dot without max_num_imprecise_acc (attribute default 0), so an
fp8 x fp8 dot with a float32 accumulator takes Triton's partial-accumulator path: every wgmma
instruction (k = 32) accumulates into a zeroed partial that is waited on and added in float32.
Variants: 'promote' (the DeepSeek-V3 recipe: per 128-K step d = dot(xq, wq^T), acc += d * sx *
sw), 'plain' (acc += dot, no scales), against the bf16 tile of the same shape.
"""

import argparse, collections, sys, tempfile
from pathlib import Path
import jax, jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu
from jax._src.pallas.triton import pallas_call_registration
from jax.sharding import AbstractDevice, AbstractMesh
from benchmarks import sass

p = argparse.ArgumentParser()
p.add_argument("--bm", type=int, default=128)
p.add_argument("--bn", type=int, default=128)
p.add_argument("--bk", type=int, default=128)
p.add_argument("--warps", type=int, default=8)
p.add_argument("--stages", type=int, default=4)
p.add_argument("--variant", default="promote")
p.add_argument("--dtype", default="fp8")
p.add_argument("--imprecise", type=int, help="rewrite the dot's maxNumImpreciseAcc to this")
a = p.parse_args()
M = N = K = 4096
bm, bn, bk = a.bm, a.bn, a.bk


def kernel(x_ref, w_ref, sx_ref, sw_ref, o_ref):
    i, j = pl.program_id(0), pl.program_id(1)

    def body(kb, acc):
        if a.dtype == "fp8":
            xq = jax.lax.bitcast_convert_type(
                plgpu.load(x_ref.at[pl.ds(i * bm, bm), pl.ds(kb * bk, bk)]), jnp.float8_e4m3fn
            )
            wq = jax.lax.bitcast_convert_type(
                plgpu.load(w_ref.at[pl.ds(j * bn, bn), pl.ds(kb * bk, bk)]), jnp.float8_e4m3fn
            )
        elif a.dtype == "fp8direct":
            xq = plgpu.load(x_ref.at[pl.ds(i * bm, bm), pl.ds(kb * bk, bk)])
            wq = plgpu.load(w_ref.at[pl.ds(j * bn, bn), pl.ds(kb * bk, bk)])
        else:
            xq = plgpu.load(x_ref.at[pl.ds(i * bm, bm), pl.ds(kb * bk, bk)])
            wq = plgpu.load(w_ref.at[pl.ds(j * bn, bn), pl.ds(kb * bk, bk)])
        d = plgpu.dot(xq, wq, trans_b=True)
        if a.variant == "promote":
            sx = plgpu.load(sx_ref.at[pl.ds(i * bm, bm), kb])
            sw = plgpu.load(sw_ref.at[kb, j])
            return acc + d * (sx[:, None] * sw)
        return acc + d

    acc = jax.lax.fori_loop(0, K // bk, body, jnp.zeros((bm, bn), jnp.float32))
    o_ref[...] = acc.astype(o_ref.dtype)


sds = jax.ShapeDtypeStruct
el = {"fp8": jnp.uint8, "fp8direct": jnp.float8_e4m3fn}.get(a.dtype, jnp.bfloat16)
args = (
    sds((M, K), el),
    sds((N, K), el),
    sds((M, K // 128), jnp.float32),
    sds((K // 128, N // 128), jnp.float32),
)


def fn(x, w, sx, sw):
    return pl.pallas_call(
        kernel,
        out_shape=sds((M, N), jnp.bfloat16),
        grid=(M // bm, N // bn),
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
        compiler_params=plgpu.CompilerParams(num_warps=a.warps, num_stages=a.stages),
    )(x, w, sx, sw)


modules = []
lower = pallas_call_registration.lowering.lower_jaxpr_to_triton_module


def capture(*x, **kw):
    r = lower(*x, **kw)
    modules.append(r.module.operation.get_asm(enable_debug_info=False))
    return r


pallas_call_registration.lowering.lower_jaxpr_to_triton_module = capture
h200 = AbstractMesh((1,), ("x",), abstract_device=AbstractDevice("NVIDIA H200", 132, "gpu"))
with jax.sharding.use_abstract_mesh(h200):
    jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
keep = Path(tempfile.mkdtemp(prefix="fp8x8_"))
ttir = modules[-1]
if a.imprecise is not None:  # what Pallas cannot say: Triton's MMAv3 needs it >= 32 for fp8
    import re

    ttir = re.sub(
        r"(tt\.dot [^:]*inputPrecision = tf32)",
        r"\1 {maxNumImpreciseAcc = %d : i32}" % a.imprecise,
        ttir,
    )
counts = sass.loop_mix(sass.compile_sass(ttir, a.warps, a.stages, keep))
print(
    f"{a.dtype} {a.variant} imprecise={a.imprecise} {bm}x{bn}x{bk} w{a.warps}: {sum(counts.values())} instr/thread;",
    ", ".join(f"{op} {n}" for op, n in counts.most_common(14)),
    keep,
)
