"""Probe (history only): the quantised gmm with the operands swapped (out^T = w^T x^T, the
converted weight as the wgmma's register operand) against the committed layout and bf16, gpt-oss
gate_up (GLU, gathered rows, bias) and down (row scale) on the H200.

    python -m benchmarks.probe_quant_swap OUT.json
"""

import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from moe_pallas import dispatch, quant, route
from moe_pallas.backends import pallas_triton
from moe_pallas.kernels.config import BlockConfig
from moe_pallas.kernels.gmm_quant import gmm_quant


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
    small = os.environ.get("PROBE_SMALL")  # a CPU smoke run: interpret mode, tiny shapes
    hidden, inter, experts, k = (128, 128, 8, 2) if small else (2880, 2880, 128, 4)
    keys = jax.random.split(jax.random.key(0), 4)
    dense = {
        "gate_up": (jax.random.normal(keys[0], (experts, hidden, 2 * inter)) * hidden**-0.5),
        "down": (jax.random.normal(keys[1], (experts, inter, hidden)) * inter**-0.5),
    }
    dense = {name: w.astype(jnp.bfloat16) for name, w in dense.items()}
    bias = (0.1 * jax.random.normal(keys[2], (experts, 2 * inter))).astype(jnp.bfloat16)
    rows = []
    for tokens in (8,) if small else (16, 64, 256, 2048):
        x = jax.random.normal(jax.random.key(tokens), (tokens, hidden)).astype(jnp.bfloat16)
        logits = jax.random.normal(jax.random.key(tokens + 1), (tokens, experts))
        idx, weight, _ = route(logits, k, method="topk_softmax")
        d = dispatch.dispatch(idx, experts)
        h = jax.random.normal(keys[3], (tokens * k, inter)).astype(jnp.bfloat16)
        scale = weight.reshape(-1)[d.row_pair]
        calls = {
            "gate_up": lambda w, **kw: jax.jit(
                lambda lhs, ri, gs, w, b: gmm_quant(
                    lhs, w, gs, lhs_row_index=ri, bias=b, activation="gptoss", **kw
                )
            ),
            "down": lambda w, **kw: jax.jit(
                lambda lhs, gs, w, s: gmm_quant(lhs, w, gs, row_scale=s, **kw)
            ),
        }
        args = {
            "gate_up": lambda w, x=x, d=d: (x, d.row_token, d.group_sizes, w, bias),
            "down": lambda w, h=h, d=d, scale=scale: (h, d.group_sizes, w, scale),
        }
        bf16 = {
            "gate_up": jax.jit(
                lambda x, ri, gs, w, b: pallas_triton.gmm(
                    x, w, gs, lhs_row_index=ri, bias=b, activation="gptoss"
                )
            ),
            "down": jax.jit(lambda h, gs, w, s: pallas_triton.gmm(h, w, gs, row_scale=s)),
        }
        bm = 16 if tokens <= 256 else 64
        for name in ("gate_up", "down"):
            t_bf16 = bench(bf16[name], *args[name](dense[name]))
            rows.append({"T": tokens, "matmul": name, "fmt": "bf16", "ms": t_bf16})
            print(rows[-1], flush=True)
            for fmt in ("fp8", "mxfp4"):
                w = quant.quantize_weight(dense[name], fmt)
                want = None
                for bn, warps, swap in [
                    (bn, warps, swap)
                    for bn in (64, 128)
                    for warps in (4, 8)
                    for swap in (False, True)
                ]:
                    cfg = BlockConfig(block_m=bm, block_n=bn, block_k=128, num_warps=warps)
                    fn = calls[name](w, config=cfg, swap_ab=swap)
                    try:
                        got = np.asarray(fn(*args[name](w)), np.float32)
                        want = got if want is None else want
                        diff = float(np.max(np.abs(got - want)))
                        ms = bench(fn, *args[name](w))
                    except Exception as exc:  # noqa: BLE001 - a config that fails is a row
                        rows.append(
                            {
                                "T": tokens,
                                "matmul": name,
                                "fmt": fmt,
                                "bn": bn,
                                "warps": warps,
                                "swap": swap,
                                "error": str(exc)[:300],
                            }
                        )
                        print(rows[-1], flush=True)
                        continue
                    rows.append(
                        {
                            "T": tokens,
                            "matmul": name,
                            "fmt": fmt,
                            "bn": bn,
                            "warps": warps,
                            "swap": swap,
                            "ms": ms,
                            "x_bf16": t_bf16 / ms,
                            "max_diff": diff,
                        }
                    )
                    print(rows[-1], flush=True)
                with open(out_path, "w") as f:
                    json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "probe_quant_swap.json")
