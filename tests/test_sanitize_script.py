"""tests/sanitize.sh's bookkeeping, with stand-ins for compute-sanitizer and the cases: a tool
that dies in a case is reported by case and the run resumes after it, so no case goes unchecked."""

import os
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FAKE_SANITIZER = """#!/usr/bin/env bash
while [ "$1" != "$FAKE_PY" ]; do shift; done
"$@"; rc=$?
[ $rc -ge 128 ] && exit $rc
echo "========= ERROR SUMMARY: ${FAKE_ERRORS:-0} errors"
for i in $(seq 1 ${FAKE_TRAIL:-0}); do echo "E1203 [Compiling module $i] Very slow compile?"; done
exit $rc
"""
# Six cases; the process dies (SIGSEGV) in the cases FAKE_CRASH names, as compute-sanitizer can.
FAKE_CASES = """#!/usr/bin/env bash
start=0; stop=6
while [ $# -gt 0 ]; do
  case $1 in --list) seq 0 5 | sed 's/^/name/'; exit 0;; --start) start=$2;; --stop) stop=$2;; esac
  shift
done
for i in $(seq $start $((stop - 1))); do
  echo "case $i name$i"; echo "ok   1e-08  name$i"
  for c in $FAKE_CRASH; do [ $i = $c ] && kill -SEGV $$; done
  for c in $FAKE_SLOW; do [ $i = $c ] && sleep 60; done
done
echo "$((stop - start)) of $((stop - start)) cases exact within their bounds"
"""


def _run(
    tmp_path,
    errors="0",
    crash="2 4",
    tools=None,
    shards=None,
    trail="0",
    slow="",
    seconds=None,
    cases=None,
):
    for name, text in (("compute-sanitizer", FAKE_SANITIZER), ("cases", FAKE_CASES)):
        path = tmp_path / name
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    env |= {"FAKE_PY": str(tmp_path / "cases"), "FAKE_ERRORS": errors, "FAKE_CRASH": crash}
    env["FAKE_TRAIL"] = trail
    env["FAKE_SLOW"] = slow
    if seconds:
        env["SANITIZE_SECONDS"] = seconds
    if cases:
        env["SANITIZE_CASES"] = cases
    if tools:
        env["SANITIZE_TOOLS"] = tools
    if shards:
        env["SANITIZE_SHARDS"] = shards
    out = tmp_path / "out"
    result = subprocess.run(
        ["bash", str(ROOT / "tests/sanitize.sh"), str(out), str(tmp_path / "cases")],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return result.returncode, out


@pytest.mark.parametrize("shards", [None, "2", "4"])
def test_a_tool_crash_is_reported_by_case_and_the_rest_still_run(tmp_path, shards):
    status, out = _run(tmp_path, shards=shards)
    assert status == 1  # a crash is not a clean run
    for tool in ("memcheck", "racecheck", "synccheck"):
        log = (out / f"{tool}.log").read_text()
        started = [line.split()[1] for line in log.splitlines() if line.startswith("case ")]
        assert started == ["0", "1", "2", "3", "4", "5"]  # each case once, none skipped
        crashes = [line for line in log.splitlines() if line.startswith("CRASH")]
        assert [c.split()[3] for c in crashes] == ["2", "4"]
    summary = (out / "summary.txt").read_text()
    assert summary.count("CRASH in case 2") == 3 and "ERROR SUMMARY: 0 errors" in summary


def test_a_clean_run_passes_and_reported_errors_fail_it(tmp_path):
    status, out = _run(tmp_path, crash="")
    assert status == 0 and "6 of 6 cases exact" in (out / "summary.txt").read_text()
    status, out = _run(tmp_path, crash="", trail="60")  # XLA's late warnings after the summary
    assert status == 0 and "CRASH" not in (out / "summary.txt").read_text()
    status, out = _run(tmp_path, crash="", shards="2")
    assert (
        status == 0 and (out / "summary.txt").read_text().count("3 of 3 cases exact") == 6
    )  # 3 tools, 2 shards
    status, out = _run(tmp_path, errors="3", crash="")
    assert status == 1 and "ERROR SUMMARY: 3 errors" in (out / "summary.txt").read_text()


def test_a_subset_of_the_tools(tmp_path):
    status, out = _run(tmp_path, crash="", tools="racecheck")
    assert status == 0 and [p.name for p in sorted(out.glob("*.log"))] == ["racecheck.log"]
    assert (out / "summary.txt").read_text().startswith("## racecheck")


def test_the_time_budget_stops_a_slow_run_and_still_writes_the_summary(tmp_path):
    status, out = _run(tmp_path, crash="", slow="3", seconds="3", tools="memcheck racecheck")
    assert status == 1  # unchecked cases are not a clean run
    for tool in ("memcheck", "racecheck"):
        log = (out / f"{tool}.log").read_text()
        assert "TIMEOUT: SANITIZE_SECONDS spent; cases 3 to 5 not checked" in log
    assert (out / "summary.txt").read_text().count("TIMEOUT") == 2
    status, out = _run(tmp_path, crash="", seconds="60")  # a budget that suffices changes nothing
    assert status == 0 and "TIMEOUT" not in (out / "summary.txt").read_text()


@pytest.mark.parametrize("shards", [None, "2"])
def test_a_range_of_the_cases(tmp_path, shards):
    status, out = _run(tmp_path, crash="", tools="memcheck", cases="2:5", shards=shards)
    log = (out / "memcheck.log").read_text()
    started = [line.split()[1] for line in log.splitlines() if line.startswith("case ")]
    assert status == 0 and started == ["2", "3", "4"]
