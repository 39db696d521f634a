"""tests/sanitize.sh's bookkeeping, with stand-ins for compute-sanitizer and the cases: a tool
that dies in a case is reported by case and the run resumes after it, so no case goes unchecked."""

import os
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# The tool's internal errors (the cases print them) count in its summary, as racecheck's do.
FAKE_SANITIZER = """#!/usr/bin/env bash
while [ "$1" != "$FAKE_PY" ]; do shift; done
seen=$(mktemp)
"$@" | tee "$seen"; rc=${PIPESTATUS[0]}
[ $rc -ge 128 ] && exit $rc
internal=$(grep -c "Internal Sanitizer Error" "$seen")
echo "========= ERROR SUMMARY: $((${FAKE_ERRORS:-0} + internal)) errors"
for i in $(seq 1 ${FAKE_TRAIL:-0}); do echo "E1203 [Compiling module $i] Very slow compile?"; done
exit $rc
"""
# Six cases; the process dies (SIGSEGV) in the cases FAKE_CRASH names, and in those FAKE_FLAKY names
# only where it runs more than that case (compute-sanitizer died so in long processes); the tool
# reports an internal error in those FAKE_INTERNAL names, likewise, and those FAKE_OFF names print
# a result off their bound (as memcheck's long processes once computed).
FAKE_CASES = """#!/usr/bin/env bash
start=0; stop=6
while [ $# -gt 0 ]; do
  case $1 in --list) seq 0 5 | sed 's/^/name/'; exit 0;; --start) start=$2;; --stop) stop=$2;; esac
  shift
done
for i in $(seq $start $((stop - 1))); do
  echo "case $i name$i"; echo "ok   1e-08  name$i"  # (a FAIL line after it makes the case off)
  for c in $FAKE_CRASH; do [ $i = $c ] && kill -SEGV $$; done
  for c in $FAKE_FLAKY; do [ $i = $c ] && [ $((stop - start)) -gt 1 ] && kill -SEGV $$; done
  for c in $FAKE_OFF; do
    [ $i = $c ] && [ $((stop - start)) -gt ${FAKE_OFF_ALONE:-1} ] && echo "FAIL 2.68e+00  name$i"
  done
  for c in $FAKE_INTERNAL; do
    [ $i = $c ] && [ $((stop - start)) -gt ${FAKE_INTERNAL_ALONE:-1} ] &&
      echo "========= Internal Sanitizer Error: Detected a failure to track a kernel launch."
  done
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
    flaky="",
    internal="",
    internal_alone="1",
    off="",
    off_alone="1",
):
    for name, text in (("compute-sanitizer", FAKE_SANITIZER), ("cases", FAKE_CASES)):
        path = tmp_path / name
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    env |= {"FAKE_PY": str(tmp_path / "cases"), "FAKE_ERRORS": errors, "FAKE_CRASH": crash}
    env["FAKE_TRAIL"] = trail
    env["FAKE_SLOW"] = slow
    env["FAKE_FLAKY"] = flaky
    env |= {"FAKE_INTERNAL": internal, "FAKE_INTERNAL_ALONE": internal_alone}
    env |= {"FAKE_OFF": off, "FAKE_OFF_ALONE": off_alone}
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
        assert started == ["0", "1", "2", "2", "3", "4", "4", "5"]  # a crashed case again, alone
        crashes = [line for line in log.splitlines() if line.startswith("CRASH")]
        assert [c.split()[3] for c in crashes] == ["2", "4"]
    summary = (out / "summary.txt").read_text()
    assert summary.count("CRASH in case 2") == 3 and "ERROR SUMMARY: 0 errors" in summary


@pytest.mark.parametrize("shards", [None, "2"])
def test_a_case_the_tool_died_in_passes_when_it_runs_clean_alone(tmp_path, shards):
    status, out = _run(tmp_path, crash="", flaky="1 4", tools="memcheck", shards=shards)
    log = (out / "memcheck.log").read_text()
    started = [line.split()[1] for line in log.splitlines() if line.startswith("case ")]
    assert sorted(started) == ["0", "1", "1", "2", "3", "4", "4", "5"]
    assert status == 0 and "CRASH" not in log
    summary = (out / "summary.txt").read_text()
    assert summary.count("TOOL DIED") == 2
    assert "exit status 0 (case 1 alone)" in summary and "exit status 0 (case 4 alone)" in summary
    status, out = _run(tmp_path, crash="4", flaky="1", tools="memcheck")  # dies alone too
    assert (
        status == 1
        and "CRASH in case 4 (exit status 139, alone too)" in (out / "memcheck.log").read_text()
    )


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


def test_an_internal_error_of_the_tool_reruns_its_case_alone(tmp_path):
    status, out = _run(tmp_path, crash="", internal="3", tools="racecheck")
    log = (out / "racecheck.log").read_text()
    assert "ERROR SUMMARY: 1 errors" in log  # counted by the tool, discounted once rerun clean
    assert "TOOL ERROR or OFF in case 3 (========= Internal Sanitizer Error" in log
    assert status == 0 and "exit status 0 (case 3 alone)" in log
    status, out = _run(tmp_path, crash="", internal="3", internal_alone="0", tools="racecheck")
    assert status == 1  # the internal error again alone: not a clean run
    status, out = _run(tmp_path, errors="1", internal="3", crash="", tools="racecheck")
    assert status == 1  # a report on a kernel beside an internal error still fails


def test_a_case_off_under_the_tool_passes_only_if_exact_alone(tmp_path):
    status, out = _run(tmp_path, crash="", off="2 5", tools="memcheck", shards="2")
    log = (out / "memcheck.log").read_text()
    assert log.count("\nFAIL 2.68e+00") == 2 and "TOOL ERROR or OFF in case 2 (FAIL" in log
    assert status == 0 and "exit status 0 (case 5 alone)" in log
    status, out = _run(tmp_path, crash="", off="2", off_alone="0", tools="memcheck")
    assert status == 1  # off again alone
    status, out = _run(tmp_path, crash="4", off="2", tools="memcheck")
    log = (out / "memcheck.log").read_text()
    assert status == 1 and "TOOL ERROR or OFF in case 2" in log  # rerun before the crash's
    assert "CRASH in case 4 (exit status 139, alone too)" in log


def test_the_cases_run_gmm_quant_at_exactly_the_configs_the_backend_looks_up():
    """Each quantised format's gmm_quant cases are the table's configs for its element type (its
    own entries where it has them, else the "*" ones, at every K the table names and at any
    other K), so the sanitizer sees the shipped configs and no config a format never runs."""
    from moe_pallas import quant, tuning
    from tests import sanitize

    quant_elements = {
        "fp8": "float8_e4m3fn",
        "fp8_block": "float8_e4m3fn",
        "mxfp4": "float4_e2m1fn",
    }
    device = tuning.table()["default_device"]
    entries = tuning.table()["devices"][device]["entries"]
    named_k = {e["k"] for e in entries if e["k"] != "*"}
    want = set()
    for fmt in quant.FORMATS:
        for kernel in ("gmm", "gmm_glu"):
            for rows in tuning.ROWS_CLASSES:
                for k in (*named_k, 1):  # 1: a K no entry names
                    found = tuning.lookup(
                        "pallas_triton",
                        kernel,
                        dtype=quant_elements[fmt],
                        k=k,
                        n=1,
                        rows=rows,
                        device=device,
                    )
                    want.add((kernel, str(found), fmt))
    got = set()
    for case in sanitize.cases():
        parts = case.name.split("/")
        if "gmm_quant" in parts:
            got.add((parts[1], parts[3], parts[-1]))
    assert got == want
    # Every format has entries of its own in the small class, whose "*" config it then skips.
    star_small_glu = tuning.lookup(
        "pallas_triton",
        "gmm_glu",
        dtype="bfloat16",
        k=2880,
        n=2880,
        rows="small",
        device=device,
    )
    assert ("gmm_glu", str(star_small_glu), "mxfp4") not in got
