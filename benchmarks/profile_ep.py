"""Where the expert-parallel layer's time goes: a jax.profiler trace of the N-device forward, the
exchange alone (identity experts) and fwd+bwd, summarised per GPU kernel.

    PYTHONPATH=. python3 benchmarks/profile_ep.py --out DIR [--workload swiglu|gptoss] [--tokens 2048]

Options are bench_ep.py's (it reads them when imported): the first --tokens value is used, and
--exchange, --capacity-factor and --implementation apply as there.

Per call (the second of three traced, after warm-up) and device: the span from first to last
kernel, the time some kernel was running, gaps over 20 us, and the kernels by total time; for the
host, the time spent in conditionals and waits. The trace (xplane.pb) is deleted after reading.
"""

import collections
import glob
import shutil
import sys

import jax
import jax.numpy as jnp

import moe_pallas
from benchmarks import bench_ep
from moe_pallas import parallel


def _traced_calls(fns: dict, trace_dir: str):
    for f, args in fns.values():
        for _ in range(3):
            jax.block_until_ready(f(*args))
    with jax.profiler.trace(trace_dir):
        for name, (f, args) in fns.items():
            for i in range(3):
                with jax.profiler.TraceAnnotation(f"{name}#{i}"):
                    jax.block_until_ready(f(*args))
    return jax.profiler.ProfileData.from_file(
        glob.glob(f"{trace_dir}/**/*.xplane.pb", recursive=True)[0]
    )


def _summary(events) -> list[str]:
    """Span, busy time, gaps and the top kernels of [(start_ns, end_ns, name)]."""
    events.sort()
    busy, gaps, cur = 0.0, [], None
    for s, e, _ in events:
        if cur is None or s > cur[1]:
            if cur is not None:
                busy += cur[1] - cur[0]
                gaps.append(s - cur[1])
            cur = [s, e]
        else:
            cur[1] = max(cur[1], e)
    busy += cur[1] - cur[0]
    per = collections.defaultdict(float)
    for s, e, name in events:
        per[name[:60]] += e - s
    big = [g for g in gaps if g > 20e3]
    span = (events[-1][1] - events[0][0]) / 1e6
    lines = [
        f"span {span:.3f} ms, busy {busy / 1e6:.3f} ms, {len(events)} kernels, "
        + f"{len(big)} gaps > 20 us totalling {sum(big) / 1e6:.3f} ms"
    ]
    lines += [f"  {v / 1e6:8.3f} ms  {k}" for k, v in sorted(per.items(), key=lambda kv: -kv[1])]
    return lines[:15]


def main():
    args = bench_ep.ARGS
    tokens = int((args.tokens or "2048").split(",")[0])
    shape = bench_ep.WORKLOADS[args.workload]
    if args.small:
        shape = {**shape, **bench_ep.SMALL}
    n = args.devices or len(jax.devices())
    if n < 2:
        sys.exit("needs at least 2 devices")
    mesh = moe_pallas.expert_mesh(n, devices=jax.devices()[:n])
    inputs = bench_ep.place(mesh, *bench_ep.make_inputs(n * tokens, shape, jnp.bfloat16))
    exchange = parallel.resolve_exchange(args.exchange)
    ep = {"exchange": exchange, "capacity_factor": args.capacity_factor}
    fwd, train = bench_ep.layer_fns(args.workload, args.implementation, mesh, **ep)
    capacity = parallel.capacity_rows(exchange, tokens * shape["top_k"], n, args.capacity_factor)
    exchange = bench_ep.exchange_round_trip(
        mesh, exchange, tokens, shape["top_k"], shape["experts"], capacity
    )
    fns = {"fwd": (fwd, inputs), "exchange": (exchange, inputs[:3]), "train": (train, inputs)}
    trace_dir = f"{args.out}/trace"
    data = _traced_calls(fns, trace_dir)
    shutil.rmtree(trace_dir)
    windows = [
        (e.name, e.start_ns, e.start_ns + e.duration_ns)
        for plane in data.planes
        if plane.name.startswith("/host")
        for line in plane.lines
        for e in line.events
        if e.name.split("#")[0] in fns and e.name.endswith("#1")
    ]
    for name, a, b in sorted(windows, key=lambda w: w[1]):
        print(f"\n=== {name}: host window {(b - a) / 1e6:.3f} ms")
        for plane in data.planes:
            in_window = [
                (e.start_ns, e.start_ns + e.duration_ns, e.name)
                for line in plane.lines
                for e in line.events
                if a <= e.start_ns <= b and e.duration_ns > 0
            ]
            if plane.name.startswith("/device:GPU") and in_window:
                print(f" {plane.name}: " + "\n".join(_summary(in_window)))
            elif plane.name.startswith("/host"):
                waits = collections.defaultdict(float)
                for s, e, ev in in_window:
                    if any(w in ev for w in ("onditional", "Wait", "Memcpy")):
                        waits[ev[:60]] += e - s
                for ev, ns in sorted(waits.items(), key=lambda kv: -kv[1])[:6]:
                    print(f"   host {ns / 1e6:8.3f} ms  {ev}")


if __name__ == "__main__":
    main()
