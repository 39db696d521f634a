"""Helpers shared by the session-11 probes (run from the same folder)."""

import json
import time

import jax

from benchmarks import cases as _cases
from benchmarks import run as _run


def train_inputs(name, tokens):
    """(case, inputs) of the train suite's case for workload `name` at `tokens`."""
    w = _cases.WORKLOADS[name]
    case = _cases.Case("train", w, tokens, "train")
    return case, _run._inputs(case, _cases.make_params(w))


def wall_time(fn, *args, calls=20):
    """Median seconds per call over 5 bursts of back-to-back calls of the jitted fn; every output
    is materialised (no slicing that XLA could push into a dot)."""
    f = jax.jit(fn)
    jax.block_until_ready(f(*args))
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            o = f(*args)
        jax.block_until_ready(o)
        times.append((time.perf_counter() - t0) / calls)
    return sorted(times)[2]


def prepare_variants(case, inputs, obj, attr, variants):
    """{label: "auto"'s prepared step} with obj.attr set to each variant in turn, then restored."""
    from benchmarks import impls as _impls

    real, preps = getattr(obj, attr), {}
    for label, value in variants.items():
        setattr(obj, attr, value)
        preps[label] = _impls._ours("auto")(case, inputs)
    setattr(obj, attr, real)
    return preps


def alternate(preps, out, rounds=3, **labels):
    """Time each prepared train step (benchmarks.run.measure) in alternating rounds; print and
    append one JSON row per (round, implementation)."""
    for r in range(rounds):
        for k, p in preps.items():
            s, n, _ = _run.measure(p, 0.3)
            row = dict(**labels, impl=k, round=r, ms=s * 1e3, samples=n,
                       peak_gib=(p.peak_bytes or 0) / 2**30)
            print(json.dumps(row), flush=True)
            out.append(row)
