"""`python -m moe_pallas demo`: both workloads on each backend, checked against the oracle, timed.

Backends (`--implementation`, any of `backends.IMPLEMENTATIONS`): by default on a GPU "auto",
what a user's call runs; off GPU "xla" and "pallas_triton", the project's Triton kernels run in
Pallas interpret mode (exact, slow, so not timed). "mosaic_gpu" interprets too slowly to be a
default off GPU (seconds a call at the small size); ask for it by name.
The oracle is `reference.moe_experts_reference` in float64 off GPU, float32 at HIGHEST precision
on a GPU (a float64 copy of the full-size experts would not fit beside them).
With `--checkpoint PATH` (a .safetensors file or a folder of shards) the experts come from a
checkpoint instead (`weights.load_experts`: gpt-oss, MXFP4 included, or per-expert SwiGLU
weights, FP8 included; kept as stored, `moe_pallas.quant`, unless `--dequantize`), fed random
tokens and routing; `--fp8-activations` runs FP8 experts with their activations in e4m3 too
(`quant.use_fp8_activations`, the FP8 tensor cores). Exit status 1 if any result is outside
its error bound (bf16: 2e-2, float32: 5e-3 relative Frobenius error, which admits TF32
tensor-core matmuls on GPU; with fp8 activations 8e-2, their quantisation, docs/reliability.md);
2 for a bad argument.
"""

import argparse
import contextlib
import dataclasses
import functools
import os
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from moe_pallas.backends import IMPLEMENTATIONS
from moe_pallas.backends import resolve as resolve_implementation
from moe_pallas.experts import moe_experts
from moe_pallas.quant import dequantize_experts, is_quantized, use_fp8_activations
from moe_pallas.reference import moe_experts_reference
from moe_pallas.routing import route
from moe_pallas.safetensors_io import read_safetensors
from moe_pallas.weights import LAYOUTS, load_experts

TOLERANCE = {"bfloat16": 2e-2, "float32": 5e-3}
FP8_ACTIVATIONS_TOLERANCE = 8e-2  # the activations' e4m3 quantisation (docs/reliability.md)


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


def checkpoint_case(
    path,
    layout: str,
    prefix: str,
    top_k: int,
    tokens: int,
    dtype,
    seed: int = 0,
    dequantize: bool = False,
    fp8_activations: bool = False,
):
    """The experts of a checkpoint file (`load_experts(read_safetensors(path), layout, prefix=,
    dequantize=)`, in `dtype`; quantised weights kept as stored unless dequantize, FP8 ones with
    `fp8_activations` if asked) with random tokens routed to top_k of them; returns (workload,
    case) as make_case."""
    params = load_experts(
        read_safetensors(path), layout, prefix=prefix, dtype=dtype, dequantize=dequantize
    )
    if fp8_activations:
        try:
            params = use_fp8_activations(params)
        except ValueError as err:  # MXFP4 or dense experts
            raise ValueError(
                "--fp8-activations needs FP8 experts kept as stored (a per-expert FP8 checkpoint, "
                f"without --dequantize): {err}"
            ) from err
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


def default_implementations() -> tuple[str, ...]:
    """What the demo runs without `--implementation`: "auto" on a GPU; off GPU "xla" and the
    Triton kernels in interpret mode."""
    return ("auto",) if _on_gpu() else ("xla", "pallas_triton")


def _on_gpu() -> bool:
    return jax.default_backend() == "gpu"


def _label(implementation: str, backend: str) -> str:
    """The table's name for a run: the implementation asked for, what "auto" became, and
    whether the Pallas kernels were interpreted."""
    if backend != implementation:
        return f"{implementation} ({backend})"
    if backend in ("pallas_triton", "mosaic_gpu") and not _on_gpu():
        return f"{backend} (interpret)"
    return backend


def _oracle(workload: Workload, case, chunk: int) -> np.ndarray:
    """The reference output in float64 off GPU (x64 enabled for this call only) or float32 on a
    GPU, where a float64 copy of the full-size experts would not fit beside them."""
    dtype = jnp.float32 if _on_gpu() else jnp.float64
    x64 = contextlib.nullcontext() if _on_gpu() else jax.enable_x64(True)
    with x64:
        oracle = functools.partial(
            moe_experts_reference, activation=workload.activation, dtype=dtype, chunk=chunk
        )
        x, topk_idx, topk_weight, params = case
        dense = dequantize_experts(params, jnp.float32)  # quantised weights decoded exactly
        return np.asarray(jax.jit(oracle)(x, topk_idx, topk_weight, dense))


def run(cases, implementations: str | Sequence[str], repeats: int = 5) -> list[dict]:
    """One table row per (case, implementation): each of `cases` (make_case / checkpoint_case)
    on each implementation, checked against one oracle per case; the dtype and its error bound
    are the case's tokens'. Interpreted Pallas kernels are checked but not timed ("ms": None):
    an interpreter's time says nothing about the kernel."""
    if isinstance(implementations, str):
        implementations = (implementations,)
    backends = {impl: resolve_implementation(impl) for impl in implementations}
    chunk = 32 if _on_gpu() else 8
    rows = []
    for workload, case in cases:
        x, topk_idx, topk_weight, params = case
        ref = _oracle(workload, case, chunk)
        dtype_name = jnp.dtype(x.dtype).name
        for implementation, backend in backends.items():
            label = _label(implementation, backend)
            layer = jax.jit(
                functools.partial(
                    moe_experts, activation=workload.activation, implementation=backend
                )
            )
            row = {
                "workload": workload.name,
                "T": x.shape[0],
                "H": x.shape[1],
                "E": params["w_gate_up"].shape[0],
                "implementation": label,
                "backend": backend,
                "dtype": dtype_name,
                "max_err": float("nan"),
                "rel_err": float("nan"),
                "ms": None,
                "ok": False,
                "skipped": None,
            }
            try:
                out = np.asarray(layer(x, topk_idx, topk_weight, params), np.float64)
            except ValueError as err:
                if backend != "mosaic_gpu":
                    raise
                # Mosaic GPU takes N and K in multiples of 16 (the small gpt-oss case has H = 90).
                row["skipped"] = str(err).splitlines()[0]
                rows.append(row)
                continue
            rel = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
            row["max_err"] = float(np.max(np.abs(out - ref)))
            row["rel_err"] = rel
            row["ok"] = bool(np.isfinite(rel) and rel <= bound(params, dtype_name))
            if "interpret" not in label:
                row["ms"] = _median_ms(layer, x, topk_idx, topk_weight, params, repeats=repeats)
            rows.append(row)
    return rows


def bound(params, dtype_name: str) -> float:
    """The relative error bound of a case: its dtype's, or fp8 activations' where they apply."""
    fp8 = any(is_quantized(v) and v.fp8_activations for v in params.values())
    return FP8_ACTIVATIONS_TOLERANCE if fp8 else TOLERANCE[dtype_name]


def _check(row: dict) -> str:
    if row["skipped"]:
        return "skipped"
    return "ok" if row["ok"] else "MISMATCH"


def format_table(rows: list[dict]) -> str:
    width = max([11] + [len(r["workload"]) for r in rows])
    impl_width = max([14] + [len(r["implementation"]) for r in rows])
    header = (
        f"{'workload':<{width}} {'T':>5} {'H':>5} {'E':>4} {'implementation':<{impl_width}} "
        f"{'dtype':<9} {'max err':>9} {'rel err':>9} {'ms':>9}  check"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        ms = "-" if r["ms"] is None else f"{r['ms']:.3f}"
        errors = ["-" if r["skipped"] else f"{r[k]:.2e}" for k in ("max_err", "rel_err")]
        lines.append(
            f"{r['workload']:<{width}} {r['T']:>5} {r['H']:>5} {r['E']:>4} "
            f"{r['implementation']:<{impl_width}} {r['dtype']:<9} {errors[0]:>9} "
            f"{errors[1]:>9} {ms:>9}  {_check(r)}"
        )
    for r in rows:
        if r["skipped"]:
            lines.append(f"skipped {r['workload']} on {r['implementation']}: {r['skipped']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m moe_pallas demo", description=__doc__.splitlines()[0]
    )
    default_size = "full" if _on_gpu() else "small"
    parser.add_argument(
        "--size",
        choices=sorted(SIZES),
        default=default_size,
        help=f"problem size (default on this platform: {default_size}; full = the seed shapes at T=2048)",
    )
    defaults = default_implementations()
    parser.add_argument(
        "--implementation",
        nargs="+",
        choices=IMPLEMENTATIONS,
        default=list(defaults),
        metavar="NAME",
        help=f"moe_experts backends to run, any of {', '.join(IMPLEMENTATIONS)} "
        f"(default on this platform: {' '.join(defaults)})",
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
    parser.add_argument(
        "--dequantize",
        action="store_true",
        help="with --checkpoint: load MXFP4 / FP8 experts as dense weights (default: as stored)",
    )
    parser.add_argument(
        "--fp8-activations",
        action="store_true",
        help="with --checkpoint (FP8 experts): quantise the activations too, 1 x 128 e4m3, "
        "for the FP8 tensor cores",
    )
    args = parser.parse_args(argv)
    if args.tokens < 1:
        parser.error(f"argument --tokens: must be at least 1, got {args.tokens}")
    print(
        f"moe_pallas demo on {jax.devices()[0].device_kind} ({jax.default_backend()}), jax {jax.__version__}"
    )
    dtype = jnp.dtype(args.dtype)
    if args.checkpoint:
        try:
            case = checkpoint_case(
                args.checkpoint,
                args.layout,
                args.prefix,
                args.top_k,
                args.tokens,
                dtype,
                dequantize=args.dequantize,
                fp8_activations=args.fp8_activations,
            )
        except (OSError, ValueError) as err:
            parser.error(str(err))  # exits with status 2
        cases = [case]
    else:
        if args.fp8_activations:
            parser.error("--fp8-activations applies to --checkpoint's FP8 experts")
        cases = [make_case(workload, args.size, dtype) for workload in WORKLOADS.values()]
    rows = run(cases, list(dict.fromkeys(args.implementation)))
    print(format_table(rows))
    oracle = "float32" if _on_gpu() else "float64"
    bound_text = f"{bound(cases[0][1][3], args.dtype):.0e}"
    bad = [
        f"{r['workload']} on {r['implementation']}" for r in rows if not (r["ok"] or r["skipped"])
    ]
    if bad:
        print(f"MISMATCH against the {oracle} reference in: {', '.join(bad)} (bound {bound_text})")
        return 1
    checked = sum(r["ok"] for r in rows)
    print(f"{checked} results within {bound_text} relative error of the {oracle} reference")
    return 0
