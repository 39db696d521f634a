"""Peak device memory of the fused expert block, forward and fwd+bwd, against its budget.

    python -m benchmarks.bench_memory [--cases fwd:gptoss:16384,train:gptoss:16384,...]
                                      [--out FILE.json] [--small]

Each case runs in a fresh process (jax's peak counter never resets): it creates the inputs
(constant weights: values do not change memory, and random generation would leave a transient
peak larger than the step's), compiles the step, reads `memory_stats()` before and after one run
and the compiled step's `memory_analysis()` (the temporaries and outputs XLA plans, Pallas
outputs included). The budget is what the step must
hold by construction (the fused expert block and its backward):
  fwd:   params, x, routing; temporaries a [M, I] and y [M, H] (M = T·k) in x's dtype; out.
  train: params and their grads, x, dx, dout (float32), routing and its grad; the residual
         h [M, 2I]; backward temporaries dh [M, 2I], a [M, I], dy [M, H], dx_rows [M, H].
A case passes if both the planned bytes (temporaries + outputs) and the measured step peak
(peak after − bytes in use before; an upper bound if the peak predates the step) stay within
`--slack` (default 1.25) × the budget's temporaries (budget − inputs already resident). Any O(T·k·E) buffer or per-row
copy of expert weights would be ≥ 10× the budget at these sizes. Exits 1 if a case fails
(`--small` runs the tiny workloads on any backend and judges nothing: fixed overheads dominate).
"""

import argparse
import json
import subprocess
import sys

DEFAULT_CASES = "fwd:gptoss:16384,train:gptoss:16384,fwd:swiglu256:8192,train:swiglu256:8192"


def _budget(workload, tokens: int, mode: str, params_bytes: int, itemsize: int = 2) -> dict:
    m = tokens * workload.top_k
    h, i = workload.hidden, workload.inter
    routing = tokens * workload.top_k * 8  # topk_idx int32, topk_weight float32
    if mode == "fwd":
        resident = params_bytes + tokens * h * itemsize + routing
        temporaries = m * (i + h) * itemsize + tokens * h * itemsize
    else:
        resident = params_bytes + tokens * h * (itemsize + 4) + routing  # x, dout float32
        temporaries = (
            params_bytes  # weight grads
            + tokens * h * itemsize
            + routing  # dx, d topk_weight (+ metadata)
            + m * 2 * i * itemsize  # residual h
            + m * (2 * i + i + 2 * h) * itemsize  # dh, a, dy, dx_rows
        )
    return {"resident": resident, "temporaries": temporaries, "total": resident + temporaries}


def run_case(spec: str, small: bool, implementation: str) -> dict:
    """One case in this process (call it in a fresh one)."""
    import jax
    import jax.numpy as jnp

    from benchmarks import cases as _cases
    from moe_pallas import moe_experts

    mode, name, tokens = spec.split(":")
    workload = (_cases.SMALL_WORKLOADS if small else _cases.WORKLOADS)[name]
    case = _cases.Case("layer", workload, int(tokens), "train" if mode == "train" else "fwd")
    params = jax.tree.map(
        lambda a: jnp.full(a.shape, 0.01, a.dtype),
        jax.eval_shape(lambda: _cases.make_params(workload)),
    )
    x, idx, w = _cases.make_tokens(case)
    f = lambda x, w, p: moe_experts(
        x, idx, w, p, activation=workload.activation, implementation=implementation
    )
    if mode == "fwd":
        step = jax.jit(f)
        args = (x, w, params)
    else:
        dout = jax.random.normal(jax.random.key(1), x.shape, jnp.float32)

        def step(x, w, p, dout):
            out, vjp = jax.vjp(f, x, w, p)
            return vjp(dout.astype(out.dtype))

        step = jax.jit(step)
        args = (x, w, params, dout)
    jax.block_until_ready(args)
    compiled = step.lower(*args).compile()
    analysis = compiled.memory_analysis()
    stats = jax.devices()[0].memory_stats() or {}
    before, peak_before = stats.get("bytes_in_use", 0), stats.get("peak_bytes_in_use")
    jax.block_until_ready(compiled(*args))
    stats = jax.devices()[0].memory_stats() or {}
    params_bytes = sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(params))
    budget = _budget(workload, case.tokens, mode, params_bytes)
    return {
        "case": spec,
        "device": jax.devices()[0].device_kind,
        "implementation": implementation,
        "bytes_in_use_before": before,
        "peak_before_step": peak_before,
        "peak_bytes_in_use": stats.get("peak_bytes_in_use"),
        "step_peak": None if not stats else stats["peak_bytes_in_use"] - before,
        "step_peak_is_upper_bound": bool(stats) and stats["peak_bytes_in_use"] == peak_before,
        "planned_bytes": analysis.temp_size_in_bytes + analysis.output_size_in_bytes,
        "budget": budget,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--cases", default=DEFAULT_CASES, help="mode:workload:tokens, comma-separated"
    )
    parser.add_argument("--slack", type=float, default=1.25)
    parser.add_argument("--small", action="store_true", help="tiny workloads (CPU smoke test)")
    parser.add_argument("--implementation", default="auto", help="moe_experts backend")
    parser.add_argument("--out", help="JSON file to write")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # child process: run this case
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(run_case(args.one, args.small, args.implementation)))
        return 0
    rows, failed = [], False
    for spec in (s for s in args.cases.split(",") if s):
        cmd = [
            sys.executable,
            "-m",
            "benchmarks.bench_memory",
            "--one",
            spec,
            "--implementation",
            args.implementation,
        ] + ["--small"] * args.small
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode:
            row = {"case": spec, "status": "error", "message": proc.stderr[-2000:]}
        else:
            row = json.loads(proc.stdout.strip().splitlines()[-1])
            temporaries = row["budget"]["temporaries"]
            used = [b for b in (row["planned_bytes"], row["step_peak"]) if b is not None]
            # Fixed overheads (routing metadata, schedules) dominate --small: not judged.
            within = max(used) <= args.slack * temporaries
            row["status"] = "smoke" if args.small else "ok" if within else "over"
            row["planned_over_budget"] = round(row["planned_bytes"] / temporaries, 3)
            if row["step_peak"] is not None:
                row["step_peak_over_budget"] = round(row["step_peak"] / temporaries, 3)
        failed |= row["status"] in ("over", "error")
        rows.append(row)
        gib = lambda b: (
            "-" if b is None else f"{b / 2**30:.3f} GiB" if b >= 2**26 else f"{b / 2**20:.2f} MiB"
        )
        print(
            f"{spec:24s} {row['status']:5s} step peak {gib(row.get('step_peak'))}   "
            f"budget temporaries {gib(row.get('budget', {}).get('temporaries'))}  "
            f"planned {gib(row.get('planned_bytes'))}  "
            f"{row.get('message', '')[-300:]}",
            flush=True,
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return int(failed)


if __name__ == "__main__":
    sys.exit(main())
