import importlib.util
import os

# Off GPU, most of the suite's time is XLA:CPU compiling small programs, and most of that is
# LLVM's optimisation passes (the tests run each program once or twice): without them the CPU
# suite takes about a third less time. Only where no CUDA plugin is installed, since on a GPU the
# same flag would also weaken the code of XLA's GPU kernels. Set before jax creates its backends;
# subprocesses of the tests inherit it. An explicit level in XLA_FLAGS wins.
_CUDA = any(importlib.util.find_spec(p) for p in ("jax_cuda13_plugin", "jax_cuda12_plugin"))
if not _CUDA and "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0"
    ).strip()

# xdist workers share one GPU (set before jax is imported). jax's default would give the first of
# them 75% of its memory and leave the others failing on their first allocation; without
# preallocation each worker's pool still keeps its peak, so three workers held the memory of the
# largest test each ran, and the full-shape tests ran out. The platform allocator hands memory back
# when arrays die: workers hold only what their current test holds.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    os.environ.setdefault("XLA_PYTHON_CLIENT_ALLOCATOR", "platform")

import jax
import pytest


def pytest_addoption(parser):
    parser.addoption(
        "--long",
        action="store_true",
        help="tests/test_fuzz.py: hypothesis profile 'long' (10,000 examples per test; for the GPU)",
    )
    parser.addoption(
        "--fuzz-minutes",
        type=float,
        default=None,
        help="tests/test_fuzz.py: total time budget of the fuzz tests, shared evenly among them",
    )


def pytest_configure(config):
    if config.getoption("--long"):  # read by tests/test_fuzz.py when it registers its profiles
        os.environ["HYPOTHESIS_PROFILE"] = "long"


def pytest_collection_modifyitems(config, items):
    if jax.default_backend() == "gpu":
        return
    skip = pytest.mark.skip(reason="needs a GPU backend (jax.default_backend() != 'gpu')")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
