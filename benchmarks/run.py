"""Benchmark runner: our backends and the peers on the suites, against the speed of light.

    python -m benchmarks.run --suite gptoss|swiglu256|decode|train|gmm|all --out DIR
                             [--impls A,B] [--append] [--small] [--ceiling datasheet|measured]
                             [--budget SECONDS] [--time-limit SECONDS] [--compile-workers N]

Per (case, implementation): median time of blocking samples after warm-up calls (each sample a
burst of back-to-back calls lasting >= 20 ms, one wait at its end; samples fill `--budget` seconds,
at least 3), SOL from benchmarks/sol.py, % SOL = SOL / time, TFLOP/s, GB/s (of the SOL bytes), peak
memory, the ratio to the case's cuBLAS line (vs_line = time / line time; the line is the case's
matmul work as cuBLAS batched dots with perfect balance, timed in the same process), and the relative error of the output against the first of jax.lax.ragged_dot, tokamax,
torch._grouped_mm that ran (rel_err_vs). Skips and failures are rows too, with reasons.

DIR receives the canonical layout: results.json, results.csv, summary.md, the plots (pct_sol.png,
roofline.png, latency.png) and a README.md naming the device, versions, commit and commands.
`--append` adds a suite to DIR's run (one call per suite keeps each call short); the run must be
of the same device and commit. `python -m benchmarks.readme` turns benchmarks/results/ into the
README's table and docs/performance.md.
"""

import os

# jax grows its pool on demand up to 65% of the card, so the torch peers timed in the same process
# have the rest (read when jax creates its GPU client: set before the first jax.devices()).
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.65")

import argparse
import concurrent.futures
import csv
import datetime
import json
import math
import shlex
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
from tqdm import tqdm

from benchmarks import cases as _cases
from benchmarks import impls as _impls
from benchmarks import provenance
from benchmarks import sol as _sol
from moe_pallas.dispatch import dispatch

RESULTS = Path(__file__).resolve().parent / "results"
_REFERENCE_ORDER = ("jax.lax.ragged_dot", "tokamax", "torch._grouped_mm")
FIELDS = (
    "suite",
    "case",
    "workload",
    "mode",
    "tokens",
    "impl",
    "status",
    "message",
    "time_ms",
    "sol_ms",
    "pct_sol",
    "tflops",
    "gbps",
    "intensity",
    "peak_mem_gib",
    "rel_err",
    "rel_err_vs",
    "vs_line",
    "hit_experts",
    "samples",
    "compile_s",
)


def _inputs(case: _cases.Case, params: dict) -> dict:
    x, topk_idx, topk_weight = _cases.make_tokens(case)
    inputs = {"x": x, "topk_idx": topk_idx, "topk_weight": topk_weight, "params": params}
    key = jax.random.key(case.seed + 1)
    if case.mode == "train":
        inputs["dout"] = jax.random.normal(key, x.shape, jnp.float32)
    if case.mode in ("gmm", "tgmm"):
        d = dispatch(topk_idx, case.workload.experts)
        m, k, n = case.gmm_shape()
        lhs = (
            x[d.row_token]
            if case.projection == "gate_up"
            else jax.random.normal(key, (m, k), x.dtype)
        )
        rhs = params["w_gate_up" if case.projection == "gate_up" else "w_down"]
        inputs.update(lhs=lhs, rhs=rhs, group_sizes=d.group_sizes)
        if case.mode == "tgmm":
            inputs["dy"] = jax.random.normal(jax.random.fold_in(key, 1), (m, n), x.dtype)
    return inputs


def _cost(case: _cases.Case, hit: int) -> _sol.Cost:
    w = case.workload
    if case.mode == "gmm":
        return _sol.gmm_cost(*case.gmm_shape(), hit)
    if case.mode == "tgmm":
        return _sol.tgmm_cost(*case.gmm_shape(), w.experts)
    return _sol.layer_cost(
        case.tokens, w.hidden, w.inter, w.top_k, hit, bias=w.bias, train=case.mode == "train"
    )


def measure(prep: _impls.Prepared, budget_s: float, min_samples: int = 3, max_samples: int = 50):
    """(median seconds per call, samples, last output): warm-up, then batched blocking samples."""
    prep.wait(prep.call())
    start = time.perf_counter()
    out = prep.call()
    prep.wait(out)
    single = max(time.perf_counter() - start, 1e-6)
    # A sample is >= ~20 ms of back-to-back calls, one wait at the end, so the launch and sync
    # latency of a single blocking call (0.1-0.35 ms on an H200) is amortised as in a training
    # loop instead of being timed with every call.
    inner = max(1, min(100, int(20e-3 / single)))
    samples = max(min_samples, min(max_samples, int(budget_s / (single * inner))))
    times = []
    for _ in range(samples):
        start = time.perf_counter()
        for _ in range(inner):
            last = prep.call()
        prep.wait(last)
        times.append((time.perf_counter() - start) / inner)
    return sorted(times)[len(times) // 2], samples, out


def _is_oom(err: BaseException) -> bool:
    text = f"{type(err).__name__} {err}".lower()
    return "resource_exhausted" in text or "out of memory" in text or "outofmemory" in text


def _error_text(err: BaseException, limit: int = 300) -> str:
    """The exception's type and the first line of its message, for a row's reason."""
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0][:limit] if text else ''}"


@jax.jit
def _squared_sums(out, ref):
    out, ref = out.astype(jnp.float32), ref.astype(jnp.float32)
    return jnp.sum(jnp.square(out - ref)), jnp.sum(jnp.square(ref))


def _rel_err(out, ref, slice_bytes: int = 256 * 2**20) -> float | None:
    """‖out − ref‖ / ‖ref‖ in float32, summed over slices of about `slice_bytes` along the first
    axis: a whole-array difference of a weight gradient (float32 [E, K, N], 16 GiB at SwiGLU-256)
    would be a third full-size array beside the two the row holds, and ran the tgmm cases out of
    memory. `out` and `ref` are jax or numpy arrays."""
    if out is None or ref is None or out.shape != ref.shape:
        return None
    if out.ndim == 0:
        out, ref = out.reshape(1), ref.reshape(1)
    step = max(1, slice_bytes // max(1, 4 * math.prod(out.shape[1:])))
    diff = norm = 0.0
    for start in range(0, out.shape[0], step):
        d, n = _squared_sums(out[start : start + step], ref[start : start + step])
        diff, norm = diff + float(d), norm + float(n)
    return math.sqrt(diff) / max(math.sqrt(norm), 1e-30)


def fail_non_finite(row: dict) -> dict:
    """A row timed "ok" whose output held NaN or inf (a non-finite error against its reference
    row) becomes an error with that reason: its time is not that of a correct result. Applied as
    rows are written and to stored runs as they are read (`benchmarks.readme`)."""
    err = row.get("rel_err")
    if row.get("status") == "ok" and err is not None and not math.isfinite(err):
        row.update(status="error", message=f"output not finite against {row['rel_err_vs']}")
    return row


def prepare_ahead(case, impl_names, inputs, workers: int, skip=None) -> dict:
    """{impl: Prepared, or the exception its prepare raised} for the implementations of
    `impls.COMPILE_AHEAD`, prepared in `workers` threads at once before anything of the case is
    timed: compilation releases the GIL, so the case's compiles overlap instead of queueing, and
    nothing is timed meanwhile. Empty with one worker or fewer than two such implementations."""
    skip = skip or {}
    ahead = [n for n in impl_names if n in _impls.COMPILE_AHEAD and n not in skip]
    if workers < 2 or len(ahead) < 2:
        return {}
    if any(_impls.weight_format(n) for n in ahead):
        _impls.read_bandwidth()  # the floors' bandwidth, measured before the threads start

    def prepare(name):
        try:
            return _impls.IMPLS[name](case, inputs)
        except Exception as err:  # noqa: BLE001 - raised again where the row is written
            # without its traceback, whose frames (the pool's among them) would hold the case's
            # arrays in a reference cycle
            return err.with_traceback(None)

    with concurrent.futures.ThreadPoolExecutor(min(workers, len(ahead))) as pool:
        return dict(zip(ahead, pool.map(prepare, ahead)))


def run_case(
    case, impl_names, params, device, budget_s, pbar=None, skip=None, compile_workers=1
) -> list[dict]:
    """Time `impl_names` on `case`; `skip` maps impl names to a reason not to run them here;
    `compile_workers` > 1 prepares the compile-only implementations at once (`prepare_ahead`)."""
    skip = skip or {}
    inputs = _inputs(case, params)
    ready = prepare_ahead(case, impl_names, inputs, compile_workers, skip)
    hit = _cases.hit_experts(inputs["topk_idx"], case.workload.experts)
    cost = _cost(case, hit)
    sol_s = cost.sol_seconds(device, inputs["x"].dtype)
    base = {
        "suite": case.suite,
        "case": case.name,
        "workload": case.workload.name,
        "mode": case.mode,
        "tokens": case.tokens,
        "sol_ms": sol_s * 1e3,
        "intensity": cost.intensity(),
        "hit_experts": hit,
    }
    rows, reference, reference_name = [], None, None
    for name in impl_names:
        row = {**base, "impl": name, "status": "ok", "message": ""}
        try:
            if name in skip:
                raise _impls.Skip(skip[name])
            prep = ready.pop(name) if name in ready else _impls.IMPLS[name](case, inputs)
            if isinstance(prep, Exception):
                raise prep
            seconds, samples, out = measure(prep, budget_s)
            comparable = prep.output(out)
            rel_err = _rel_err(comparable, reference)
            if reference is None and comparable is not None:
                reference, reference_name = comparable, name
            row.update(
                time_ms=seconds * 1e3,
                pct_sol=100 * sol_s / seconds,
                tflops=cost.flops / seconds / 1e12,
                gbps=cost.bytes / seconds / 1e9,
                samples=samples,
                compile_s=prep.compile_s,
                peak_mem_gib=None if prep.peak_bytes is None else prep.peak_bytes / 2**30,
                rel_err=rel_err,
                rel_err_vs=None if rel_err is None else reference_name,
                message=prep.note,
            )
            if _impls.weight_format(name) is not None:
                row["pct_sol"] = None  # bf16 bytes' SOL; the message gives the stored bytes' floor
            fail_non_finite(row)
        except _impls.Skip as err:
            row.update(status="oom" if "(oom)" in str(err) else "skipped", message=str(err))
        except NotImplementedError as err:
            row.update(status="skipped", message=f"not implemented: {err}")
        except Exception as err:  # noqa: BLE001 - a failing peer is a result, not a crash
            row.update(status="oom" if _is_oom(err) else "error", message=_error_text(err))
        finally:
            # A prepared-ahead exception raised here holds this frame in its traceback: left in
            # `prep`, that cycle would keep the case's arrays on the device until a garbage
            # collection, past the next cases' allocations.
            prep = out = comparable = None
            _impls.release_torch_cache()
        rows.append(row)
        if pbar is not None:
            pbar.set_postfix_str(f"{case.name} {name}: {row['status']}")
            pbar.update()
    line = next((r for r in rows if r["impl"] == _impls.LINE and r["status"] == "ok"), None)
    for r in rows:
        if line is not None and r["status"] == "ok":
            r["vs_line"] = r["time_ms"] / line["time_ms"]
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    """Mean time, % SOL and ratio to the cuBLAS line (mean and worst over the cases with a line)
    per (suite, impl) over the cases that ran; n_ok of n cases."""
    out = []
    for suite in dict.fromkeys(r["suite"] for r in rows):
        suite_rows = [r for r in rows if r["suite"] == suite]
        n = len({r["case"] for r in suite_rows})
        sol = sum({r["case"]: r["sol_ms"] for r in suite_rows}.values()) / n
        for impl in dict.fromkeys(r["impl"] for r in suite_rows):
            ok = [r for r in suite_rows if r["impl"] == impl and r["status"] == "ok"]
            mean = sum(r["time_ms"] for r in ok) / len(ok) if ok else None
            bf16_sol = _impls.weight_format(impl) is None
            ratios = [r["vs_line"] for r in ok if r.get("vs_line") is not None]
            out.append(
                {
                    "suite": suite,
                    "impl": impl,
                    "cases_ok": len(ok),
                    "cases": n,
                    "sol_ms": sol,
                    "mean_ms": mean,
                    "pct_sol": 100 * sol / mean if ok and len(ok) == n and bf16_sol else None,
                    "vs_line": sum(ratios) / len(ratios) if ratios else None,
                    "vs_line_max": max(ratios) if ratios else None,
                }
            )
    return out


def short_commit(meta: dict) -> str:
    """The run's commit, 12 hex digits (+ "-dirty" when the tree had uncommitted changes)."""
    commit = meta["commit"]
    return commit.split()[0].split("-")[0][:12] + ("-dirty" if "dirty" in commit else "")


def header(meta: dict) -> str:
    return (
        f"Device: {meta['device']} · jax {meta['versions']['jax']} · commit {short_commit(meta)} · "
        f"SOL ceilings: {meta['ceilings']}"
    )


def _unavailable(rows: list[dict]) -> set[tuple[str, str]]:
    """(suite, impl) pairs skipped because the implementation does not exist here or does not
    do the case (not importable, not implemented, a layer-only peer): left out of the tables."""
    return {
        (r["suite"], r["impl"])
        for r in rows
        if r["status"] == "skipped"
        and r["message"].startswith(("not implemented", "tokamax", "the loop over", "torch "))
    }


def summary_table(rows: list[dict], summary: list[dict]) -> list[str]:
    """Markdown lines: suite means per implementation (% SOL only when every case ran)."""
    with_line = any(s.get("vs_line") is not None for s in summary)  # runs that timed the line
    lines = [
        "| suite | implementation | cases ok | mean ms | SOL mean ms | % SOL |"
        + (" × line (worst) |" if with_line else ""),
        "|---|---|---|---|---|---|" + ("---|" if with_line else ""),
    ]
    unavailable = _unavailable(rows)
    for s in summary:
        if s["cases_ok"] == 0 and (s["suite"], s["impl"]) in unavailable:
            continue
        mean = "—" if s["mean_ms"] is None else f"{s['mean_ms']:.4g}"
        pct = "—" if s["pct_sol"] is None else f"{s['pct_sol']:.0f}%"
        ratio = "—" if s.get("vs_line") is None else f"{s['vs_line']:.2f} ({s['vs_line_max']:.2f})"
        lines.append(
            f"| {s['suite']} | {s['impl']} | {s['cases_ok']}/{s['cases']} | {mean} | "
            f"{s['sol_ms']:.4g} | {pct} |" + (f" {ratio} |" if with_line else "")
        )
    return lines


def not_timed(rows: list[dict]) -> list[str]:
    """Markdown bullets: every distinct (implementation, status, reason) of a cell not timed."""
    lines, seen = [], set()
    for r in rows:
        key = (r["impl"], r["status"], r["message"])
        if r["status"] != "ok" and key not in seen:
            seen.add(key)
            lines.append(f"- {r['impl']} ({r['status']}), e.g. {r['case']}: {r['message']}")
    return lines


def markdown(rows: list[dict], summary: list[dict], meta: dict) -> str:
    """summary.md: the header, the suite means and the cells not timed."""
    lines = [header(meta), "", *summary_table(rows, summary)]
    problems = not_timed(rows)
    if problems:
        lines += ["", "Not timed:", "", *problems]
    return "\n".join(lines) + "\n"


PLOTS = {
    "pct_sol.png": "% SOL of every implementation on every case, one panel per suite",
    "roofline.png": "achieved TFLOP/s against arithmetic intensity under the device's roof",
    "latency.png": "forward latency against tokens T per workload, with the SOL line",
}


def folder_readme(meta: dict, out_dir: Path) -> str:
    """README.md of a results folder: what ran where, how, and what each file is."""
    versions = ", ".join(f"{k} {v}" for k, v in meta["versions"].items())
    files = [
        (
            "results.json",
            (
                "`meta` (device, versions, commit, commands, ceilings), the suite means "
                "(`summary`) and one row per (case, implementation) (`rows`)"
            ),
        ),
        ("results.csv", "the rows as CSV; columns in docs/benchmarks.md, What is reported"),
        ("summary.md", "suite means per implementation and every reason a cell was not timed"),
        *((name, what) for name, what in PLOTS.items() if (out_dir / name).exists()),
    ]
    small = " · --small shapes (a smoke test)" if meta["small"] else ""
    where = (
        f"{meta['device']} ({meta['platform']}) · {versions} · commit `{meta['commit']}` · "
        f"SOL ceilings: {meta['ceilings']}{small}."
    )
    how = (
        "Written by `benchmarks/run.py`; `python -m benchmarks.readme` turns it into the README's "
        "performance table and docs/performance.md. Commands, from the repository root, in order:"
    )
    lines = [
        "# Benchmark results",
        "",
        where,
        "",
        how,
        "",
        "```bash",
        *meta["commands"],
        "```",
        "",
        "| file | what it is |",
        "|---|---|",
        *(f"| `{name}` | {what} |" for name, what in files),
    ]
    return "\n".join(lines) + "\n"


def write(out_dir: Path, rows: list[dict], meta: dict, plots: bool = True) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = summarize(rows)
    (out_dir / "results.json").write_text(
        json.dumps({"meta": meta, "summary": summary, "rows": rows}, indent=1)
    )
    with open(out_dir / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, FIELDS)
        writer.writeheader()
        for r in rows:
            writer.writerow({k: r.get(k) for k in FIELDS})
    (out_dir / "summary.md").write_text(markdown(rows, summary, meta))
    if plots:
        from benchmarks import plots as _plots

        _plots.write_all(rows, meta, out_dir)
    (out_dir / "README.md").write_text(folder_readme(meta, out_dir))


def _earlier(out_dir: Path, meta: dict, parser) -> dict | None:
    """The run already in out_dir, to be appended to; it must be of this device and commit."""
    path = out_dir / "results.json"
    if not path.exists():
        return None
    earlier = json.loads(path.read_text())
    for key in ("device", "commit", "small"):
        if earlier["meta"].get(key) != meta[key]:
            parser.error(
                f"--append: {path} holds a run with {key}={earlier['meta'].get(key)!r}, this one "
                f"has {meta[key]!r}; a run is one device and one commit: use another --out "
                "(BENCH_COMMIT=<sha> names the commit where the tree has no .git)."
            )
    return earlier


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--suite", default="gptoss", help=f"one of {_cases.SUITES} or 'all'; commas allowed"
    )
    parser.add_argument(
        "--impls",
        default=",".join(_impls.DEFAULT),
        help=f"comma-separated subset of: {', '.join(_impls.IMPLS)} (default: %(default)s)",
    )
    parser.add_argument("--small", action="store_true", help="tiny shapes (CPU smoke test)")
    parser.add_argument(
        "--out", type=Path, required=True, help="output folder (canonical: benchmarks/results)"
    )
    parser.add_argument("--ceiling", choices=("datasheet", "measured"), default="datasheet")
    parser.add_argument(
        "--device", choices=tuple(_sol.DEVICES), help="datasheet entry (default: detect)"
    )
    parser.add_argument(
        "--budget", type=float, default=0.2, help="seconds of timed samples per measurement"
    )
    parser.add_argument("--tokens", help="only cases with these token counts, e.g. 1,2048")
    parser.add_argument(
        "--full-peers",
        action="store_true",
        help="time jax.lax.ragged_dot on every suite case (default: the first only; "
        "its dense fallback compiles for ~20 s and runs ~0.1-0.3 s per case)",
    )
    parser.add_argument(
        "--time-limit",
        type=float,
        default=None,
        help="seconds; cases not started by then are recorded as skipped",
    )
    parser.add_argument(
        "--append",
        action="store_true",
        help="add to --out's results.json (rows of re-run cases are replaced): one suite per call",
    )
    parser.add_argument(
        "--compile-workers",
        type=int,
        default=1,
        help="threads that prepare a case's compile-only implementations at once, before any of "
        "them is timed (benchmarks.impls.COMPILE_AHEAD); compile_s is then each one's wall time "
        "among the others (default: %(default)s, one after another)",
    )
    parser.add_argument("--no-plots", action="store_true")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)

    impl_names = [s.strip() for s in args.impls.split(",") if s.strip()]
    unknown = [n for n in impl_names if n not in _impls.IMPLS]
    if unknown:
        parser.error(f"--impls: unknown {unknown}; choose from {list(_impls.IMPLS)}")
    # Outputs are checked against the first implementation that ran: the peers go first.
    impl_names.sort(key=lambda n: _REFERENCE_ORDER.index(n) if n in _REFERENCE_ORDER else 9)
    try:
        case_list = [
            c
            for s in args.suite.split(",")
            for c in _cases.suite_cases(s.strip(), small=args.small)
        ]
    except ValueError as err:
        parser.error(f"--suite: {err}")
    if args.tokens:
        keep = {int(t) for t in args.tokens.split(",")}
        case_list = [c for c in case_list if c.tokens in keep]

    if args.ceiling == "measured":
        device = _sol.measure_ceilings(*((256, 1 << 24) if args.small else ()))
    else:
        device = (
            _sol.DEVICES[args.device]
            if args.device
            else (_sol.detect_device() or _sol.DEVICES["h200"])
        )
    now = datetime.datetime.now(datetime.UTC)
    meta = {
        "date": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "device": jax.devices()[0].device_kind,
        "platform": jax.default_backend(),
        "commit": provenance.git_commit(),
        "commands": ["python -m benchmarks.run " + shlex.join(argv)],
        "ceilings": f"{device.name}: {device.peak_flops['bfloat16'] / 1e12:.0f} TFLOP/s bf16, "
        f"{device.bandwidth / 1e12:.2f} TB/s",
        "peak_flops_bf16": device.peak_flops["bfloat16"],
        "bandwidth": device.bandwidth,
        "small": args.small,
        "budget_s": args.budget,
        "versions": provenance.versions(),
    }
    out_dir = args.out

    rows, params, params_of, start = [], None, None, time.monotonic()
    earlier = _earlier(out_dir, meta, parser) if args.append else None
    if earlier is not None:
        names = {c.name for c in case_list}
        rows = [r for r in earlier["rows"] if r["case"] not in names]
        meta["commands"] = [*earlier["meta"]["commands"], *meta["commands"]]
        meta["wall_s"] = earlier["meta"].get("wall_s", 0.0)
    first_of_suite = {}
    for case in case_list:
        first_of_suite.setdefault(case.suite, case)
    with tqdm(
        total=len(case_list) * len(impl_names), desc="bench", unit="run", file=sys.stderr
    ) as pbar:
        for case in case_list:
            skip = {}
            if (
                not args.full_peers
                and case.suite in _cases.SUITE_TOKENS
                and first_of_suite[case.suite] != case
            ):
                skip["jax.lax.ragged_dot"] = (
                    "slow peer: timed on the suite's first case only (--full-peers)"
                )
            if args.time_limit is not None and time.monotonic() - start > args.time_limit:
                skip = dict.fromkeys(impl_names, f"--time-limit {args.time_limit:.0f} s reached")
            if params_of != case.workload:
                params = None  # free the previous workload's weights first
                params = _cases.make_params(case.workload)
                params_of = case.workload
            rows += run_case(
                case, impl_names, params, device, args.budget, pbar, skip, args.compile_workers
            )
            write(out_dir, rows, meta, plots=False)  # partial results survive an interrupted run
    meta["versions"] = provenance.versions()
    wall = (datetime.datetime.now(datetime.UTC) - now).total_seconds()
    meta["wall_s"] = meta.get("wall_s", 0.0) + wall
    write(out_dir, rows, meta, plots=not args.no_plots)
    print(markdown(rows, summarize(rows), meta))
    print(f"wrote {out_dir}")
    return out_dir


if __name__ == "__main__":
    main()
