"""Probe: can a Mosaic GPU kernel (Warpgroup semantics) pair adjacent accumulator columns, as
gpt-oss's interleaved GLU needs? Lowers a 64 x 128 wgmma tile for the H200 on CPU three ways:
contiguous halves, a reshape to [64, 64, 2], strided slices.

    python -m benchmarks.probe_glu_pairs halves|reshape|stride
"""
import functools, jax, jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu
from jax.sharding import AbstractDevice, AbstractMesh
H200 = AbstractMesh((1,), ("x",), abstract_device=AbstractDevice("NVIDIA H200", 132, "gpu"))
import sys
mode = sys.argv[1]

def kernel(a_gmem, b_gmem, o_gmem):
    def body(a_smem, b_smem, o_smem, bar):
        plgpu.copy_gmem_to_smem(a_gmem, a_smem, bar)
        plgpu.copy_gmem_to_smem(b_gmem, b_smem, bar)
        plgpu.barrier_wait(bar)
        def prod(acc_ref):
            plgpu.wgmma(acc_ref, a_smem, b_smem)
            plgpu.wgmma_wait(0)
            return acc_ref[...]
        acc = pl.run_scoped(prod, plgpu.ACC((64, 128)))
        if mode == "reshape":
            a3 = acc.reshape(64, 64, 2)
            out = a3[:, :, 0] * a3[:, :, 1]
        elif mode == "stride":
            out = acc[:, 0::2] * acc[:, 1::2]
        else:
            out = acc[:, :64] * acc[:, 64:]
        o_smem[...] = out.astype(o_smem.dtype)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(o_smem, o_gmem)
        plgpu.wait_smem_to_gmem(0)
    pl.run_scoped(body, plgpu.SMEM((64, 64), jnp.bfloat16), plgpu.SMEM((64, 128), jnp.bfloat16),
                  plgpu.SMEM((64, 64), jnp.bfloat16), plgpu.Barrier(num_arrivals=2))

f = plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((64, 64), jnp.bfloat16), grid=(1,), grid_names=("x",),
    compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup))
SDS = jax.ShapeDtypeStruct
try:
    with jax.sharding.use_abstract_mesh(H200):
        t = jax.jit(f).trace(SDS((64, 64), jnp.bfloat16), SDS((64, 128), jnp.bfloat16)).lower(lowering_platforms=("cuda",)).as_text()
    print(mode, "lowers", len(t))
except Exception as e:
    print(mode, "FAIL", type(e).__name__, str(e)[:600])
