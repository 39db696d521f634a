"""Probe (history only): `kernels.gmm_quant_mgpu.gmm_fp8_grouped` (fp8 weights as wgmma's register
operand, Mosaic GPU, one visit per group and 64 rows, widths bucketed to the visit's rows) against
the bf16 Triton gmm and the fp8 Triton gmm_quant on the layer's projections with top-k routed
rows (uniform), gpt-oss and SwiGLU-256, T = 16, 64, 256, 2048; both decodes, bf16 output.
Checked against each other (max relative difference to the first).

    python -m benchmarks.probe_quant_mgpu OUT.json     # on the H200 (PROBE_SMALL=1: CPU)
"""

import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from moe_pallas import quant
from moe_pallas.backends import pallas_triton
from moe_pallas.kernels.gmm_quant import gmm_quant
from moe_pallas.kernels.gmm_quant_mgpu import gmm_fp8_grouped

SHAPES = {  # name: (E, K, N, block_k, top_k)
    "gptoss_gate_up": (128, 2880, 5760, 64, 4),
    "gptoss_down": (128, 2880, 2880, 64, 4),
    "swiglu_gate_up": (256, 4096, 4096, 128, 8),
    "swiglu_down": (256, 2048, 4096, 128, 8),
}


def bench(fn, *args, samples=7):
    jax.block_until_ready(fn(*args))
    t = time.perf_counter()
    jax.block_until_ready(fn(*args))
    calls = max(1, min(200, int(0.02 / max(time.perf_counter() - t, 1e-6))))
    times = []
    for _ in range(samples):
        t = time.perf_counter()
        for _ in range(calls):
            r = fn(*args)
        jax.block_until_ready(r)
        times.append((time.perf_counter() - t) / calls)
    return float(np.median(times)) * 1e3


def main(out_path):
    small = bool(os.environ.get("PROBE_SMALL"))
    shapes = {"small": (4, 256, 128, 128, 2)} if small else SHAPES
    rows = []
    for name, (e, k, n, bk, top_k) in shapes.items():
        keys = jax.random.split(jax.random.key(7), 3)
        w_t = (jax.random.normal(keys[0], (e, n, k)) * 0.5).astype(jnp.float8_e4m3fn)
        w_bf16 = jnp.swapaxes(w_t.astype(jnp.bfloat16), 1, 2)
        qw = quant.QuantizedWeight(w_t, jnp.ones((e, n), jnp.float32), "fp8", jnp.bfloat16)
        for tokens in (4,) if small else (16, 64, 256, 2048):
            logits = jax.random.normal(jax.random.fold_in(keys[1], tokens), (tokens, e))
            idx = jax.lax.top_k(logits, top_k)[1]
            sizes = jnp.bincount(idx.reshape(-1), length=e).astype(jnp.int32)
            x = jax.random.normal(keys[2], (tokens * top_k, k)).astype(jnp.bfloat16)
            fns = {
                "bf16_triton": (jax.jit(pallas_triton.gmm), (x, w_bf16, sizes)),
                "fp8_triton": (jax.jit(gmm_quant), (x, qw, sizes)),
            }
            for decode in ("cvt", "bits"):
                fns[f"fp8_mgpu_grouped_{decode}"] = (
                    jax.jit(
                        lambda x, w, s, d=decode, bk=bk: gmm_fp8_grouped(
                            x, w, s, block_k=bk, decode=d
                        )
                    ),
                    (x, w_t, sizes),
                )
            want = None
            for impl, (fn, args) in fns.items():
                row = {"matmul": name, "tokens": tokens, "impl": impl}
                try:
                    out = np.asarray(fn(*args), np.float32)
                    want = out if want is None else want
                    row["max_rel_diff"] = float(np.abs(out - want).max() / np.abs(want).max())
                    row["ms"] = bench(fn, *args)
                except Exception as exc:  # noqa: BLE001 - a failing variant is a row
                    row["error"] = str(exc)[:400]
                rows.append(row)
                print(row, flush=True)
            with open(out_path, "w") as f:
                json.dump(rows, f, indent=1)
    bad = [r for r in rows if "error" in r or r.get("max_rel_diff", 0) > 1e-2]
    print(f"{len(bad)} variants failed or differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "probe_quant_mgpu.json"))
