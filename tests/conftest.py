import os

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
