"""Probe (history only): registers, stack and local-memory instructions in the K loop of
gmm_quant per (format, GLU or plain with bias and row scale, tile), compiled offline for sm_90 by
upstream Triton 3.6 (benchmarks.sass's path), to find the tiles that spill:

    python -m benchmarks.probe_spills FMT,ACT,BM,BN,BK,WARPS,STAGES ...
    (ACT: gptoss or none; e.g. mxfp4,gptoss,128,128,64,8,4)
"""

import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import triton
from jax._src.pallas.triton import pallas_call_registration
from jax.sharding import AbstractDevice, AbstractMesh

from benchmarks import sass
from moe_pallas import quant
from moe_pallas.kernels.config import BlockConfig
from moe_pallas.kernels.gmm_quant import gmm_quant

B = Path(triton.__file__).parent / "backends/nvidia/bin"
sds = jax.ShapeDtypeStruct


def one(fmt, act, bm, bn, bk, warps, stages, k=2880, n=2880):
    cfg = BlockConfig(
        block_m=bm,
        block_n=bn,
        block_k=bk,
        group_m=8,
        num_warps=warps,
        num_stages=stages,
        min_block_m=None,
        tail_m=0,
    )
    e, m = 16, 4096
    nw = 2 * n if act != "none" else n
    stored = quant.quantize_weight(jnp.zeros((1, k, nw), jnp.bfloat16), fmt)
    w = jax.tree.map(lambda a: sds((e, *a.shape[1:]), a.dtype), stored)
    args = (
        sds((m, k), jnp.bfloat16),
        sds((e,), jnp.int32),
        w,
        sds((m,), jnp.int32),
        sds((e, nw), jnp.float32),
        sds((m,), jnp.float32),
    )

    def fn(lhs, sizes, w, perm, bias, rs):
        if act == "none":
            return gmm_quant(lhs, w, sizes, bias=bias, row_scale=rs, config=cfg)
        return gmm_quant(lhs, w, sizes, lhs_row_index=perm, config=cfg, activation=act, bias=bias)

    modules = []
    lower = pallas_call_registration.lowering.lower_jaxpr_to_triton_module

    def capture(*a, **kw):
        r = lower(*a, **kw)
        modules.append(r.module.operation.get_asm(enable_debug_info=False))
        return r

    pallas_call_registration.lowering.lower_jaxpr_to_triton_module = capture
    h200 = AbstractMesh((1,), ("x",), abstract_device=AbstractDevice("NVIDIA H200", 132, "gpu"))
    try:
        with jax.sharding.use_abstract_mesh(h200):
            jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
    finally:
        pallas_call_registration.lowering.lower_jaxpr_to_triton_module = lower
    keep = Path(f"/tmp/probe_spills/{fmt}_{act}_{bm}x{bn}x{bk}_w{warps}_s{stages}")
    s = sass.compile_sass(modules[-1], warps, stages, keep)
    c = sass.loop_mix(s)
    ru = subprocess.run(
        [str(B / "cuobjdump"), "--dump-resource-usage", str(keep / "kernel.cubin")],
        capture_output=True,
        text=True,
    ).stdout
    ru = [l.strip() for l in ru.splitlines() if "REG" in l][0].split()[:3]
    loc = sum(v for kk, v in c.items() if kk.startswith(("STL", "LDL")))
    print(
        f"{fmt:9s} {act:6s} {bm}x{bn}x{bk} w{warps} s{stages}: loop {sum(c.values())} local-in-loop {loc} {' '.join(ru)}",
        flush=True,
    )


for spec in sys.argv[1:]:
    f, a, bm, bn, bk, w, s = spec.split(",")
    try:
        one(f, a, int(bm), int(bn), int(bk), int(w), int(s))
    except Exception as ex:
        print(spec, "ERR", str(ex)[:200])
