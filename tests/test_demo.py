"""The CLI demo runs, prints its table, and fails loudly on a mismatch."""

import subprocess
import sys

import pytest

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


def test_demo_times_bursts_of_calls():
    """A fast call is timed in bursts of back-to-back calls (one wait per burst), as the
    benchmarks time: one blocking wait per call would time the host's launch latency."""
    import jax.numpy as jnp

    calls = []
    x = jnp.ones((4,))

    def fn(a):
        calls.append(1)
        return a

    assert demo._median_ms(fn, x, repeats=3) > 0
    assert len(calls) >= 2 + 3 * 10


def test_cli_usage():
    result = subprocess.run(
        [sys.executable, "-m", "moe_pallas"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 2 and "demo" in result.stdout


def test_demo_on_checkpoint_files(tmp_path, capsys):
    """--checkpoint: a folder holding a gpt-oss MXFP4 file (given as "dir/") and a per-expert FP8
    file, each run, checked and named in the table."""
    import numpy as np
    import safetensors.flax
    import safetensors.numpy

    from tests.test_weights import PREFIX, fp8_tensors, gpt_oss_mxfp4_tensors

    gpt_oss_dir = tmp_path / "gpt_oss_shards"
    gpt_oss_dir.mkdir()
    gpt_oss = gpt_oss_dir / "model.safetensors"
    tensors = gpt_oss_mxfp4_tensors(np.random.default_rng(0))
    safetensors.numpy.save_file(
        {f"model.layers.0.mlp.experts.{k}": v for k, v in tensors.items()}, str(gpt_oss)
    )
    fp8 = tmp_path / "fp8.safetensors"
    safetensors.flax.save_file(fp8_tensors(np.random.default_rng(1)), str(fp8))
    assert main(["demo", "--checkpoint", f"{gpt_oss_dir}/", "--top-k", "2", "--tokens", "9"]) == 0
    command = ["demo", "--checkpoint", str(fp8), "--layout", "per_expert", "--prefix", PREFIX]
    assert main([*command, "--top-k", "2", "--tokens", "5"]) == 0
    out = capsys.readouterr().out
    assert "gpt_oss_shards" in out and "fp8.safetensors" in out and "MISMATCH" not in out
    with pytest.raises(SystemExit) as exit_info:
        main([*command, "--top-k", "3"])  # two experts in the file
    assert exit_info.value.code == 2 and "--top-k=3 must be in [1, 2]" in capsys.readouterr().err
