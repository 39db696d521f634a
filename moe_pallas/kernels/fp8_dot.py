"""`fp8_dot`: an e4m3 x e4m3 product on Hopper's FP8 tensor cores, in a Pallas Triton kernel.

Math. out[m, n] = Σ_k a[m, k] · b[n, k] (b given N-major, as the quantised weights are stored),
float8_e4m3fn operands, a float32 result.

Why a primitive of its own. Pallas's Triton lowering (jax 0.11.2) emits `tt.dot` without
`max_num_imprecise_acc`, so the attribute keeps its default, 0, which asks for a float32 sum after
every tensor-core instruction; Triton refuses wgmma for fp8 operands under 32 (it cannot add
within the instruction) and falls back to mma.sync on float16 conversions of both operands
(offline SASS of a 128 x 128 x 128 tile at 8 warps: 192 F2FP conversions and 128 HMMA a thread
per K step, 487 instructions). This primitive's lowering says max_num_imprecise_acc = its K, so
one dot is a chain of fp8 wgmma (QGMMA) instructions whose partial sum stays in the tensor core
for the whole K of the call, and the caller adds the float32 partial sums of successive calls
(155 instructions a thread for the same tile with the caller's per-step scaling, 64 of them its
FFMA). The tensor core sums an fp8 chain with fewer bits than float32 (DeepSeek-V3 reports about
14), so callers keep a call's K at 128, where that recipe promotes to float32.

Off a GPU (interpret mode) it is a float32 dot of the exactly converted operands.
"""

import jax
import jax.numpy as jnp
from jax._src.lib.mlir import ir
from jax._src.lib.triton import dialect as tt_dialect
from jax._src.pallas.triton import lowering as triton_lowering
from jax.extend import core
from jax.interpreters import mlir

fp8_dot_p = core.Primitive("moe_pallas_fp8_dot")


def fp8_dot(a: jax.Array, b: jax.Array) -> jax.Array:
    """a [M, K] and b [N, K] float8_e4m3fn -> float32 [M, N] = a · bᵀ (module docstring)."""
    if a.dtype != jnp.float8_e4m3fn or b.dtype != jnp.float8_e4m3fn:
        raise TypeError(f"fp8_dot takes float8_e4m3fn operands, got {a.dtype} and {b.dtype}.")
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(f"fp8_dot needs a [M, K] and b [N, K], got {a.shape} and {b.shape}.")
    return fp8_dot_p.bind(a, b)


def _impl(a, b):
    return jax.lax.dot_general(
        a.astype(jnp.float32),
        b.astype(jnp.float32),
        (((1,), (1,)), ((), ())),
        precision=jax.lax.Precision.HIGHEST,
    )


fp8_dot_p.def_impl(_impl)
fp8_dot_p.def_abstract_eval(
    lambda a, b: jax.core.ShapedArray((a.shape[0], b.shape[0]), jnp.float32)
)
mlir.register_lowering(fp8_dot_p, mlir.lower_fun(_impl, multiple_results=False))


@triton_lowering.register_lowering(fp8_dot_p)
def _triton_lowering(ctx, a, b):
    del ctx
    m, k = ir.RankedTensorType(a.type).shape
    n = ir.RankedTensorType(b.type).shape[0]
    b_t = tt_dialect.trans(b, (1, 0))
    acc = triton_lowering._zeros(ir.RankedTensorType.get([m, n], ir.F32Type.get()))
    return tt_dialect.dot(a, b_t, acc, max_num_imprecise_acc=k)
