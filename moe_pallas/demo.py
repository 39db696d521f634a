"""`python -m moe_pallas demo`: run both reference workloads, check them against the oracle, time them.

With `--checkpoint PATH` (a .safetensors file or a folder of shards) the experts come from a
checkpoint instead (`weights.load_experts`: gpt-oss, MXFP4 included, or per-expert SwiGLU
weights, FP8 included), fed random tokens and routing. Exit status 1 if any result is outside its error bound (bf16: 2e-2, float32: 5e-3
relative Frobenius error, which admits tf32 tensor-core matmuls on GPU).
"""

import argparse
import dataclasses
import functools
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from moe_pallas.backends import resolve as resolve_implementation
from moe_pallas.experts import moe_experts
from moe_pallas.reference import moe_experts_reference
from moe_pallas.routing import route
from moe_pallas.safetensors_io import read_safetensors
from moe_pallas.weights import LAYOUTS, load_experts

TOLERANCE = {"bfloat16": 2e-2, "float32": 5e-3}


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str
    hidden: int
    intermediate: int
    num_experts: int
    top_k: int
    activation: str
    router: str
    biases: bool


WORKLOADS = {
    "gptoss": Workload("gpt-oss", 2880, 2880, 128, 4, "gptoss", "topk_softmax", True),
    "swiglu": Workload("swiglu-256", 4096, 2048, 256, 8, "swiglu", "softmax_topk", False),
}
# (tokens, width divisor, expert divisor) per size: "small" keeps CPU runs to seconds.
SIZES = {"small": (64, 32, 8), "medium": (512, 4, 2), "full": (2048, 1, 1)}


def _normal(key, shape, scale):
    return scale * jax.random.normal(key, shape, jnp.float32)


def _tokens_and_routing(workload: Workload, tokens: int, dtype, key):
    """Random tokens x [T, H] (unit variance, as after a norm) and their routing."""
    key_x, key_logits = jax.random.split(key)
    x = _normal(key_x, (tokens, workload.hidden), 1.0).astype(dtype)
    logits = _normal(key_logits, (tokens, workload.num_experts), 1.0)
    renormalize = workload.router == "softmax_topk"
    topk_idx, topk_weight, _ = route(
        logits, workload.top_k, method=workload.router, renormalize=renormalize
    )
    return x, topk_idx, topk_weight


def make_case(workload: Workload, size: str, dtype, seed: int = 0):
    """Random tokens, weights (scaled so activations stay O(1)) and routing for a workload, at
    `size` (SIZES); returns (the workload at that size, (x, topk_idx, topk_weight, params))."""
    tokens, width_div, expert_div = SIZES[size]
    workload = dataclasses.replace(
        workload,
        hidden=workload.hidden // width_div,
        intermediate=workload.intermediate // width_div,
        num_experts=workload.num_experts // expert_div,
    )
    hidden, inter, num_experts = workload.hidden, workload.intermediate, workload.num_experts
    keys = jax.random.split(jax.random.key(seed), 5)
    params = {
        "w_gate_up": _normal(keys[0], (num_experts, hidden, 2 * inter), hidden**-0.5).astype(dtype),
        "w_down": _normal(keys[1], (num_experts, inter, hidden), inter**-0.5).astype(dtype),
    }
    if workload.biases:
        params["b_gate_up"] = _normal(keys[2], (num_experts, 2 * inter), 0.1).astype(dtype)
        params["b_down"] = _normal(keys[3], (num_experts, hidden), 0.1).astype(dtype)
    return workload, (*_tokens_and_routing(workload, tokens, dtype, keys[4]), params)


def checkpoint_case(path, layout: str, prefix: str, top_k: int, tokens: int, dtype, seed: int = 0):
    """The experts of a checkpoint file (`load_experts(read_safetensors(path), layout, prefix=)`,
    in `dtype`) with random tokens routed to top_k of them; returns (workload, case) as make_case."""
    params = load_experts(read_safetensors(path), layout, prefix=prefix, dtype=dtype)
    num_experts, hidden, two_inter = params["w_gate_up"].shape
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"--top-k={top_k} must be in [1, {num_experts}] (the file's experts).")
    gpt_oss = layout == "gpt_oss"
    workload = Workload(
        name=os.path.basename(os.path.normpath(path)),  # a folder given as "dir/" too
        hidden=hidden,
        intermediate=two_inter // 2,
        num_experts=num_experts,
        top_k=top_k,
        activation="gptoss" if gpt_oss else "swiglu",
        router="topk_softmax" if gpt_oss else "softmax_topk",
        biases="b_gate_up" in params,
    )
    return workload, (*_tokens_and_routing(workload, tokens, dtype, jax.random.key(seed)), params)


def _median_ms(fn, *args, repeats: int) -> float:
    """Median milliseconds per call over `repeats` bursts of back-to-back calls (one wait per
    burst, a burst ~20 ms long), as `benchmarks.run` times: a blocking wait after every call
    would add the host's launch and sync latency, which at decode sizes exceeds the GPU time."""
    jax.block_until_ready(fn(*args))
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    calls = max(1, min(100, int(20e-3 / max(time.perf_counter() - start, 1e-6))))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            out = fn(*args)
        jax.block_until_ready(out)
        times.append((time.perf_counter() - start) / calls)
    return 1e3 * float(np.median(times))


def run(cases, implementation: str, repeats: int = 5) -> list[dict]:
    """One table row per (workload, case) of `cases` (make_case / checkpoint_case); the dtype and
    its error bound are the case's tokens'."""
    backend = resolve_implementation(implementation)
    chunk = 32 if jax.default_backend() == "gpu" else 8
    rows = []
    for workload, (x, topk_idx, topk_weight, params) in cases:
        layer = jax.jit(
            functools.partial(moe_experts, activation=workload.activation, implementation=backend)
        )
        out = layer(x, topk_idx, topk_weight, params).astype(jnp.float32)
        oracle = functools.partial(
            moe_experts_reference, activation=workload.activation, chunk=chunk
        )
        ref = jax.jit(oracle)(x, topk_idx, topk_weight, params)
        rel = float(jnp.linalg.norm(out - ref) / jnp.linalg.norm(ref))
        dtype_name = jnp.dtype(x.dtype).name
        rows.append(
            {
                "workload": workload.name,
                "T": x.shape[0],
                "H": x.shape[1],
                "E": params["w_gate_up"].shape[0],
                "backend": backend,
                "dtype": dtype_name,
                "max_err": float(jnp.max(jnp.abs(out - ref))),
                "rel_err": rel,
                "ms": _median_ms(layer, x, topk_idx, topk_weight, params, repeats=repeats),
                "ok": bool(np.isfinite(rel) and rel <= TOLERANCE[dtype_name]),
            }
        )
    return rows


def format_table(rows: list[dict]) -> str:
    width = max([11] + [len(r["workload"]) for r in rows])
    header = f"{'workload':<{width}} {'T':>5} {'H':>5} {'E':>4} {'backend':<14} {'dtype':<9} {'max err':>9} {'rel err':>9} {'ms':>9}  check"
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r['workload']:<{width}} {r['T']:>5} {r['H']:>5} {r['E']:>4} {r['backend']:<14} {r['dtype']:<9} "
            f"{r['max_err']:>9.2e} {r['rel_err']:>9.2e} {r['ms']:>9.3f}  {'ok' if r['ok'] else 'MISMATCH'}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m moe_pallas demo", description=__doc__.splitlines()[0]
    )
    default_size = "full" if jax.default_backend() == "gpu" else "small"
    parser.add_argument(
        "--size",
        choices=sorted(SIZES),
        default=default_size,
        help=f"problem size (default on this platform: {default_size}; full = the seed shapes at T=2048)",
    )
    parser.add_argument(
        "--implementation", default="auto", help="moe_experts backend (default: auto)"
    )
    parser.add_argument("--dtype", choices=sorted(TOLERANCE), default="bfloat16")
    parser.add_argument(
        "--checkpoint",
        metavar="PATH",
        help="a .safetensors file, or a folder of shards, whose experts to run instead",
    )
    parser.add_argument("--layout", choices=LAYOUTS, default="gpt_oss", help="with --checkpoint")
    parser.add_argument(
        "--prefix",
        default="model.layers.0.mlp.experts.",
        help="with --checkpoint: the experts' name prefix (default: %(default)s)",
    )
    parser.add_argument("--top-k", type=int, default=4, help="with --checkpoint (default: 4)")
    parser.add_argument(
        "--tokens", type=int, default=256, help="with --checkpoint: random tokens (default: 256)"
    )
    args = parser.parse_args(argv)
    print(
        f"moe_pallas demo on {jax.devices()[0].device_kind} ({jax.default_backend()}), jax {jax.__version__}"
    )
    dtype = jnp.dtype(args.dtype)
    if args.checkpoint:
        try:
            case = checkpoint_case(
                args.checkpoint, args.layout, args.prefix, args.top_k, args.tokens, dtype
            )
        except (OSError, ValueError) as err:
            parser.error(str(err))  # exits with status 2
        cases = [case]
    else:
        cases = [make_case(workload, args.size, dtype) for workload in WORKLOADS.values()]
    rows = run(cases, args.implementation)
    print(format_table(rows))
    bad = [r["workload"] for r in rows if not r["ok"]]
    if bad:
        print(
            f"MISMATCH against the reference in: {', '.join(bad)} (bound {TOLERANCE[args.dtype]:.0e})"
        )
        return 1
    print(f"all results within {TOLERANCE[args.dtype]:.0e} relative error of the float32 reference")
    return 0
