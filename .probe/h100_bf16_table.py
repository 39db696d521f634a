"""Probe: on an H100, bf16 "auto" under the H100's own table (Triton gmm / gmm_t / tgmm) against
the H200's table (its Mosaic GPU gmm / gmm_t and cublas_slab tgmm entries), same process, same
inputs, medians of 3 alternating rounds of `run.measure`, plus the backend each product took.

    PYTHONPATH=$PWD python3 .probe/h100_bf16_table.py [CASE ...]   # CASE = workload:mode:T

Default cases: the train and compute-bound forward cases where the H100 run at 8ce324d read
1.53-1.70x the cuBLAS line. Prints one line per case: ms under each table, ratio, backends.
"""

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.9")

import statistics
import sys

import jax
import numpy as np

from benchmarks import cases as _cases
from benchmarks import impls as _impls
from benchmarks import run as _run
from moe_pallas import backends, tuning

CASES = sys.argv[1:] or [
    "gptoss:train:4096",
    "gptoss:train:16384",
    "swiglu256:train:2048",
    "gptoss:fwd:16384",
    "swiglu256:fwd:8192",
]
OWN = tuning.device_name()
TABLES = {"own": OWN, "h200": "NVIDIA H200"}
print(f"device {jax.devices()[0].device_kind}", flush=True)

picked: list[tuple[str, str]] = []
select = backends.select


def spy(policy, problem):
    backend = select(policy, problem)
    picked.append((problem.kernel, backend.name))
    return backend


backends.select = spy

for text in CASES:
    workload, mode, tokens = text.split(":")
    case = _cases.Case("probe", _cases.WORKLOADS[workload], int(tokens), mode)
    params = _cases.make_params(case.workload)
    inputs = _run._inputs(case, params)
    preps, took = {}, {}
    for label, device in TABLES.items():
        tuning.device_name = lambda device=device: device
        picked.clear()
        preps[label] = _impls.IMPLS["moe_pallas:auto"](case, inputs)
        took[label] = sorted(set(picked))
    tuning.device_name = lambda: OWN
    times = {label: [] for label in TABLES}
    outs = {}
    for _ in range(3):
        for label, prep in preps.items():
            seconds, _, out = _run.measure(prep, 0.3)
            times[label].append(seconds * 1e3)
            outs[label] = prep.output(out)
    med = {label: statistics.median(t) for label, t in times.items()}
    same = (
        "n/a"
        if outs["own"] is None
        else f"{np.max(np.abs(np.asarray(outs['own'], np.float32) - np.asarray(outs['h200'], np.float32))):.2e}"
    )
    print(
        f"{text}: own {med['own']:.3f} ms, h200 table {med['h200']:.3f} ms, "
        f"own/h200 {med['own'] / med['h200']:.3f}; max |diff| {same}; "
        f"own took {took['own']}; h200 table took {took['h200']}",
        flush=True,
    )
    del preps, inputs, params, outs
