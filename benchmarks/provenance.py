"""Where a benchmark ran: the commit of the tree and the versions of what it imported."""

import os
import platform
import subprocess
import sys
from pathlib import Path

import jax


def git_commit() -> str:
    """HEAD (+ "-dirty"); BENCH_COMMIT overrides it where the tree was copied without .git."""
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def versions() -> dict:
    out = {"python": platform.python_version(), "jax": jax.__version__}
    for mod in ("jaxlib", "torch", "tokamax"):
        module = sys.modules.get(mod)
        if module is not None:
            out[mod] = getattr(module, "__version__", "?")
    return out
