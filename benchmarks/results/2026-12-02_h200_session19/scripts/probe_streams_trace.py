"""Session 19: did the streamed backward's kernels run concurrently? A jax.profiler trace of the
gpt-oss T = 2048 train step per `probe_streams` variant: per GPU stream (trace line) the kernels
and their time, and the overlap (sum of kernel times minus the time some kernel ran)."""

import sys

from benchmarks import cases as _cases
from benchmarks import impls as _impls
from benchmarks import run as _run
from benchmarks import trace

import probe_streams

for variant in sys.argv[1:]:
    probe_streams.use(variant)
    params = _cases.make_params(_cases.WORKLOADS["gptoss"])
    case = _cases.Case("layer", _cases.WORKLOADS["gptoss"], 2048, "train")
    prep = _impls._ours("auto")(case, _run._inputs(case, params))
    data = trace._traced({"step": (prep.call, ())}, f"/tmp/trace_{variant}")
    window = [
        (e.start_ns, e.start_ns + e.duration_ns)
        for p in data.planes if p.name.startswith("/host")
        for line in p.lines for e in line.events if e.name == "step#1"
    ][0]
    for plane in data.planes:
        if not plane.name.startswith("/device:GPU"):
            continue
        all_events = []
        for line in plane.lines:
            ev = [(e.start_ns, e.start_ns + e.duration_ns, e.name) for e in line.events
                  if window[0] <= e.start_ns <= window[1] and e.duration_ns > 0]
            if not ev:
                continue
            all_events += ev
            total = sum(b - a for a, b, _ in ev) / 1e6
            top = sorted(ev, key=lambda x: x[0] - x[1])[:4]
            print(f"{variant} line {line.name!r}: {len(ev)} events, {total:.3f} ms;",
                  "; ".join(f"{n[:40]} {(b - a) / 1e6:.3f}@{(a - window[0]) / 1e6:.2f}" for a, b, n in top))
        if all_events:
            kernels = sum(b - a for a, b, _ in all_events) / 1e6
            print(f"{variant}: " + trace.summary(all_events, top=8)[0] + f"; kernel time {kernels:.3f} ms")
    del params, prep
