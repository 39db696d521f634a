"""Probe (history only): the warp-specialised Mosaic GPU gmm with its epilogue stored in column
chunks (`MosaicConfig.epilogue_n`: two [block_m, 64] slots per consumer, a store group left in
flight while the next slot fills) against the whole-tile epilogue and the Triton gmm, at 65536
routed rows; the chunked epilogue frees the shared memory that kept the 64 x 256 split-m tile and
128-row halves off SwiGLU's shapes. Also the SwiGLU gate_up with its GLU epilogue (the layer's
call). TFLOP/s on 2·M·K·N, bf16 in and out.

    python -m benchmarks.probe_gmm_epilogue OUT.json   [PROBE_MATMULS=gptoss_gate_up,... PROBE_SECONDS]
"""

import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import moe_pallas
from moe_pallas import dispatch
from moe_pallas.backends import pallas_triton
from moe_pallas.kernels import gmm_mgpu

MATMULS = {  # name: (E, K, N, top_k, dense configs (tile_m, tile_n, wg dim))
    "gptoss_gate_up": (128, 2880, 5760, 4, [(128, 192, "M"), (128, 128, "M")]),
    "gptoss_down": (128, 2880, 2880, 4, [(128, 192, "M"), (128, 64, "M")]),
    "swiglu_gate_up": (256, 4096, 4096, 8, [(128, 128, "M"), (128, 128, "N")]),
    "swiglu_down": (256, 2048, 4096, 8, [(128, 128, "M"), (128, 128, "N")]),
}
MOSAIC = {
    "m64x256": dict(block_m=64, block_n=256, consumers=2, split="m"),
    "m64x256 e64": dict(block_m=64, block_n=256, consumers=2, split="m", epilogue_n=64),
    "m64x256 e64 s3": dict(block_m=64, block_n=256, consumers=2, split="m", epilogue_n=64, num_stages=3),
}
GLU = {  # SwiGLU gate_up with its GLU epilogue (N = 2I gate|up columns in, I out)
    "glu m64x128": dict(block_m=64, block_n=128, consumers=2, split="m"),
    "glu m64x128 e64": dict(block_m=64, block_n=128, consumers=2, split="m", epilogue_n=64),
    "glu m64x128 e64 s3": dict(block_m=64, block_n=128, consumers=2, split="m", epilogue_n=64, num_stages=3),
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
    small = bool(os.environ.get("PROBE_SMALL"))  # CPU: interpret mode at toy sizes
    if small:
        MATMULS["swiglu_gate_up"] = (4, 128, 256, 2, [])
    names = ["swiglu_gate_up"] if small else os.environ.get("PROBE_MATMULS", ",".join(MATMULS)).split(",")
    t_end = time.perf_counter() + float(os.environ.get("PROBE_SECONDS", "1e9"))
    rows = []
    m = 512 if small else 65536
    for name in names:
        e, k, n, top_k, dense_cfgs = MATMULS[name]
        keys = jax.random.split(jax.random.key(0), 4)
        x = jax.random.normal(keys[0], (m, k), jnp.bfloat16)
        w = (jax.random.normal(keys[1], (e, k, n), jnp.float32) * k**-0.5).astype(jnp.bfloat16)
        ids = jax.random.randint(keys[2], (m // top_k, top_k), 0, e, jnp.int32)
        routed = dispatch.dispatch(ids, e).group_sizes
        flops = 2.0 * m * k * n
        fns = {}
        for gname, sizes in (("routed", routed),):
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
        if name == "swiglu_gate_up":
            fns["triton glu routed"] = (
                jax.jit(lambda x, w, s: pallas_triton.gmm(x, w, s, activation="swiglu")),
                (x, w, routed),
            )
            for cname, c in GLU.items():
                cfg = gmm_mgpu.MosaicConfig(**c)
                fns[f"mosaic {cname} routed"] = (
                    jax.jit(lambda x, w, s, cfg=cfg: gmm_mgpu.gmm(x, w, s, activation="swiglu", config=cfg)),
                    (x, w, routed),
                )
        ref = {}
        for impl, (fn, args) in fns.items():
            if time.perf_counter() > t_end:
                break
            row = {"matmul": name, "impl": impl}
            try:
                out = fn(*args)
                o = np.asarray(out[:: m // 64], np.float32)
                key = "glu" if "glu" in impl else "plain"
                ref.setdefault(key, o)
                row["max_rel_diff"] = float(np.abs(o - ref[key]).max() / np.abs(ref[key]).max())
                s = bench(fn, *args, samples=1 if small else 7)
                row.update(ms=s * 1e3, tflops=flops / s / 1e12)
            except Exception as exc:  # noqa: BLE001 - a failing variant is a row
                row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            rows.append(row)
            print(json.dumps(row), flush=True)
            with open(out_path, "w") as f:
                json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "probe_gmm_epilogue.json"))
