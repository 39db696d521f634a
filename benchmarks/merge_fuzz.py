"""Merge the FUZZ_REPORT files of parallel fuzz processes into one JSON and print a table.

    python3 benchmarks/merge_fuzz.py OUT.json IN.json [IN.json ...]

Per test, over the processes that ran it: examples checked (summed), processes, seconds (the
longest process), examples per second and the first failure (drawn inputs and error). The inputs
are deleted once merged (the device tool returns at most 8 files).
"""

import json
import os
import sys
from pathlib import Path


def merge(paths: list[str]) -> dict:
    parts = [json.loads(Path(p).read_text()) for p in paths]
    tests: dict[str, dict] = {}
    for part in parts:
        for name, entry in part["tests"].items():
            merged = tests.setdefault(
                name, {"examples": 0, "processes": 0, "seconds": 0.0, "failure": None}
            )
            merged["examples"] += entry["examples"]
            merged["processes"] += 1
            merged["seconds"] = max(merged["seconds"], entry["seconds"])
            merged["failure"] = merged["failure"] or entry["failure"]
    return {
        **{k: parts[0][k] for k in ("profile", "max_examples_per_test", "backend", "device")},
        "processes": len(parts),
        "tests": tests,
        "examples_checked": sum(e["examples"] for e in tests.values()),
        "failures": sum(e["failure"] is not None for e in tests.values()),
    }


def main(out: str, *paths: str) -> int:
    merged = merge(list(paths))
    with open(out, "w") as f:
        json.dump(merged, f, indent=1)
    for p in paths:
        os.remove(p)
    for name, e in merged["tests"].items():
        rate = e["examples"] / max(e["seconds"], 1e-9)
        failure = e["failure"]["error"][:100] if e["failure"] else "-"
        print(
            f"{name:42s} {e['examples']:6d} examples {e['processes']:2d} proc {e['seconds']:7.1f} s"
            f" {rate:6.1f}/s  {failure}"
        )
    print(f"total: {merged['examples_checked']} examples, {merged['failures']} failing tests")
    return 1 if merged["failures"] else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
