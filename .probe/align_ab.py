"""Does fp8's N-major row pitch matter? gpt-oss's K = 2880 makes each stored row 2880 bytes (64-byte
aligned, every other row off a 128-byte line; SwiGLU-256's 4096 and 2048 are aligned). The same
gmm_quant calls (the layer's gate_up GLU with bias and row gather, down with bias and row scale;
the table's configs for K = 2880, as the pallas_triton backend picks them, on both) on K = 2880 against K = 2944 (= 23 x 128,
x's columns and the weights' K zero-padded: the same product, 2.2% more bytes), fp8 and mxfp4
(1440 against 1472-byte rows), and K = 2816 (= 11 x 256, 22 x 128: aligned rows and no masked
K tail at the tiny entries' block_k of 256, where 2880 and 2944 have one; x and the weights
truncated, 2.2% fewer bytes): per byte, 2816 and 2944 alike and both faster than 2880 says the
rows' alignment, 2816 alone faster the tail step. T = 16 / 64 / 256, medians of 3 alternating
rounds, ms.
Usage: python .probe/align_ab.py OUT.json [--small]"""
import json, sys
import jax, jax.numpy as jnp, numpy as np
from moe_pallas import dispatch, quant
from moe_pallas.backends import pallas_triton
from moe_pallas.kernels.gmm_quant import gmm_quant
from benchmarks.bench_gmm import time_op

small = "--small" in sys.argv
E, H, I, TOPK = (8, 64, 64, 2) if small else (128, 2880, 2880, 4)
PAD = 64 if small else 2944
rows = []
key = jax.random.key(0)
w_gu = jax.random.normal(key, (E, H, 2 * I), jnp.bfloat16) * 0.02
w_d = jax.random.normal(jax.random.fold_in(key, 1), (E, I, H), jnp.bfloat16) * 0.02
b_gu = jnp.zeros((E, 2 * I), jnp.bfloat16)
b_d = jnp.zeros((E, H), jnp.bfloat16)


def padded_k(w, k):
    if k < w.shape[1]:
        return w[:, :k]
    return jnp.pad(w, ((0, 0), (0, k - w.shape[1]), (0, 0)))


for fmt in ("fp8", "mxfp4"):
    for T in ((16,) if small else (16, 64, 256)):
        idx = jax.random.randint(jax.random.fold_in(key, T), (T, TOPK), 0, E, jnp.int32)
        d = dispatch.dispatch(idx, E)
        x = jax.random.normal(jax.random.fold_in(key, 7), (T, H), jnp.bfloat16)
        a = jax.random.normal(jax.random.fold_in(key, 8), (T * TOPK, I), jnp.bfloat16)
        rw = jnp.ones((T * TOPK,), jnp.float32)
        variants = {}
        short = 2816 if not small else H
        for name, k_h, k_i in (("K2880", H, I), ("K_pad", PAD if not small else H + 64, PAD if not small else I + 64),
                               ("K2816", short, short)):
            qgu = quant.quantize_weight(padded_k(w_gu, k_h), fmt)
            qd = quant.quantize_weight(padded_k(w_d, k_i), fmt)
            xp = x[:, :k_h] if k_h < H else jnp.pad(x, ((0, 0), (0, k_h - H)))
            ap = a[:, :k_i] if k_i < I else jnp.pad(a, ((0, 0), (0, k_i - I)))
            dt = qgu.element_dtype
            cfg_gu = pallas_triton.config("gmm_glu", dt, T * TOPK, E, H, I, "gptoss")
            cfg_d = pallas_triton.config("gmm", dt, T * TOPK, E, I, H)
            gate_up = lambda x, w, s, r, c=cfg_gu: gmm_quant(
                x, w, s, lhs_row_index=r, bias=b_gu, activation="gptoss", config=c)
            down = lambda a, w, s, rw, c=cfg_d: gmm_quant(
                a, w, s, bias=b_d, row_scale=rw, config=c)
            variants[name] = ((gate_up, xp, (qgu, d.group_sizes, d.row_token)),
                              (down, ap, (qd, d.group_sizes, rw)))
        times = {f"{n}/{p}": [] for n in variants for p in ("gate_up", "down")}
        for _ in range(3):
            for n, calls in variants.items():
                for p, (op, carry, args) in zip(("gate_up", "down"), calls):
                    times[f"{n}/{p}"].append(time_op(op, carry, *args) * 1e3)
        row = {"fmt": fmt, "T": T, **{k: round(sorted(v)[1], 4) for k, v in times.items()}}
        print(json.dumps(row), flush=True)
        rows.append(row)
json.dump(rows, open(sys.argv[1], "w"), indent=1)
