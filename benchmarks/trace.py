"""Where a step's GPU time goes: the device kernels of ours and of the cuBLAS line, side by side.

    python -m benchmarks.trace [--case gptoss:fwd:16384 swiglu256:train:8192 ...] [--impl NAME]
                               [--steps 10] [--out FILE.md] [--small]

(`--impl moe_pallas:auto+fp8`, `+fp8_block`, `+mxfp4`: the layer on quantised expert weights,
forward cases; `moe_pallas:auto+fp8_training`: the train step with `fp8_training`, train cases.)

Per case (workload:mode:T, mode fwd or train; the benchmark suites' inputs, `benchmarks.run`):
`--impl` (default moe_pallas:auto) and `cublas_line` are each compiled, run once, timed by the
suites' method (`run.measure`: median of bursts of back-to-back calls), then run `--steps` more
times under jax's profiler (`jax.profiler.ProfileData` of the XSpace a `ProfilerSession` returns).
The GPU plane's kernel events (every stream) are summed per kernel name and divided by the steps,
then grouped into classes: the matmul cores (our gmm / tgmm kernels, cuBLAS and cuBLASLt GEMMs)
and what the layer adds around them (the GLU backward, the combine, the slabs, XLA's fusions:
sort, gather, elementwise, reductions, copies). Matmul TFLOP/s = the case's matmul FLOPs over the
cores' device time; for ours that includes the epilogues (bias, GLU, routing weight) and the
gather the kernels fuse. The steps' GPU span (first kernel start to last kernel end) less the
summed kernel time is the time the GPU sat idle between kernels within the steps.

The report (markdown): per case, the step time of both, the device time per class, and ours'
kernels by device time; a case that failed (out of memory on a smaller card) is listed under
"Not traced" with its reason, and the cases after it still run. Off a GPU the profile has no device
plane: the tables list no kernels (the run still checks the plumbing).
"""

import os

# The trace times no torch peer (torch runs only as the line's torch.bmm variant, which gives way to
# XLA's dot where its outputs do not fit), so jax may grow its pool past the 65% that
# benchmarks.run leaves the torch peers: under it (52 GiB of an 80 GiB H100) the trace of
# SwiGLU-256's train step at T = 2048 ran out of memory. Read when jax creates its GPU client, so
# set before benchmarks.run's own default.
os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.9")

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import jax
from jax._src.lib import _profiler
from tqdm import tqdm

from benchmarks import cases as _cases
from benchmarks import impls as _impls
from benchmarks import provenance
from benchmarks import run as _run
from benchmarks import sol as _sol

DEFAULT_CASES = (
    "gptoss:fwd:16384",
    "gptoss:train:16384",
    "swiglu256:fwd:8192",
    "swiglu256:train:8192",
)
# Kernel-name fragments per class, first match wins (names as the profiler reports them).
CLASSES = (
    ("gmm (Mosaic GPU)", ("gmm_mgpu",)),
    ("tgmm (Pallas)", ("tgmm",)),
    ("gmm (Triton)", ("gmm",)),
    ("cuBLAS GEMM", ("gemm", "nvjet", "cutlass", "xmma", "cublas", "sm90_")),
    ("GLU backward", ("glu_bwd",)),
    ("combine", ("moe_combine",)),
    ("slabs", ("slab",)),
)
MATMUL_CLASSES = ("gmm (Mosaic GPU)", "tgmm (Pallas)", "gmm (Triton)", "cuBLAS GEMM")
OTHER = "XLA fusions and copies"


def kernel_class(name: str) -> str:
    low = name.lower()
    for label, fragments in CLASSES:
        if any(f in low for f in fragments):
            return label
    return OTHER


def parse_case(text: str, small: bool) -> _cases.Case:
    try:
        workload, mode, tokens = text.split(":")
        wl = (_cases.SMALL_WORKLOADS if small else _cases.WORKLOADS)[workload]
        if mode not in ("fwd", "train"):
            raise ValueError(mode)
        return _cases.Case("trace", wl, int(tokens), mode)
    except (ValueError, KeyError):
        raise SystemExit(
            f"--case {text!r}: use WORKLOAD:MODE:T with WORKLOAD in {list(_cases.WORKLOADS)}, "
            "MODE fwd or train, T a token count, e.g. gptoss:fwd:16384."
        ) from None


def device_kernels(xspace: bytes) -> tuple[dict[str, tuple[int, float]], float]:
    """({kernel name: (events, total ns)}, span ns from the first kernel's start to the last
    one's end) over the GPU planes' stream lines of one profile."""
    totals: dict[str, list] = defaultdict(lambda: [0, 0.0])
    first, last = float("inf"), float("-inf")
    for plane in jax.profiler.ProfileData.from_serialized_xspace(xspace).planes:
        if not plane.name.startswith("/device:GPU"):
            continue
        for line in plane.lines:
            if not line.name.startswith("Stream"):
                continue
            for event in line.events:
                entry = totals[event.name]
                entry[0] += 1
                entry[1] += event.duration_ns
                first, last = min(first, event.start_ns), max(last, event.end_ns)
    span = last - first if last > first else 0.0
    return {name: (n, ns) for name, (n, ns) in totals.items()}, span


def profile(prep: _impls.Prepared, steps: int) -> tuple[dict[str, tuple[float, float]], float]:
    """({kernel name: (calls per step, device µs per step)}, GPU span µs per step) of `steps`
    back-to-back calls of a prepared step. The span less the summed kernel time is the time the
    GPU waited between kernels (launch gaps, host work between the calls)."""
    prep.wait(prep.call())
    session = _profiler.ProfilerSession()
    for _ in range(steps):
        out = prep.call()
    prep.wait(out)
    kernels, span_ns = device_kernels(session.stop())
    per_step = {name: (n / steps, ns / steps / 1e3) for name, (n, ns) in kernels.items()}
    return per_step, span_ns / steps / 1e3


def by_class(kernels: dict[str, tuple[float, float]]) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for name, (_, us) in kernels.items():
        out[kernel_class(name)] += us
    return dict(out)


def matmul_flops(case: _cases.Case) -> float:
    w = case.workload
    return _sol.layer_cost(
        case.tokens, w.hidden, w.inter, w.top_k, w.experts, train=case.mode == "train"
    ).flops


def trace_case(case: _cases.Case, impl: str, steps: int, budget_s: float) -> dict:
    """The case's result for the report; a case that fails (out of memory on a smaller card, an
    implementation that refuses it) is a result too, {"case", "failed": reason}, and the run
    goes on to the next case."""
    result = {"case": case.name, "flops": matmul_flops(case)}
    stage = "the inputs"
    try:
        params = _cases.make_params(case.workload)
        inputs = _run._inputs(case, params)
        for name in (impl, _impls.LINE):
            stage = name
            prep = _impls.IMPLS[name](case, inputs)
            seconds, _, _ = _run.measure(prep, budget_s)
            kernels, span_us = profile(prep, steps)
            result[name] = {
                "step_ms": seconds * 1e3,
                "span_us": span_us,
                "kernels": kernels,
                "classes": by_class(kernels),
                "note": prep.note,
            }
            del prep
    except Exception as err:  # noqa: BLE001 - one case's failure is a line of the report
        kind = "ran out of memory" if _run._is_oom(err) else "failed"
        return {"case": case.name, "failed": f"{stage} {kind}: {_run._error_text(err)}"}
    return result


def _tflops(flops: float, us: float) -> str:
    return f"{flops / (us * 1e-6) / 1e12:.0f}" if us > 0 else "—"


def _split(r: dict, impl: str) -> tuple[dict, dict]:
    """Device µs per step of the matmul cores and of all kernels, for ours and the line."""
    pairs = (("ours", r[impl]), ("line", r[_impls.LINE]))
    cores = {k: sum(v for c, v in x["classes"].items() if c in MATMUL_CLASSES) for k, x in pairs}
    device = {k: sum(x["classes"].values()) for k, x in pairs}
    return cores, device


def summary(results: list[dict], impl: str) -> list[str]:
    """One row per traced case: the step ratio, then what its device time splits into (µs per step):
    the matmul cores of both (and their TFLOP/s), what ours adds around the cores, and the GPU's
    idle time between our kernels."""
    lines = [
        (
            "| case | ours ms | line ms | ratio | matmul cores, ours µs (TFLOP/s) | line µs "
            "(TFLOP/s) | around the cores µs | idle µs |"
        ),
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        ours, line = r[impl], r[_impls.LINE]
        cores, device = _split(r, impl)
        lines.append(
            f"| {r['case']} | {ours['step_ms']:.3f} | {line['step_ms']:.3f} | "
            f"{ours['step_ms'] / line['step_ms']:.2f} | {cores['ours']:.0f} "
            f"({_tflops(r['flops'], cores['ours'])}) | {cores['line']:.0f} "
            f"({_tflops(r['flops'], cores['line'])}) | {device['ours'] - cores['ours']:.0f} | "
            f"{max(ours['span_us'] - device['ours'], 0):.0f} |"
        )
    return lines


def report(results: list[dict], impl: str, meta: str, top: int = 12) -> str:
    traced = [r for r in results if "failed" not in r]
    failed = [r for r in results if "failed" in r]
    lines = ["# Where the time goes", "", meta, "", *summary(traced, impl), ""]
    if failed:
        lines += ["Not traced:", "", *(f"- {r['case']}: {r['failed']}" for r in failed), ""]
    for r in traced:
        ours, line = r[impl], r[_impls.LINE]
        cores, device = _split(r, impl)
        lines += [
            f"## {r['case']}",
            "",
            (
                f"Step: {impl} {ours['step_ms']:.3f} ms, cuBLAS line {line['step_ms']:.3f} ms "
                f"(ratio {ours['step_ms'] / line['step_ms']:.2f}); matmul FLOPs {r['flops']:.3g}."
            ),
            f"Line: {line['note']}.",
            "",
            "| device time per step | ours (µs) | line (µs) |",
            "|---|---|---|",
        ]
        for label in (*MATMUL_CLASSES, "GLU backward", "combine", "slabs", OTHER):
            a, b = ours["classes"].get(label, 0.0), line["classes"].get(label, 0.0)
            if a or b:
                lines.append(f"| {label} | {a:.0f} | {b:.0f} |")
        lines += [
            (
                f"| **matmul cores** | {cores['ours']:.0f} ({_tflops(r['flops'], cores['ours'])} "
                f"TFLOP/s) | {cores['line']:.0f} ({_tflops(r['flops'], cores['line'])} TFLOP/s) |"
            ),
            (
                f"| **around the cores** | {device['ours'] - cores['ours']:.0f} | "
                f"{device['line'] - cores['line']:.0f} |"
            ),
            f"| **all device time** | {device['ours']:.0f} | {device['line']:.0f} |",
            (
                f"| GPU idle between kernels (span {ours['span_us']:.0f} / "
                f"{line['span_us']:.0f}) | {max(ours['span_us'] - device['ours'], 0):.0f} | "
                f"{max(line['span_us'] - device['line'], 0):.0f} |"
            ),
            "",
            f"Kernels of {impl}, by device time per step:",
            "",
            "| kernel | class | calls/step | µs/step |",
            "|---|---|---|---|",
        ]
        ranked = sorted(ours["kernels"].items(), key=lambda kv: -kv[1][1])[:top]
        for name, (calls, us) in ranked:
            short = name if len(name) <= 60 else name[:57] + "..."
            lines.append(f"| `{short}` | {kernel_class(name)} | {calls:g} | {us:.0f} |")
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--case", nargs="+", default=list(DEFAULT_CASES))
    parser.add_argument(
        "--impl",
        default="moe_pallas:auto",
        choices=[
            *_impls.OURS,
            *(f"moe_pallas:auto+{f}" for f in _impls.QUANT_FORMATS + _impls.A8_FORMATS),
            _impls.FP8_TRAINING,
        ],
        help="ours, our layer on quantised expert weights (moe_pallas:auto+fp8, ...), or our "
        "train step with fp8_training",
    )
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--budget", type=float, default=0.3)
    parser.add_argument("--small", action="store_true", help="tiny shapes (CPU smoke test)")
    parser.add_argument("--out", type=Path, help="write the report here (default: stdout only)")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}.")
    case_list = [parse_case(c, args.small) for c in args.case]
    results = []
    for case in tqdm(case_list, desc="trace", unit="case", file=sys.stderr):
        results.append(trace_case(case, args.impl, args.steps, args.budget))
    meta = (
        f"Device: {jax.devices()[0].device_kind} · jax {jax.__version__} · commit "
        f"`{provenance.git_commit()}` · `python -m benchmarks.trace "
        + " ".join(sys.argv[1:] if argv is None else argv)
        + "`"
    )
    text = report(results, args.impl, meta)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    print(text)
    return text


if __name__ == "__main__":
    main()
