"""The CLI demo runs, prints its table, and fails loudly on a mismatch."""

import subprocess
import sys

from moe_pallas import demo
from moe_pallas.__main__ import main


def test_demo_small_passes(capsys):
    assert main(["demo", "--size", "small"]) == 0
    out = capsys.readouterr().out
    assert "gpt-oss" in out and "swiglu-256" in out and "MISMATCH" not in out


def test_demo_exits_nonzero_on_mismatch(monkeypatch, capsys):
    monkeypatch.setitem(demo.TOLERANCE, "bfloat16", 0.0)
    assert main(["demo", "--size", "small"]) == 1
    assert "MISMATCH" in capsys.readouterr().out


def test_cli_usage():
    result = subprocess.run(
        [sys.executable, "-m", "moe_pallas"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 2 and "demo" in result.stdout
