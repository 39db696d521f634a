"""Probe (history only): the decode layer with the expert sort as ranks (`dispatch._rank_sort`, two
compare-all reductions) against XLA's sort + scatter (`_RANK_MAX = 0`), one process, alternating
rounds; per case the suites' timing (`run.measure`), the host's enqueue time per call, the
number of device kernels per call (profiler), and the outputs compared bit for bit.

    python -m benchmarks.probe_rank_sort OUT.json        # on the H200 (PROBE_SMALL=1: CPU)
"""

import json
import os
import sys
import time

import jax
import numpy as np

import moe_pallas
from benchmarks import cases as _cases
from benchmarks import impls as _impls
from benchmarks import run as _run
from moe_pallas import dispatch as _dispatch

TOKENS = (1, 4, 16, 64, 256)


def prepared(case, params, rank_max):
    _dispatch._RANK_MAX = rank_max  # read when the layer is traced
    x, idx, w = _cases.make_tokens(case)
    act = case.workload.activation
    fn = jax.jit(lambda x, i, w, p: moe_pallas.moe_experts(x, i, w, p, activation=act))
    compiled = fn.lower(x, idx, w, params).compile()
    args = (x, idx, w, params)
    return _impls.Prepared(
        call=lambda: compiled(*args),
        wait=jax.block_until_ready,
        peak_bytes=None,
        compile_s=0.0,
        output=lambda out: out,
    ), compiled.as_text().count("fusion(") + compiled.as_text().count("custom-call(")


def host_us(prep, calls=200):
    prep.wait(prep.call())
    t = time.perf_counter()
    for _ in range(calls):
        out = prep.call()
    enq = (time.perf_counter() - t) / calls
    prep.wait(out)
    return enq * 1e6


def main(out_path):
    rows = []
    default = _dispatch._RANK_MAX
    for wl_name in ("gptoss", "swiglu256"):
        small = bool(os.environ.get("PROBE_SMALL"))
        wl = (_cases.SMALL_WORKLOADS if small else _cases.WORKLOADS)[wl_name]
        params = _cases.make_params(wl)
        for t in TOKENS:
            case = _cases.Case("decode", wl, t)
            variants = {
                "rank": prepared(case, params, default),
                "xla_sort": prepared(case, params, 0),
            }
            outs = {k: np.asarray(v[0].call(), np.float32) for k, v in variants.items()}
            row = {
                "case": case.name,
                "bitwise_equal": bool(np.array_equal(outs["rank"], outs["xla_sort"])),
                "ops": {k: v[1] for k, v in variants.items()},
            }
            for rnd in range(3):
                for name, (prep, _) in variants.items():
                    ms = _run.measure(prep, budget_s=0.3)[0] * 1e3
                    row.setdefault(name + "_ms", []).append(round(ms, 5))
                    row.setdefault(name + "_host_us", []).append(round(host_us(prep), 2))
            rows.append(row)
            print(row, flush=True)
            with open(out_path, "w") as f:
                json.dump(rows, f, indent=1)
    return 0 if all(r["bitwise_equal"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "probe_rank_sort.json"))
