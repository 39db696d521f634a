"""Session 15, CPU only: the Triton IR Pallas hands to XLA for the plain gmm (gpt-oss down, T = 4096
shape class) at tail_m 0 / 16 / 32 / 64 (no bias) and 16 (bias), written to /tmp/ttir/*.ttir
(BlockConfig validation switched off: it refuses 16-row tails since 804279c)."""
import dataclasses, sys
import jax, jax.numpy as jnp
from jax.sharding import AbstractDevice, AbstractMesh
from jax._src.pallas.triton import lowering, pallas_call_registration as reg
from moe_pallas.kernels import config as C
from moe_pallas.kernels.gmm import gmm

H200 = AbstractMesh((1,), ("x",), abstract_device=AbstractDevice("NVIDIA H200", 132, "gpu"))
SDS = jax.ShapeDtypeStruct
captured = []
C.BlockConfig.__post_init__ = lambda self: None
orig = lowering.lower_jaxpr_to_triton_module
def wrap(*a, **k):
    r = orig(*a, **k)
    captured.append(r.module.operation.get_asm(enable_debug_info=False))
    return r
reg.lowering.lower_jaxpr_to_triton_module = wrap

for tail, bias in [(0, False), (16, False), (32, False), (64, False), (16, True)]:
    e, kd, nd, m = 128, 2880, 2880, 16384
    cfg = C.pick("gmm", m, e, kd, nd); object.__setattr__(cfg, "tail_m", tail)
    def f(lhs, w, s, b, r):
        return gmm(lhs, w, s, bias=b, row_scale=r, config=cfg)
    args = (SDS((m, kd), jnp.bfloat16), SDS((e, kd, nd), jnp.bfloat16), SDS((e,), jnp.int32),
            SDS((e, nd), jnp.bfloat16) if bias else None, SDS((m,), jnp.float32))
    captured.clear()
    with jax.sharding.use_abstract_mesh(H200):
        jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",))
    name = f"/tmp/ttir/gmm_tail{tail}{'_bias' if bias else ''}.ttir"
    open(name, "w").write(captured[-1])
    print(name, len(captured[-1]), cfg)
