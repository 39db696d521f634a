"""House rules on the tracked tree (`git ls-files`): the product carries no research log.

- No numbered work sessions in the package, tests, benchmarks, docs, notebooks, examples or the
  README: a finding is referenced by its commit (docs/decisions.md), not by when it was made.
- No calendar dates in Python, Markdown or notebook files (a benchmark run's own folder under
  benchmarks/results/ may name its date).
- benchmarks/results/ holds runs, one folder each with its result files: no nested folders, no
  probe scripts, patches, logs or per-call transcripts (history keeps those).

Each failure lists the offending file:line (or file), so it can be fixed where it stands. Skipped
outside a git checkout (an installed package has no tree to check).
"""

import fnmatch
import re
import subprocess
from pathlib import Path, PurePosixPath

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Built from pieces, so that this file does not match its own patterns.
SESSION = re.compile(r"\b" + "sess" + r"ions?\s+\d+", re.IGNORECASE)
ISO_DATE = re.compile("20" + r"\d\d-\d\d-\d\d")

SESSION_SCOPE = ("moe_pallas/", "tests/", "benchmarks/", "docs/", "notebooks/", "examples/")
DATE_SUFFIXES = (".py", ".md", ".ipynb")
RESULTS = "benchmarks/results/"
RESULTS_BANNED_SUFFIXES = (".diff", ".patch", ".log", ".py", ".sh")
RESULTS_BANNED_NAMES = ("call*_*.txt",)


def _tracked() -> list[str]:
    """Paths git tracks in this checkout, relative to its root (skip when there is none)."""
    try:
        top = subprocess.run(
            ["git", "rev-parse", "--show-toplevel"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        listing = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not in a git checkout")
    if Path(top).resolve() != ROOT:
        pytest.skip(f"{ROOT} is not the root of its git checkout ({top})")
    return [p for p in listing.decode("utf-8", "surrogateescape").split("\0") if p]


def _text_lines(path: str):
    """(line number, line) of a tracked text file; nothing for binaries or missing files."""
    file = ROOT / path
    if not file.is_file():
        return
    data = file.read_bytes()
    if b"\0" in data:
        return
    yield from enumerate(data.decode("utf-8", "replace").splitlines(), start=1)


def _offenders(paths, pattern) -> list[str]:
    return [
        f"{path}:{n}: {line.strip()[:120]}"
        for path in paths
        for n, line in _text_lines(path)
        if pattern.search(line)
    ]


def _report(what: str, offenders: list[str]) -> str:
    return f"{len(offenders)} {what}:\n" + "\n".join(offenders)


def test_no_numbered_sessions():
    paths = [p for p in _tracked() if p.startswith(SESSION_SCOPE) or p == "README.md"]
    offenders = _offenders(paths, SESSION)
    assert not offenders, _report(
        "lines name a numbered session; reference the commit instead (docs/decisions.md)",
        offenders,
    )


def test_no_dates_in_code_docs_or_notebooks():
    paths = [p for p in _tracked() if p.endswith(DATE_SUFFIXES) and not p.startswith(RESULTS)]
    offenders = _offenders(paths, ISO_DATE)
    assert not offenders, _report(
        "lines carry a date; a commit hash says which version a figure belongs to", offenders
    )


def test_results_hold_runs_only():
    offenders = []
    for path in _tracked():
        if not path.startswith(RESULTS):
            continue
        rel = PurePosixPath(path[len(RESULTS) :])
        if len(rel.parts) > 2:
            offenders.append(f"{path}: nested deeper than one run folder")
        elif rel.suffix in RESULTS_BANNED_SUFFIXES:
            offenders.append(f"{path}: a script, patch or log (history keeps those)")
        elif any(fnmatch.fnmatch(rel.name, pattern) for pattern in RESULTS_BANNED_NAMES):
            offenders.append(f"{path}: a per-call transcript (history keeps those)")
    assert not offenders, _report(f"files under {RESULTS} are not a run's results", offenders)
