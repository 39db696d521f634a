"""Probe (history only): where the compute-bound grouped matmul loses to cuBLAS, at 65536 rows.

For each projection: the Mosaic GPU gmm at several configs and the Triton gmm, on routed groups
(uniform top-k ids) and on equal groups (M / E rows each, a multiple of the tile height: no
boundary waste), beside jax's dense Hopper example over all rows and XLA's batched dot over equal
groups. TFLOP/s on 2·M·K·N, bf16 in and out. Equal groups minus routed = the boundary waste;
dense minus equal = what the grouped kernel itself costs.

    python -m benchmarks.probe_gmm_waste OUT.json   [PROBE_MATMULS=gptoss_gate_up,... PROBE_SECONDS]
"""

import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu as hm

import moe_pallas
from moe_pallas import dispatch
from moe_pallas.kernels import gmm_mgpu

MATMULS = {  # name: (E, K, N, top_k, dense configs (tile_m, tile_n, wg dim))
    "gptoss_gate_up": (128, 2880, 5760, 4, [(128, 192, "M"), (128, 128, "M")]),
    "gptoss_down": (128, 2880, 2880, 4, [(128, 192, "M"), (128, 64, "M")]),
    "swiglu_gate_up": (256, 4096, 4096, 8, [(128, 128, "M"), (128, 128, "N")]),
    "swiglu_down": (256, 2048, 4096, 8, [(128, 128, "M"), (128, 128, "N")]),
}
MOSAIC = {
    "m64x256": dict(block_m=64, block_n=256, consumers=2, split="m"),
    "m128x128": dict(block_m=128, block_n=128, consumers=2, split="m"),
    "n128x128": dict(block_m=128, block_n=128, consumers=2, split="n"),
    "m64x128": dict(block_m=64, block_n=128, consumers=2, split="m"),
}


def bench(fn, *args, samples=7):
    jax.block_until_ready(fn(*args))
    t = time.perf_counter()
    jax.block_until_ready(fn(*args))
    calls = max(2, min(100, int(0.05 / max(time.perf_counter() - t, 1e-6))))
    times = []
    for _ in range(samples):
        t = time.perf_counter()
        for _ in range(calls):
            r = fn(*args)
        jax.block_until_ready(r)
        times.append((time.perf_counter() - t) / calls)
    return float(np.median(times))


def main(out_path):
    names = os.environ.get("PROBE_MATMULS", ",".join(MATMULS)).split(",")
    t_end = time.perf_counter() + float(os.environ.get("PROBE_SECONDS", "1e9"))
    rows = []
    m = 65536
    for name in names:
        e, k, n, top_k, dense_cfgs = MATMULS[name]
        keys = jax.random.split(jax.random.key(0), 4)
        x = jax.random.normal(keys[0], (m, k), jnp.bfloat16)
        w = (jax.random.normal(keys[1], (e, k, n), jnp.float32) * k**-0.5).astype(jnp.bfloat16)
        ids = jax.random.randint(keys[2], (m // top_k, top_k), 0, e, jnp.int32)
        routed = dispatch.dispatch(ids, e).group_sizes
        equal = jnp.full((e,), m // e, jnp.int32)
        flops = 2.0 * m * k * n
        fns = {}
        for gname, sizes in (("routed", routed), ("equal", equal)):
            fns[f"triton {gname}"] = (
                jax.jit(lambda x, w, s: moe_pallas.ragged_dot(x, w, s, implementation="pallas_triton")),
                (x, w, sizes),
            )
            for cname, c in MOSAIC.items():
                cfg = gmm_mgpu.MosaicConfig(**c)
                fns[f"mosaic {cname} {gname}"] = (
                    jax.jit(lambda x, w, s, cfg=cfg: gmm_mgpu.gmm(x, w, s, config=cfg)),
                    (x, w, sizes),
                )
        fns["xla batched equal"] = (
            jax.jit(lambda x, w: jnp.einsum("emk,ekn->emn", x.reshape(e, m // e, k), w)),
            (x, w),
        )
        for tm, tn, wg in dense_cfgs:
            cfg = hm.TuningConfig(
                tile_m=tm, tile_n=tn, tile_k=64, max_concurrent_steps=4,
                grid_minor_dim=hm.MatmulDimension.N, grid_tile_width=4,
                wg_dimension=hm.MatmulDimension[wg],
            )
            fns[f"dense mgpu {tm}x{tn} wg{wg}"] = (
                jax.jit(lambda x, w, cfg=cfg: hm.matmul(x, w[0], None, cfg)), (x, w)
            )
        ref = None
        for impl, (fn, args) in fns.items():
            if time.perf_counter() > t_end:
                break
            row = {"matmul": name, "impl": impl}
            try:
                out = fn(*args)
                if impl.startswith(("triton", "mosaic")) and impl.endswith("equal"):
                    o = np.asarray(out[:: m // 64], np.float32)
                    ref = o if ref is None else ref
                    row["max_rel_diff"] = float(np.abs(o - ref).max() / np.abs(ref).max())
                s = bench(fn, *args)
                row.update(ms=s * 1e3, tflops=flops / s / 1e12)
            except Exception as exc:  # noqa: BLE001 - a failing variant is a row
                row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            rows.append(row)
            print(json.dumps(row), flush=True)
            with open(out_path, "w") as f:
                json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "probe_gmm_waste.json"))
