"""Kernel-level summaries of jitted calls from a jax.profiler trace (shared by the profile scripts).

`profile(fns, trace_dir)` warms each call up, traces three blocking runs of each (the second is
the one summarised: no compile, no first-touch allocation) and a burst of back-to-back runs with
one wait at the end (as the benchmark runner times them), deletes the trace and returns per call
and device plane: the span from first to last kernel, the time some kernel was running, gaps over
20 us, and the kernels by total time; for the host, the time spent in conditionals and waits. The
burst shows what one blocking call hides: whether the GPU idles between calls.
"""

import collections
import glob
import shutil

import jax

BURST = 10


def _traced(fns: dict, trace_dir: str):
    for f, args in fns.values():
        for _ in range(3):
            jax.block_until_ready(f(*args))
    with jax.profiler.trace(trace_dir):
        for name, (f, args) in fns.items():
            for i in range(3):
                with jax.profiler.TraceAnnotation(f"{name}#{i}"):
                    jax.block_until_ready(f(*args))
            with jax.profiler.TraceAnnotation(f"{name}#burst"):
                for _ in range(BURST):  # one output alive at a time (a train step's grads are big)
                    out = f(*args)
                jax.block_until_ready(out)
    data = jax.profiler.ProfileData.from_file(
        glob.glob(f"{trace_dir}/**/*.xplane.pb", recursive=True)[0]
    )
    shutil.rmtree(trace_dir)
    return data


def summary(events, top: int = 14) -> list[str]:
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
    per = collections.defaultdict(lambda: [0.0, 0])
    for s, e, name in events:
        per[name[:60]][0] += e - s
        per[name[:60]][1] += 1
    big = [g for g in gaps if g > 20e3]
    span = (events[-1][1] - events[0][0]) / 1e6
    lines = [
        f"span {span:.3f} ms, busy {busy / 1e6:.3f} ms, {len(events)} kernels, "
        + f"{len(big)} gaps > 20 us totalling {sum(big) / 1e6:.3f} ms"
    ]
    ranked = sorted(per.items(), key=lambda kv: -kv[1][0])
    lines += [f"  {ns / 1e6:8.3f} ms  x{n:<3d} {name}" for name, (ns, n) in ranked[:top]]
    if len(ranked) > top:
        rest = ranked[top:]
        lines.append(
            f"  {sum(v[0] for _, v in rest) / 1e6:8.3f} ms  x{sum(v[1] for _, v in rest):<3d} "
            f"({len(rest)} other kernels)"
        )
    return lines


def profile(fns: dict, trace_dir: str) -> str:
    """The report of the module docstring for {name: (jitted fn, args)}, as text."""
    data = _traced(fns, trace_dir)
    windows = [
        (e.name, e.start_ns, e.start_ns + e.duration_ns)
        for plane in data.planes
        if plane.name.startswith("/host")
        for line in plane.lines
        for e in line.events
        if e.name.split("#")[0] in fns and e.name.endswith(("#1", "#burst"))
    ]
    out = []
    for name, a, b in sorted(windows, key=lambda w: w[1]):
        calls = BURST if name.endswith("#burst") else 1
        out.append(f"\n=== {name}: host window {(b - a) / 1e6 / calls:.3f} ms per call")
        for plane in data.planes:
            in_window = [
                (e.start_ns, e.start_ns + e.duration_ns, e.name)
                for line in plane.lines
                for e in line.events
                if a <= e.start_ns <= b and e.duration_ns > 0
            ]
            if plane.name.startswith("/device:GPU") and in_window:
                lines = summary(in_window, top=14 if calls == 1 else 3)
                out.append(f" {plane.name} ({calls} call{'s' * (calls > 1)}): " + "\n".join(lines))
            elif plane.name.startswith("/host"):
                waits = collections.defaultdict(float)
                for s, e, ev in in_window:
                    if any(w in ev for w in ("onditional", "Wait", "Memcpy")):
                        waits[ev[:60]] += e - s
                for ev, ns in sorted(waits.items(), key=lambda kv: -kv[1])[:6]:
                    out.append(f"   host {ns / 1e6:8.3f} ms  {ev}")
    return "\n".join(out)
