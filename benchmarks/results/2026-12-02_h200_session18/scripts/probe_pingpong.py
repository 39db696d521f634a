"""The ping-pong slab matmul (slab_pingpong.py) against cuBLAS (the layer's weight gradients today)
and session 13's one-warpgroup kernel (slab_mgpu.py) on the same slabs, train-step shapes at T =
2048 (and gpt-oss T = 4096), bf16 out, alternating rounds. Run by call1.sh (its PYTHONPATH has this
folder, session 13's slab_mgpu.py and session 11's probe_common.py)."""
import json
import os

import jax
import jax.numpy as jnp

from probe_common import wall_time
from slab_mgpu import Cfg, slabmm_mgpu
from slab_pingpong import PPCfg, slabmm_pingpong
from moe_pallas.kernels import slab as _slab
from moe_pallas.kernels.tgmm_padded import capacity

CASES = {  # name: (G, M, K, N, session-13 configs, ping-pong configs (bk, bn, stages, strips, ob))
    "gptoss_gate_up_2048": (128, 8192, 2880, 5760, ["64,192,3,1,2"],
                            ["64,128,4,2,2", "64,192,4,2,1", "64,128,2,2,2", "64,192,2,2,1"]),
    "gptoss_down_2048": (128, 8192, 2880, 2880, ["64,192,3,1,2"],
                         ["64,192,4,2,1", "64,192,2,2,1", "64,64,4,2,2"]),
    "swiglu_gate_up_2048": (256, 16384, 4096, 4096, ["128,128,3,1,2"],
                            ["64,128,4,2,2", "64,256,2,2,1", "64,128,2,2,2"]),
    "swiglu_down_2048": (256, 16384, 2048, 4096, ["128,128,3,1,2"],
                         ["64,128,4,2,2", "64,256,2,2,1"]),
    "gptoss_gate_up_4096": (128, 16384, 2880, 5760, ["64,192,3,1,1"],
                            ["64,128,2,2,2", "64,128,4,2,1"]),
}
dims = (((1,), (1,)), ((0,), (0,)))
cublas = lambda a, b: jax.lax.dot_general(a, b, dims, preferred_element_type=jnp.bfloat16)
rows = []
for name, (g, m, k, n, v1_cfgs, pp_cfgs) in CASES.items():
    cap = capacity(m, g)
    cap64 = -(-cap // 64) * 64
    keys = jax.random.split(jax.random.key(7), 3)
    ids = jax.random.randint(keys[0], (m,), 0, g)
    sizes = jnp.bincount(ids, length=g).astype(jnp.int32)
    offs = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(sizes).astype(jnp.int32)])
    lr = jax.random.normal(keys[1], (m, k), jnp.bfloat16)
    rr = jax.random.normal(keys[2], (m, n), jnp.bfloat16)
    slabs = {c: (_slab.slab(lr, offs, c), _slab.slab(rr, offs, c)) for c in {cap, cap64}}
    ref = jax.jit(cublas)(*slabs[cap]).astype(jnp.float32)
    variants = {f"cublas C={cap}": (cublas, slabs[cap]), f"cublas C={cap64}": (cublas, slabs[cap64])}
    for c in v1_cfgs:
        cfg = Cfg(*map(int, c.split(",")))
        variants[f"v1 {c} C={cap64}"] = (lambda a, b, cfg=cfg: slabmm_mgpu(a, b, cfg), slabs[cap64])
    for c in pp_cfgs:
        cfg = PPCfg(*map(int, c.split(",")))
        variants[f"pp {c} C={cap64}"] = (lambda a, b, cfg=cfg: slabmm_pingpong(a, b, cfg), slabs[cap64])
    bad = set()
    for r in range(3):
        for label, (fn, args) in variants.items():
            if label in bad:
                continue
            row = dict(shape=name, impl=label, round=r)
            try:
                if r == 0:
                    out = jax.jit(fn)(*args).astype(jnp.float32)
                    row["rel_err"] = float(jnp.linalg.norm(out - ref) / jnp.linalg.norm(ref))
                    row["same"] = bool(jnp.array_equal(out, ref))
                    del out
                ms = wall_time(fn, *args) * 1e3
                row.update(ms=round(ms, 4), out_tbs=round(g * k * n * 2 / ms / 1e9, 3))
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {str(e)[-300:]}"
                bad.add(label)
            print(json.dumps(row), flush=True)
            rows.append(row)
    del slabs, ref, lr, rr
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "pingpong.json"), "w"), indent=1)

# Table: median of the rounds per (shape, impl).
print("\n| shape | impl | median ms | TB/s | rel err |")
print("|---|---|---|---|---|")
for name in CASES:
    labels = dict.fromkeys(r["impl"] for r in rows if r["shape"] == name)
    for label in labels:
        rs = [r for r in rows if r["shape"] == name and r["impl"] == label]
        ms = sorted(r["ms"] for r in rs if "ms" in r)
        err = next((r.get("rel_err") for r in rs if "rel_err" in r), None)
        if ms:
            med = ms[len(ms) // 2]
            g, m, k, n = CASES[name][:4]
            print(f"| {name} | {label} | {med:.3f} | {g * k * n * 2 / med / 1e9:.2f} | {err} |")
        else:
            print(f"| {name} | {label} | error | | {rs[0].get('error', '')[:120]} |")
