"""Probe: what a 64-row ping-pong tile costs against a 128-row one (is a half tile bound by its
rhs stream?), and what the Triton GLU epilogue costs against the plain gmm, 65536 rows, TFLOP/s,
one process.

    python -m benchmarks.probe_half_tiles OUT_DIR
"""

import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp

from benchmarks.bench_gmm import time_op
from moe_pallas import backends, dispatch
from moe_pallas.kernels import gmm_mgpu

ROWS = 65536


def sizes_of(kind, experts, top_k):
    if kind == "equal":
        return jnp.full((experts,), ROWS // experts, jnp.int32)
    idx = jax.random.randint(jax.random.key(7), (ROWS // top_k, top_k), 0, experts, jnp.int32)
    return dispatch.dispatch(idx, experts).group_sizes


def main(out_dir):
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    def log(row):
        print(json.dumps(row), flush=True)
        with (out_dir / "half_tiles.jsonl").open("a") as f:
            f.write(json.dumps(row) + "\n")

    k2, k3 = jax.random.split(jax.random.key(1))
    # 1. ping-pong tile heights, gpt-oss down (K = N = 2880)
    lhs = jax.random.normal(k2, (ROWS, 2880), jnp.bfloat16)
    rhs = (jax.random.normal(k3, (128, 2880, 2880), jnp.float32) * 2880**-0.5).astype(jnp.bfloat16)
    flops = 2 * ROWS * 2880 * 2880
    for kind in ("equal", "routed"):
        sizes = sizes_of(kind, 128, 4)
        row = {"what": "gpt-oss down ping-pong", "sizes": kind}
        ref = None
        for bm, bn, stages in (
            (128, 192, 4),
            (64, 192, 4),
            (64, 192, 6),
            (64, 256, 4),
            (128, 128, 5),
            (64, 128, 6),
        ):
            cfg = gmm_mgpu.MosaicConfig(bm, bn, 64, stages, consumers=2, split="pingpong", epi_n=64)
            fn = lambda x, w, s, cfg=cfg: gmm_mgpu.gmm(x, w, s, config=cfg)
            label = f"{bm}x{bn} s{stages}"
            try:
                out = jax.jit(fn)(lhs, rhs, sizes)
                ref = out if ref is None else ref
                row[label + " equal"] = bool(jnp.array_equal(out, ref))
                row[label] = round(flops / time_op(fn, lhs, rhs, sizes) / 1e12, 1)
            except Exception as e:  # noqa: BLE001 - probe: record and go on
                row[label] = f"{type(e).__name__}: {str(e)[:200]}"
        log(row)
    del lhs, rhs
    # 2. Triton GLU epilogue against the plain gmm (the layer's gate_up call: gather + bias)
    for name, experts, top_k, hidden, inter, act in (
        ("gpt-oss", 128, 4, 2880, 2880, "gptoss"),
        ("SwiGLU-256", 256, 8, 4096, 2048, "swiglu"),
    ):
        tokens = ROWS // top_k
        x = jax.random.normal(k2, (tokens, hidden), jnp.bfloat16)
        w = (
            jax.random.normal(k3, (experts, hidden, 2 * inter), jnp.float32) * hidden**-0.5
        ).astype(jnp.bfloat16)
        b = jnp.zeros((experts, 2 * inter), jnp.bfloat16) + 0.01
        idx = jax.random.randint(jax.random.key(3), (tokens, top_k), 0, experts, jnp.int32)
        d = dispatch.dispatch(idx, experts)
        flops = 2 * ROWS * hidden * 2 * inter
        row = {"what": f"{name} gate_up, Triton under auto"}
        calls = {
            "plain (h)": lambda x, w, s: backends.gmm(
                "auto", x, w, s, lhs_row_index=d.row_token, bias=b
            ),
            "glu epilogue": lambda x, w, s: backends.gmm(
                "auto", x, w, s, lhs_row_index=d.row_token, bias=b, activation=act
            ),
        }
        for label, fn in calls.items():
            row[label] = round(flops / time_op(fn, x, w, d.group_sizes) / 1e12, 1)
        log(row)
        del x, w


if __name__ == "__main__":
    main(*sys.argv[1:])
