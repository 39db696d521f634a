"""The CLI demo runs, prints its table, and fails loudly on a mismatch."""

import pathlib
import subprocess
import sys

import jax.numpy as jnp
import pytest

from moe_pallas import demo
from moe_pallas.__main__ import main

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_demo_small_passes(monkeypatch, capsys):
    """On CPU the default demo runs xla and the project's Triton kernels (interpret mode) on both
    workloads, each checked against the float64 oracle; the interpreted rows are not timed."""
    assert demo.default_implementations() == ("xla", "pallas_triton")
    rows = []
    run = demo.run
    monkeypatch.setattr(demo, "run", lambda *args, **kw: rows.extend(run(*args, **kw)) or rows)
    assert main(["demo", "--size", "small"]) == 0
    out = capsys.readouterr().out
    assert "gpt-oss" in out and "swiglu-256" in out and "MISMATCH" not in out
    assert "4 results within 2e-02 relative error of the float64 reference" in out
    for workload in ("gpt-oss", "swiglu-256"):
        by_backend = {r["backend"]: r for r in rows if r["workload"] == workload}
        pallas = by_backend["pallas_triton"]
        assert pallas["implementation"] == "pallas_triton (interpret)"
        assert pallas["ok"] and 0 < pallas["rel_err"] <= demo.TOLERANCE["bfloat16"]
        assert pallas["ms"] is None and by_backend["xla"]["ms"] > 0
        assert f"{workload} " in out and "pallas_triton (interpret)" in out


def test_demo_exits_nonzero_on_mismatch(monkeypatch, capsys):
    monkeypatch.setitem(demo.TOLERANCE, "bfloat16", 0.0)
    monkeypatch.setattr(demo, "WORKLOADS", {"gptoss": demo.WORKLOADS["gptoss"]})
    assert main(["demo", "--size", "small", "--implementation", "xla"]) == 1
    assert "MISMATCH against the float64 reference in: gpt-oss on xla" in capsys.readouterr().out


def test_demo_implementation_choices(capsys):
    """--implementation takes the package's names only (exit 2 naming them)."""
    from moe_pallas.backends import IMPLEMENTATIONS

    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--implementation", "triton"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "invalid choice: 'triton'" in err
    assert all(name in err for name in IMPLEMENTATIONS)


def test_demo_mosaic_gpu_runs_what_it_cannot_tile_on_triton():
    """Mosaic GPU tiles N, K multiples of 16: under it the small gpt-oss case (H = 90) runs its
    matmuls on Triton and still meets the reference."""
    case = demo.make_case(demo.WORKLOADS["gptoss"], "small", jnp.bfloat16)
    (row,) = demo.run([case], "mosaic_gpu", repeats=1)
    assert row["ok"] and not row["skipped"]


def test_demo_times_bursts_of_calls():
    """A fast call is timed in bursts of back-to-back calls (one wait per burst), as the
    benchmarks time: one blocking wait per call would time the host's launch latency."""
    calls = []
    x = jnp.ones((4,))

    def fn(a):
        calls.append(1)
        return a

    assert demo._median_ms(fn, x, repeats=3) > 0
    assert len(calls) >= 2 + 3 * 10


def test_cli_usage(capsys):
    """`python -m moe_pallas` without a command, or with an unknown one, says so on stderr, names
    the commands and exits 2; --help prints the usage and exits 0."""
    result = subprocess.run(
        [sys.executable, "-m", "moe_pallas", "frobnicate"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2, result
    assert "unknown command 'frobnicate'" in result.stderr
    assert "choose one of: demo, train" in result.stderr
    assert main([]) == 2 and "a command is required" in capsys.readouterr().err
    assert main(["--help"]) == 0 and "demo" in capsys.readouterr().out


def test_demo_on_checkpoint_files(tmp_path, capsys):
    """--checkpoint: a folder holding a gpt-oss MXFP4 file (given as "dir/") and a per-expert FP8
    file, each run as stored (`moe_pallas.quant`), checked and named in the table."""
    import numpy as np
    import safetensors.flax
    import safetensors.numpy

    from tests.test_weights import PREFIX, fp8_tensors, gpt_oss_mxfp4_tensors

    gpt_oss_dir = tmp_path / "gpt_oss_shards"
    gpt_oss_dir.mkdir()
    gpt_oss = gpt_oss_dir / "model.safetensors"
    tensors = gpt_oss_mxfp4_tensors(np.random.default_rng(0), inter=64)  # kept as stored
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
    # the FP8 experts with fp8 activations, against the oracle on the dequantised weights
    assert main([*command, "--top-k", "2", "--tokens", "5", "--fp8-activations"]) == 0
    assert "results within 8e-02 relative error" in capsys.readouterr().out
    for refused in (
        ["demo", "--checkpoint", f"{gpt_oss_dir}/", "--fp8-activations"],  # MXFP4
        [*command, "--dequantize", "--fp8-activations"],
        ["demo", "--fp8-activations"],
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(refused)
        assert exit_info.value.code == 2 and "--fp8-activations" in capsys.readouterr().err
