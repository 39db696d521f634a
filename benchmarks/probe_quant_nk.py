"""Probe (history only): fp8 expert weights stored N-major ([E, N, K], as checkpoints hold them:
K contiguous) against the committed [E, K, N], each with the converted weight as the dot's second
operand or first (out^T = w^T x^T), on gpt-oss gate_up (GLU, gathered rows, bias) and down (row
scale); bf16's Triton gmm beside them. Outputs are checked equal to the committed layout's.

    python -m benchmarks.probe_quant_nk OUT.json      # PROBE_SMALL=1: CPU, interpret mode

By default T = 64 and 2048 with fp8 (32 variants, a few minutes on the H200); PROBE_FULL=1 adds
T = 16 and 256 and fp8_block.
"""

import itertools
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from moe_pallas import dispatch, quant, route
from moe_pallas.backends import pallas_triton
from moe_pallas.kernels import gmm_quant as gmm_quant_module
from moe_pallas.kernels.config import BlockConfig
from moe_pallas.kernels.gmm_quant import gmm_quant

DECODES = {
    "bits": gmm_quant_module._e4m3,
    "hw": lambda q, dtype: jax.lax.bitcast_convert_type(q, jnp.float8_e4m3fn).astype(dtype),
}


def bench(fn, *args, min_s=0.02, samples=7):
    jax.block_until_ready(fn(*args))
    t = time.perf_counter()
    jax.block_until_ready(fn(*args))
    calls = max(1, min(200, int(min_s / max(time.perf_counter() - t, 1e-6))))
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
    full = bool(os.environ.get("PROBE_FULL"))
    hidden, inter, experts, k = (128, 96, 8, 2) if small else (2880, 2880, 128, 4)
    keys = jax.random.split(jax.random.key(0), 4)
    dense = {
        "gate_up": jax.random.normal(keys[0], (experts, hidden, 2 * inter)) * hidden**-0.5,
        "down": jax.random.normal(keys[1], (experts, inter, hidden)) * inter**-0.5,
    }
    dense = {name: w.astype(jnp.bfloat16) for name, w in dense.items()}
    bias = (0.1 * jax.random.normal(keys[2], (experts, 2 * inter))).astype(jnp.bfloat16)
    rows = []
    for tokens in (8,) if small else (64, 2048, 16, 256) if full else (64, 2048):
        x = jax.random.normal(jax.random.key(tokens), (tokens, hidden)).astype(jnp.bfloat16)
        logits = jax.random.normal(jax.random.key(tokens + 1), (tokens, experts))
        idx, weight, _ = route(logits, k, method="topk_softmax")
        d = dispatch.dispatch(idx, experts)
        h = jax.random.normal(keys[3], (tokens * k, inter)).astype(jnp.bfloat16)
        scale = weight.reshape(-1)[d.row_pair]
        calls = {
            "gate_up": lambda **kw: jax.jit(
                lambda lhs, ri, gs, wq, nk, b: gmm_quant(
                    lhs, wq, gs, lhs_row_index=ri, bias=b, activation="gptoss", values_nk=nk, **kw
                )
            ),
            "down": lambda **kw: jax.jit(
                lambda lhs, gs, wq, nk, s: gmm_quant(lhs, wq, gs, row_scale=s, values_nk=nk, **kw)
            ),
        }
        args = {
            "gate_up": lambda w, nk, x=x, d=d: (x, d.row_token, d.group_sizes, w, nk, bias),
            "down": lambda w, nk, h=h, d=d, scale=scale: (h, d.group_sizes, w, nk, scale),
        }
        bf16 = {
            "gate_up": jax.jit(
                lambda x, ri, gs, w, nk, b: pallas_triton.gmm(
                    x, w, gs, lhs_row_index=ri, bias=b, activation="gptoss"
                )
            ),
            "down": jax.jit(lambda h, gs, w, nk, s: pallas_triton.gmm(h, w, gs, row_scale=s)),
        }
        bm = 16 if tokens <= 256 else 64
        for name in ("gate_up", "down"):
            t_bf16 = bench(bf16[name], *args[name](dense[name], None))
            rows.append({"T": tokens, "matmul": name, "fmt": "bf16", "ms": t_bf16})
            print(rows[-1], flush=True)
            for fmt in ("fp8", "fp8_block") if full or small else ("fp8",):
                w = quant.quantize_weight(dense[name], fmt)
                w_nk = jnp.swapaxes(w.values, 1, 2).copy()
                want = None
                tiles = [(bm, 64), (bm, 128)] + ([(64, 128)] if bm == 16 and not small else [])
                for (tile_m, bn), layout, decode in itertools.product(tiles, ("kn", "nk"), DECODES):
                    gmm_quant_module._e4m3 = DECODES[decode]  # traced per jit below
                    cfg = BlockConfig(block_m=tile_m, block_n=bn, block_k=128, num_warps=4)
                    fn = calls[name](config=cfg, swap_ab=False)
                    a = args[name](w, w_nk if layout == "nk" else None)
                    row = {"T": tokens, "matmul": name, "fmt": fmt, "layout": layout}
                    row |= {"decode": decode, "tile": f"{tile_m}x{bn}"}
                    try:
                        got = np.asarray(fn(*a), np.float32)
                        want = got if want is None else want
                        row["max_diff"] = float(np.max(np.abs(got - want)))
                        row["ms"] = bench(fn, *a)
                        row["x_bf16"] = t_bf16 / row["ms"]
                    except Exception as exc:  # noqa: BLE001 - a failing variant is a row
                        row["error"] = str(exc)[:300]
                    rows.append(row)
                    print(row, flush=True)
                gmm_quant_module._e4m3 = DECODES["bits"]
                with open(out_path, "w") as f:
                    json.dump(rows, f, indent=1)
    bad = [r for r in rows if "error" in r or r.get("max_diff", 0) > (1e-6 if small else 0.05)]
    print(f"{len(bad)} variants failed or differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "probe_quant_nk.json"))
