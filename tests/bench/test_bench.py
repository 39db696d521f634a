"""The benchmark suite: SOL arithmetic against the project's target figures, the suites, and the runner
end to end on CPU with tiny shapes (no timings are asserted)."""

import argparse
import csv
import dataclasses
import json
import os
import subprocess
import sys
import threading
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import cases, impls, run, sol
from moe_pallas.kernels import config

H200 = sol.DEVICES["h200"]
ROOT = Path(__file__).resolve().parents[2]


def _layer_sol_ms(workload, tokens, hit=None, train=False):
    w = cases.WORKLOADS[workload]
    cost = sol.layer_cost(
        tokens, w.hidden, w.inter, w.top_k, hit or w.experts, bias=w.bias, train=train
    )
    return 1e3 * cost.sol_seconds(H200, jnp.bfloat16)


@pytest.mark.parametrize(("suite", "expected_ms"), [("gptoss", 1.456), ("swiglu256", 2.733)])
def test_suite_sol_means_match_the_targets(suite, expected_ms):
    tokens = cases.SUITE_TOKENS[suite]
    assert len(tokens) == 16
    mean = np.mean([_layer_sol_ms(suite, t) for t in tokens])
    assert abs(mean / expected_ms - 1) < 0.01, mean


@pytest.mark.parametrize(
    ("workload", "tokens", "hit", "train", "expected_ms"),
    [
        ("gptoss", 1, 4, False, 0.041),
        ("gptoss", 2048, None, False, 1.332),
        ("gptoss", 16384, None, False, 3.298),
        ("swiglu256", 1, 8, False, 0.084),
        ("swiglu256", 2048, None, False, 2.691),
        ("swiglu256", 8192, None, False, 3.335),
        ("gptoss", 2048, None, True, 4.0),
        ("swiglu256", 2048, None, True, 8.1),
    ],
)
def test_case_sol_matches_the_target_table(workload, tokens, hit, train, expected_ms):
    assert abs(_layer_sol_ms(workload, tokens, hit, train) / expected_ms - 1) < 0.02


def test_gmm_costs_add_up_to_the_layer():
    w = cases.WORKLOADS["swiglu256"]
    m = 1000 * w.top_k
    gate_up = sol.gmm_cost(m, w.hidden, 2 * w.inter, w.experts)
    down = sol.gmm_cost(m, w.inter, w.hidden, w.experts)
    layer = sol.layer_cost(1000, w.hidden, w.inter, w.top_k, w.experts)
    assert gate_up.flops + down.flops == layer.flops
    # The layer streams the same weights; its activations are x and out only.
    weights = w.experts * 3 * w.hidden * w.inter * 2
    assert layer.bytes == weights + 2 * 1000 * w.hidden * 2
    assert gate_up.bytes + down.bytes > layer.bytes
    assert sol.tgmm_cost(m, w.hidden, w.inter, w.experts).flops == 2.0 * m * w.hidden * w.inter


def test_suites_hold_the_target_cases():
    assert [c.tokens for c in cases.suite_cases("gptoss")][-4:] == [2293, 3011, 4096, 16384]
    assert [c.tokens for c in cases.suite_cases("swiglu256")][:2] == [2048, 2080]
    assert {c.mode for c in cases.suite_cases("train")} == {"train"}
    assert {c.mode for c in cases.suite_cases("gmm")} == {"gmm", "tgmm"}
    small = cases.suite_cases("all", small=True)
    assert max(c.workload.hidden for c in small) <= 64 and max(c.tokens for c in small) <= 128
    with pytest.raises(ValueError, match="suite"):
        cases.suite_cases("nope")


def test_hit_experts_counts_distinct_ids():
    rng = np.random.default_rng()
    idx = rng.integers(0, 16, size=(int(rng.integers(1, 9)), 2))
    assert cases.hit_experts(jnp.asarray(idx), 16) == len(np.unique(idx))
    case = cases.suite_cases("decode", small=True)[0]
    x, topk_idx, topk_weight = cases.make_tokens(case)
    assert x.shape == (case.tokens, case.workload.hidden) and topk_idx.shape == topk_weight.shape
    assert (
        1 <= cases.hit_experts(topk_idx, case.workload.experts) <= case.workload.top_k * case.tokens
    )


def test_measure_takes_the_median_of_blocking_samples():
    calls = []
    prep = impls.Prepared(
        call=lambda: calls.append(1) or jnp.ones(3),
        wait=jax.block_until_ready,
        peak_bytes=None,
        compile_s=0.0,
        output=lambda out: out,
    )
    seconds, samples, out = run.measure(prep, budget_s=0.01, min_samples=3, max_samples=5)
    assert 3 <= samples <= 5 and seconds > 0 and len(calls) >= samples + 2
    np.testing.assert_array_equal(out, np.ones(3))


def test_runner_end_to_end_on_cpu(tmp_path, monkeypatch):
    def oom(case, inputs):
        raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 9 GiB")

    monkeypatch.setitem(impls.IMPLS, "fake oom", oom)
    out = run.main(
        [
            "--suite",
            "decode",
            "--small",
            "--impls",
            "tokamax,fake oom,moe_pallas:pallas_triton,jax.lax.ragged_dot",
            "--out",
            str(tmp_path),
            "--budget",
            "0.01",
        ]
    )
    data = json.loads((out / "results.json").read_text())
    assert data["meta"]["platform"] == "cpu" and data["meta"]["commit"]
    rows = data["rows"]
    assert len(rows) == 4 * len(cases.suite_cases("decode", small=True))
    by_impl = {}
    for r in rows:
        by_impl.setdefault(r["impl"], set()).add(r["status"])
    assert by_impl == {
        "jax.lax.ragged_dot": {"ok"},
        "moe_pallas:pallas_triton": {"ok"},
        "tokamax": {"skipped"},
        "fake oom": {"oom"},
    }
    for r in rows:  # our kernels (interpret mode) checked against the peer, bf16 in and out
        if r["impl"] == "moe_pallas:pallas_triton":
            assert r["rel_err_vs"] == "jax.lax.ragged_dot" and r["rel_err"] < 2e-2
    for r in rows:
        if r["status"] == "ok":
            assert r["time_ms"] > 0 and r["sol_ms"] > 0 and r["peak_mem_gib"] > 0
            assert r["pct_sol"] == pytest.approx(100 * r["sol_ms"] / r["time_ms"])
    with open(out / "results.csv") as f:
        assert len(list(csv.DictReader(f))) == len(rows)
    assert "decode" in (out / "summary.md").read_text()
    for name in ("pct_sol.png", "roofline.png", "latency.png"):
        assert (out / name).stat().st_size > 1000
    folder_readme = (out / "README.md").read_text()
    impls_arg = "'tokamax,fake oom,moe_pallas:pallas_triton,jax.lax.ragged_dot'"
    command = f"python -m benchmarks.run --suite decode --small --impls {impls_arg} "
    assert data["meta"]["commands"] == [f"{command}--out {tmp_path} --budget 0.01"]
    for text in (*data["meta"]["commands"], data["meta"]["commit"], "jax 0.11.2", "roofline.png"):
        assert text in folder_readme


def test_peer_layer_glue_matches_reference():
    """The glue the peers share (benchmarks/impls.py) computes the layer the reference computes."""
    from moe_pallas.reference import moe_experts_reference

    for name in ("gptoss", "swiglu256"):
        case = cases.Case(
            "t", cases.SMALL_WORKLOADS[name], int(np.random.default_rng().integers(1, 24))
        )
        params = cases.make_params(
            case.workload, jnp.float32, seed=int(np.random.default_rng().integers(1 << 30))
        )
        x, topk_idx, topk_weight = cases.make_tokens(case, jnp.float32)

        def ragged_dot(lhs, rhs, gs):
            return jax.lax.ragged_dot(
                lhs, rhs, gs, precision="highest", preferred_element_type=jnp.float32
            )

        # jitted: eagerly, each op compiles on its own
        activation = case.workload.activation
        glue = partial(impls._ragged_layer, activation=activation, ragged_dot=ragged_dot)
        out = jax.jit(glue)(x, topk_idx, topk_weight, params)
        oracle = partial(moe_experts_reference, activation=activation)
        ref = jax.jit(oracle)(x, topk_idx, topk_weight, params)
        assert float(jnp.linalg.norm(out - ref) / jnp.linalg.norm(ref)) < 1e-5


def _qarray_decode(qvalue, scale):
    """What a qwix QArray (qvalue, scale) stands for: qvalue times scale repeated over its tile."""
    reps = [q // s for q, s in zip(qvalue.shape, scale.shape)]
    full = scale.astype(jnp.float32)
    for axis, r in enumerate(reps):
        full = jnp.repeat(full, r, axis=axis)
    return qvalue.astype(jnp.float32) * full


@pytest.mark.parametrize("fmt", ["fp8", "fp8_block", "mxfp4"])
def test_qarray_parts_decode_to_the_dequantised_weight(fmt):
    """tokamax's quantised peer gets the weight our format stores, exactly (float32 scales); fp8
    at K = 1920, whose rows are stored padded to 2048 bytes (`quant.row_pitch`), which neither
    the QArray nor the weight-read floor counts."""
    from moe_pallas import quant

    rng = np.random.default_rng()
    k, n = (1920, 384) if fmt == "fp8_block" else (1920, 40)
    if fmt == "mxfp4":
        k = int(rng.integers(1, 4)) * 64
    w = jnp.asarray(rng.standard_normal((3, k, n)) * rng.uniform(1e-3, 10), jnp.float32)
    qw = quant.quantize_weight(w, fmt)
    qvalue, scale = impls.qarray_parts(qw, jnp.float32)
    assert qvalue.shape == (3, k, n) and scale.shape[2] == n
    np.testing.assert_array_equal(_qarray_decode(qvalue, scale), qw.dequantize(jnp.float32))
    if fmt != "mxfp4":
        assert qw.values.shape == (3, n, 2048)
        assert impls._bytes_read(qw) == 3 * n * k + qw.scales.nbytes
    if fmt == "fp8_block":  # block scales that do not tile K and N in 128s have no QArray form
        with pytest.raises(impls.Skip, match="multiples of 128"):
            impls.qarray_parts(quant.quantize_weight(w[:, :200], fmt), jnp.float32)


@pytest.mark.parametrize("fmt", ["fp8", "mxfp4"])
def test_tokamax_quantised_glue_on_cpu(fmt, monkeypatch):
    """The tokamax+FMT layer with stand-ins for tokamax and qwix (a QArray is dequantised and
    multiplied by jax.lax.ragged_dot) equals the reference on the dequantised weights; fp8 hands
    tokamax float16 activations and scales (its sm90 kernel converts e4m3 to the scales' dtype,
    which the H200 does to float16 only), and its output is x's dtype again."""
    import types

    from moe_pallas import quant
    from moe_pallas.reference import moe_experts_reference

    @dataclasses.dataclass
    class QArray:
        qvalue: jax.Array
        scale: jax.Array
        qtype: object

        shape = property(lambda self: self.qvalue.shape)

    def ragged_dot(lhs, rhs, group_sizes):
        assert isinstance(rhs, QArray)
        assert rhs.qtype == (jnp.float4_e2m1fn if fmt == "mxfp4" else jnp.float8_e4m3fn)
        assert lhs.dtype == rhs.scale.dtype == (jnp.bfloat16 if fmt == "mxfp4" else jnp.float16)
        w = _qarray_decode(rhs.qvalue, rhs.scale).astype(lhs.dtype)
        return jax.lax.ragged_dot(lhs, w, group_sizes, preferred_element_type=jnp.float32)

    monkeypatch.setattr(impls, "_tokamax_ragged_dot", lambda: ragged_dot)
    monkeypatch.setitem(sys.modules, "qwix", types.SimpleNamespace(QArray=QArray))
    case = cases.Case(
        "t", cases.SMALL_WORKLOADS["gptoss"], int(np.random.default_rng().integers(1, 24))
    )
    x, topk_idx, topk_weight = cases.make_tokens(case, jnp.bfloat16)
    params = cases.make_params(
        case.workload, jnp.bfloat16, seed=int(np.random.default_rng().integers(1 << 30))
    )
    inputs = {"x": x, "topk_idx": topk_idx, "topk_weight": topk_weight, "params": params}
    prep = impls.IMPLS[f"tokamax+{fmt}"](case, inputs)
    out = prep.output(prep.wait(prep.call()))
    assert out.dtype == jnp.bfloat16 and ("float16" in prep.note) == (fmt != "mxfp4")
    out = np.asarray(out, np.float64)
    dense = quant.dequantize_experts(quant.quantize_experts(params, fmt), jnp.float32)
    ref = moe_experts_reference(
        x.astype(jnp.float32), topk_idx, topk_weight, dense, activation="gptoss"
    )
    ref = np.asarray(ref, np.float64)
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 2e-2
    assert "weight-read floor" in prep.note


def test_our_fp8_activations_impl_on_cpu():
    """moe_pallas:auto+fp8_block_a8: our layer on fp8_block weights with fp8_activations, within
    the quantised activations' bound of the bf16 layer on the dequantised weights, with its
    weight-read floor; the name carries its format, and the harness prepares it alone (its own
    copy of the weights)."""
    from moe_pallas import quant
    from moe_pallas.reference import moe_experts_reference

    impl = "moe_pallas:auto+fp8_block_a8"
    assert impls.weight_format(impl) == "fp8_block_a8" and impl not in impls.COMPILE_AHEAD
    case = cases.Case("t", cases.SMALL_WORKLOADS["swiglu256"], 16)
    x, topk_idx, topk_weight = cases.make_tokens(case, jnp.bfloat16)
    params = cases.make_params(case.workload, jnp.bfloat16, seed=3)
    inputs = {"x": x, "topk_idx": topk_idx, "topk_weight": topk_weight, "params": params}
    prep = impls.IMPLS[impl](case, inputs)
    out = np.asarray(prep.output(prep.wait(prep.call())), np.float64)
    dense = quant.dequantize_experts(quant.quantize_experts(params, "fp8_block"), jnp.float32)
    ref = moe_experts_reference(
        x.astype(jnp.float32), topk_idx, topk_weight, dense, activation="swiglu"
    )
    ref = np.asarray(ref, np.float64)
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 8e-2
    assert "weight-read floor" in prep.note


def test_our_fp8_training_impl_on_cpu():
    """moe_pallas:auto+fp8_training: our train step with fp8_training, its gradients within the
    FP8 bound of the bf16 step's; forward cases are skipped; a bf16 row (no weight format),
    prepared with the compile-only ones; its README cell gives its speed over our bf16 step."""
    from benchmarks import readme

    impl = impls.FP8_TRAINING
    assert impls.weight_format(impl) is None and impl in impls.COMPILE_AHEAD
    case = cases.Case("t", cases.SMALL_WORKLOADS["gptoss"], 16, mode="train")
    inputs = run._inputs(case, cases.make_params(case.workload, jnp.bfloat16, seed=3))
    got = impls.IMPLS[impl](case, inputs)
    want = impls.IMPLS["moe_pallas:auto"](case, inputs)
    (_, grads), (_, want_grads) = (p.wait(p.call()) for p in (got, want))
    assert got.output(grads) is None  # train rows carry no output to compare
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads), strict=True):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        assert 0 < np.linalg.norm(a - b) / np.linalg.norm(b) < 1.5e-1
    with pytest.raises(impls.Skip, match="train cases only"):
        impls.IMPLS[impl](cases.Case("t", cases.SMALL_WORKLOADS["gptoss"], 16), inputs)
    row = {"impl": impl, "status": "ok", "time_ms": 2.0, "pct_sol": 40.0, "vs_line": 1.1}
    bf16 = {"impl": "moe_pallas:auto", "status": "ok", "time_ms": 3.0}
    assert readme._cell(row, bf16) == "2 (40%, 1.50× bf16's speed, 1.10× line)"


def _synthetic_run(folder: Path) -> dict:
    """A results.json as benchmarks.run writes it: two suites, a skipped and a failed cell."""
    meta = {
        "date": "1999-12-31T00:00:00Z",
        "device": "NVIDIA H200",
        "platform": "gpu",
        "commit": "0123456789abcdef0123456789abcdef01234567",
        "commands": [
            "python -m benchmarks.run --suite gptoss --out benchmarks/results",
            "python -m benchmarks.run --suite decode --out benchmarks/results --append",
        ],
        "ceilings": "h200: 989 TFLOP/s bf16, 4.80 TB/s",
        "peak_flops_bf16": 989e12,
        "bandwidth": 4.8e12,
        "small": False,
        "budget_s": 0.2,
        "versions": {"python": "3.12.3", "jax": "0.11.2", "torch": "2.11.0"},
    }
    rows = []
    for suite, tokens in (("gptoss", (2048, 4096)), ("decode", (1,))):
        for t in tokens:
            case = f"gptoss/fwd/T={t}"
            base = {"suite": suite, "case": case, "workload": "gptoss", "mode": "fwd"}
            base |= {"tokens": t, "sol_ms": 1.2, "intensity": 100.0, "hit_experts": 128}
            ours = {"impl": "moe_pallas:auto", "status": "ok", "message": "", "time_ms": 1.5}
            ours |= {"pct_sol": 80.0, "tflops": 1.0, "gbps": 1.0, "rel_err": 4e-3}
            ours |= {"rel_err_vs": "torch._grouped_mm"}
            torch_ = {"impl": "torch._grouped_mm", "status": "ok", "message": "", "time_ms": 3.0}
            torch_ |= {"pct_sol": 40.0, "tflops": 0.5, "gbps": 0.5}
            rows += [base | torch_, base | ours]
            if suite == "decode":  # fp8 weights: a floor of their own, a % SOL of bf16 bytes
                fp8 = {"impl": "moe_pallas:auto+fp8", "status": "ok", "time_ms": 1.0}
                fp8 |= {"pct_sol": 120.0, "tflops": 1.5, "gbps": 1.5}
                fp8 |= {"message": "weight-read floor 0.8 ms (3592 MB at 4.49 TB/s measured)"}
                fp8 |= {"rel_err": 0.05, "rel_err_vs": "torch._grouped_mm"}
                rows.append(base | fp8)
            tokamax = {"impl": "tokamax", "status": "error", "message": "ValueError: tiling 8"}
            if t == 4096:
                rows.append(base | tokamax)
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps({"meta": meta, "summary": [], "rows": rows}))
    return meta


def test_readme_and_performance_page_come_from_the_results_folder(tmp_path):
    """benchmarks.readme on a synthetic run: the README block between the markers (and nothing
    else) and the whole performance page are generated from results.json alone."""
    from benchmarks import readme

    results = tmp_path / "benchmarks" / "results"
    meta = _synthetic_run(results)
    page, performance = tmp_path / "README.md", tmp_path / "docs" / "performance.md"
    page.write_text(f"# top\n\n{readme.BEGIN}\nold\n{readme.END}\n\n## after\n")
    readme.main(
        ["--results", str(results), "--readme", str(page), "--performance", str(performance)]
    )
    text = page.read_text()
    assert text.startswith("# top\n") and text.endswith("## after\n") and "old" not in text
    assert "commit 0123456789ab ·" in text and "NVIDIA H200" in text
    assert "| gptoss | moe_pallas:auto | 2/2 | 1.5 | 1.2 | 80% |" in text
    assert "| gptoss | tokamax | 0/2 | — |" in text  # a failing peer stays in the table
    assert "![% SOL per case](benchmarks/results/pct_sol.png)" in text
    assert "(docs/performance.md)" in text
    # Quantised weights: per case on the performance page, not in the README's suite means.
    assert "moe_pallas:auto+fp8" not in text and "Quantised expert weights" in text
    body = performance.read_text()
    assert meta["commit"] in body and all(c in body for c in meta["commands"])
    assert "### gptoss" in body and "### decode" in body
    for case in ("gptoss/fwd/T=2048", "gptoss/fwd/T=4096", "gptoss/fwd/T=1"):
        assert f"| {case} | 128 | 1.2 |" in body
    assert "| gptoss/fwd/T=4096 | 128 | 1.2 | 3 (40%) | 1.5 (80%) | — |" in body
    assert "- tokamax (error), e.g. gptoss/fwd/T=4096: ValueError: tiling 8" in body
    # Quantised weights: speed over our bf16 layer and time over their floor, no % SOL.
    assert "| 1 (1.50× bf16's speed, 1.25× floor) |" in body
    assert "| decode | moe_pallas:auto+fp8 | 1/1 | 1 | 1.2 | — |" in body
    # Their error against bf16 weights is the quantisation's, stated apart from ours.
    assert "Largest relative error of our outputs in this suite: 0.004 (moe_pallas:auto" in body
    assert "(the quantisation error): fp8 0.05." in body
    assert "median" in body and "experts the case's routing hits" in body
    assert "1999-12-31" not in body + text  # the run is named by its commit, not a date
    readme.update(results, page, performance)  # regenerating changes nothing
    assert page.read_text() == text and performance.read_text() == body
    page.write_text("no markers")
    with pytest.raises(ValueError, match="markers"):
        readme.update(results, page, performance)
    with pytest.raises(FileNotFoundError, match="benchmarks.run"):
        readme.update(tmp_path / "empty", page, performance)


def test_append_adds_a_suite_to_an_earlier_run(tmp_path, monkeypatch):
    # One commit for both calls: the checkout's own would change if the tree were edited between.
    monkeypatch.setenv("BENCH_COMMIT", "c" * 40)
    common = [
        "--small",
        "--impls",
        "jax.lax.ragged_dot",
        "--budget",
        "0.01",
        "--out",
        str(tmp_path),
    ]
    run.main(["--suite", "gmm", "--tokens", "16", "--no-plots", *common])
    run.main(["--suite", "train", "--tokens", "16", "--no-plots", "--append", *common])
    data = json.loads((tmp_path / "results.json").read_text())
    assert [s["suite"] for s in data["summary"]] == ["gmm", "train"]
    assert [c.split()[4] for c in data["meta"]["commands"]] == ["gmm", "train"]
    assert all(c in (tmp_path / "README.md").read_text() for c in data["meta"]["commands"])


def test_append_refuses_a_run_of_another_commit(tmp_path, monkeypatch, capsys):
    """A canonical run is one commit: appending from another tree is refused, exit 2."""
    common = ["--small", "--impls", "jax.lax.ragged_dot", "--budget", "0.01", "--no-plots"]
    common += ["--suite", "decode", "--tokens", "1", "--out", str(tmp_path)]
    monkeypatch.setenv("BENCH_COMMIT", "a" * 40)
    run.main(common)
    monkeypatch.setenv("BENCH_COMMIT", "b" * 40)
    with pytest.raises(SystemExit) as exit_info:
        run.main([*common, "--append"])
    assert exit_info.value.code == 2 and "one commit" in capsys.readouterr().err
    assert json.loads((tmp_path / "results.json").read_text())["meta"]["commit"] == "a" * 40


def _table_copy(tmp_path) -> Path:
    from moe_pallas import tuning

    copy = tmp_path / "tuning.json"
    copy.write_text(tuning.TABLE_PATH.read_text())
    return copy


@pytest.fixture
def time_once(monkeypatch):
    """The autotuner's timing as one jitted run of each candidate's calls. `bench_gmm.time_op`
    (test_gmm_benchmark_on_cpu runs it) compiles every call twice and runs it some 20 times: most
    of these tests' time in interpret mode, where the times mean nothing; here every candidate
    still runs and gets a time, and the fastest is written."""
    import time

    from benchmarks import autotune_gmm

    def time_once(op, carry, *args, target_s):
        start = time.perf_counter()
        jax.block_until_ready(jax.jit(op)(carry, *args))
        return time.perf_counter() - start

    monkeypatch.setattr(autotune_gmm, "time_op", time_once)


def test_autotune_writes_entries_that_the_table_looks_up(tmp_path, time_once):
    """The autotuner on tiny shapes (interpret mode) with --write into a temp copy of the table:
    each kernel's "small" entry is replaced by a timed candidate that `tuning.lookup` returns,
    the other classes and backends stay, and the package's own table is untouched."""
    from benchmarks import autotune_gmm
    from moe_pallas import tuning

    package_table = tuning.TABLE_PATH.read_bytes()
    table, log = _table_copy(tmp_path), tmp_path / "log.json"
    before = json.loads(table.read_text())["devices"]["NVIDIA H200"]["entries"]
    argv = [
        "--small",
        "--classes",
        "small",
        "--workloads",
        "gptoss",
        "--write",
        "--table",
        str(table),
    ]
    entries = autotune_gmm.main([*argv, "--device", "NVIDIA H200", "--log", str(log)])
    assert sorted(e["kernel"] for e in entries) == sorted(tuning.KERNELS)
    candidates = [dataclasses.asdict(c) for c in autotune_gmm.SMALL_CANDIDATES]
    after = json.loads(table.read_text())["devices"]["NVIDIA H200"]["entries"]
    assert len(after) == len(before)  # replaced, not added
    for e in entries:
        assert (e["backend"], e["dtype"], e["k"], e["n"], e["rows"]) == (
            "pallas_triton",
            "*",
            "*",
            "*",
            "small",
        )
        assert e["config"] in candidates
        for dtype, k, n in ((jnp.bfloat16, 2880, 5760), (jnp.float32, 64, 32)):
            found = tuning.lookup(
                "pallas_triton",
                e["kernel"],
                dtype=dtype,
                k=k,
                n=n,
                rows="small",
                device="NVIDIA H200",
                path=table,
            )
            assert found == e["config"]
            assert config.BlockConfig(**found) in autotune_gmm.SMALL_CANDIDATES
    untouched = [e for e in before if e["rows"] != "small" or e["backend"] != "pallas_triton"]
    assert all(e in after for e in untouched)
    timed = json.loads(log.read_text())["log"]
    assert {e["kernel"] for e in timed if "total_ms" in e} == set(tuning.KERNELS)
    assert tuning.TABLE_PATH.read_bytes() == package_table
    # A device new to the table is added with its SM count, and only its own entries apply.
    with pytest.raises(ValueError, match="num_sms"):
        tuning.write_entries(entries, "Test GPU", path=table)
    tuning.write_entries(entries, "Test GPU", num_sms=8, path=table)
    data = json.loads(table.read_text())
    assert data["devices"]["Test GPU"] == {"num_sms": 8, "entries": entries}
    assert tuning.lookup(
        "pallas_triton",
        "tgmm",
        dtype=jnp.bfloat16,
        k=1,
        n=1,
        rows="small",
        device="Test GPU",
        path=table,
    ) == next(e["config"] for e in entries if e["kernel"] == "tgmm")
    assert tuning.TABLE_PATH.read_bytes() == package_table


def test_autotune_quantised_weights_writes_entries_of_their_element_type(tmp_path, time_once):
    """--weights fp8 times gmm_quant and gmm_quant_t (interpret mode, tiny shapes) and writes
    float8_e4m3fn entries that fp8 lookups return, leaving the bf16 ("*") and mxfp4 entries as
    they were; the kernels without a quantised path are refused by name."""
    from benchmarks import autotune_gmm
    from moe_pallas import tuning

    table = _table_copy(tmp_path)
    before = json.loads(table.read_text())["devices"]["NVIDIA H200"]["entries"]
    argv = ["--small", "--weights", "fp8", "--classes", "small", "--workloads", "gptoss"]
    argv += ["--kernels", "gmm", "gmm_glu", "gmm_t", "--write", "--table", str(table)]
    entries = autotune_gmm.main([*argv, "--device", "NVIDIA H200"])
    assert sorted(e["kernel"] for e in entries) == ["gmm", "gmm_glu", "gmm_t"]
    after = json.loads(table.read_text())["devices"]["NVIDIA H200"]["entries"]
    for e in entries:
        assert e["dtype"] == "float8_e4m3fn" and e["rows"] == "small"
        found = tuning.lookup(
            "pallas_triton",
            e["kernel"],
            dtype=jnp.float8_e4m3fn,
            k=2880,
            n=2880,
            rows="small",
            device="NVIDIA H200",
            path=table,
        )
        assert found == e["config"]
    assert [e for e in before if e["dtype"] != "float8_e4m3fn"] == [
        e for e in after if e["dtype"] != "float8_e4m3fn"
    ]
    with pytest.raises(ValueError, match="gmm, gmm_glu and gmm_t"):
        autotune_gmm._candidates("tgmm", "small", weights="mxfp4")
    with pytest.raises(ValueError, match="around-table"):
        autotune_gmm._candidates("gmm", "small", around_table=True, weights="fp8")
    tiny = autotune_gmm._candidates("gmm_glu", "tiny", weights="mxfp4")
    assert tiny and all(c.block_m == 16 and not c.weights_first for c in tiny)
    small = autotune_gmm._candidates("gmm", "small", weights="mxfp4")
    first = [dataclasses.replace(c, weights_first=False) for c in small if c.weights_first]
    assert first and first == [c for c in small if not c.weights_first and c.block_m >= 64]
    assert not any(c.weights_first for c in autotune_gmm._candidates("gmm", "small", weights="fp8"))
    for kernel in ("gmm", "gmm_glu"):  # 256-row tiles for the large class only
        rows = {
            (w, cls): {c.block_m for c in autotune_gmm._candidates(kernel, cls, weights=w)}
            for w in ("fp8", "mxfp4")
            for cls in ("small", "large")
        }
        assert [key for key, ms in rows.items() if 256 in ms] == [
            ("fp8", "large"),
            ("mxfp4", "large"),
        ]


def test_autotune_fp8_activations_writes_a8_entries_the_backend_reads(
    tmp_path, monkeypatch, time_once
):
    """--weights fp8_a8 times the forward's gmm and gmm_glu with FP8 activations (interpret mode,
    tiny shapes) and writes "gmm_a8" / "gmm_glu_a8" float8_e4m3fn entries; the pallas_triton
    backend gives them to FP8-activation calls only, fp8's weights-only calls keeping theirs;
    the backward's gmm_t is refused by name."""
    from benchmarks import autotune_gmm
    from moe_pallas import tuning
    from moe_pallas.backends import pallas_triton

    table = _table_copy(tmp_path)
    before = json.loads(table.read_text())["devices"]["NVIDIA H200"]["entries"]
    argv = ["--small", "--weights", "fp8_a8", "--classes", "small", "--workloads", "gptoss"]
    argv += ["--kernels", "gmm", "gmm_glu", "--write", "--table", str(table)]
    entries = autotune_gmm.main([*argv, "--device", "NVIDIA H200"])
    assert sorted(e["kernel"] for e in entries) == ["gmm_a8", "gmm_glu_a8"]
    assert all(e["dtype"] == "float8_e4m3fn" and e["rows"] == "small" for e in entries)
    after = json.loads(table.read_text())["devices"]["NVIDIA H200"]["entries"]
    assert after == before + entries  # added beside fp8's, nothing replaced
    monkeypatch.setattr(tuning, "TABLE_PATH", table)
    monkeypatch.setattr(tuning, "device_name", lambda: "NVIDIA H200")
    tuning._load.cache_clear()
    for kernel, activation in (("gmm", None), ("gmm_glu", "gptoss")):
        call = (kernel, jnp.float8_e4m3fn, 4 * 2048, 128, 2880, 2880, activation)
        a8 = next(e["config"] for e in entries if e["kernel"] == f"{kernel}_a8")
        fp8 = next(
            e["config"]
            for e in before
            if (e["kernel"], e["dtype"], e["rows"]) == (kernel, "float8_e4m3fn", "small")
        )
        got = pallas_triton.config(*call, fp8_activations=True)
        assert (got.block_m, got.block_k, got.num_warps) == (
            a8["block_m"],
            a8["block_k"],
            a8["num_warps"],
        )
        got = pallas_triton.config(*call)
        assert (got.block_m, got.num_warps) == (fp8["block_m"], fp8["num_warps"])
    tuning._load.cache_clear()
    with pytest.raises(ValueError, match="gmm and gmm_glu"):
        autotune_gmm._candidates("gmm_t", "small", weights="fp8_a8")
    glu = autotune_gmm._candidates("gmm_glu", "large", weights="fp8_a8")
    assert glu and all(c.block_k == 128 and c.block_n <= 64 for c in glu)


def test_autotune_seeds_from_the_table_and_keeps_every_field(tmp_path):
    """--around-table starts from `tuning.lookup`'s config; configs with bucketed M and tails
    (min_block_m, tail_m) survive the JSON round trip."""
    from benchmarks import autotune_gmm
    from moe_pallas import tuning

    seeded = autotune_gmm._candidates("gmm", "small", around_table=True)
    table_cfg = tuning.lookup(
        "pallas_triton", "gmm", dtype=jnp.bfloat16, k=2880, n=5760, rows="small", device=None
    )
    assert seeded[0] == config.BlockConfig(**table_cfg)
    assert {c.tail_m for c in seeded} >= {0, table_cfg["tail_m"]}
    assert autotune_gmm._candidates("tgmm", "large", around_table=True) == [
        autotune_gmm.table_config("tgmm", "large", None)
    ]
    table = _table_copy(tmp_path)
    configs = {
        ("gmm_glu", "large"): config.BlockConfig(128, 256, 64, 8, 8, 4, min_block_m=16),
        ("gmm_t", "small"): config.BlockConfig(128, 256, 64, 8, 8, 4, tail_m=64),
        ("tgmm", "tiny"): config.BlockConfig(32, 128, 128, 1, 4, 4),
    }
    entries = [autotune_gmm.entry(k, cls, cfg) for (k, cls), cfg in configs.items()]
    tuning.write_entries(entries, "Test GPU", num_sms=8, path=table)
    for (kernel, cls), cfg in configs.items():
        assert autotune_gmm.table_config(kernel, cls, "Test GPU", path=table) == cfg


def test_autotune_refuses_to_write_interpret_mode_times(tmp_path, capsys):
    from benchmarks import autotune_gmm

    with pytest.raises(SystemExit) as exit_info:
        autotune_gmm.main(["--small", "--write", "--table", str(_table_copy(tmp_path))])
    assert exit_info.value.code == 2 and "interpret mode" in capsys.readouterr().err


def test_expert_parallel_benchmark_on_simulated_devices(tmp_path):
    """bench_ep.py in --small mode (2 simulated CPU devices, a subprocess: the device count is
    fixed before jax starts): the EP layer equals one device and every step is timed."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    common = ["--small", "--out", str(tmp_path), "--tokens", "32"]
    run_ = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_ep", *common],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
        check=False,
    )
    assert run_.returncode == 0, run_.stderr[-3000:]
    result = tmp_path / "ep_swiglu_2dev.json"
    data = json.loads(result.read_text())
    assert data["correctness"]["fwd_rel_err"] < 1e-2 and data["correctness"]["grad_rel_err"] < 5e-2
    assert {r["mode"] for r in data["rows"]} == {"fwd", "fwd+bwd"}
    assert all(r["ms_ep"] > 0 and r.get("dropped_rows", 0) == 0 for r in data["rows"])
    assert data["commit"] and data["command"].startswith("python -m benchmarks.bench_ep --small")


def test_tgmm_benchmark_on_cpu(tmp_path):
    """bench_tgmm.py --small: the table's and an explicit Triton config, moe_pallas.tgmm on two
    backends (interpret mode), the fill and padded-cuBLAS references, one JSON row per case;
    every output agrees with the first Triton one."""
    from benchmarks import bench_tgmm

    out = tmp_path / "tgmm.json"
    argv = ["--small", "--cases", "gptoss:gate_up:64", "gptoss:down:64", "--out", str(out)]
    bench_tgmm.main([*argv, "--configs", "16,16,16,2,4,2", "--impls", "pallas_triton,mosaic_gpu"])
    data = json.loads(out.read_text())
    assert data["commit"] and data["command"].startswith("python -m benchmarks.bench_tgmm --small")
    results = data["results"]
    assert [r["case"] for r in results] == ["gptoss:gate_up:64", "gptoss:down:64"]
    for r in results:
        labels = [k for k in r if k.startswith(("triton", "moe_pallas"))]
        assert labels[0].startswith("triton table ") and len(labels) == 4
        assert all(r[k]["ms"] > 0 for k in labels) and r["fill"]["ms"] > 0 and r["cublas"]["ms"] > 0
        assert max(r["rel_err"].values()) < 1e-5


def test_gmm_benchmark_on_cpu(tmp_path):
    """bench_gmm.py --small: gmm and tgmm through the public API per backend, and the lax peer."""
    from benchmarks import bench_gmm

    out = tmp_path / "gmm.json"
    argv = ["--small", "--workloads", "swiglu256", "--tokens", "16", "--impls", "pallas_triton"]
    bench_gmm.main([*argv, "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [(r["proj"], r["M"]) for r in rows] == [("gate_up", 64), ("down", 64)]
    for r in rows:
        for label in ("pallas_triton gmm", "pallas_triton tgmm", "jax.lax.ragged_dot"):
            assert r[label]["ms"] > 0, r[label]


def test_memory_benchmark_on_cpu(tmp_path):
    """bench_memory.py --small: each case in its own process, planned and measured bytes and the
    budget recorded (--small judges nothing: fixed overheads dominate tiny shapes)."""
    from benchmarks import bench_memory

    out = tmp_path / "memory.json"
    cases_ = "fwd:gptoss:16,train:swiglu256:16"
    argv = ["--small", "--cases", cases_, "--implementation", "pallas_triton", "--out", str(out)]
    assert bench_memory.main(argv) == 0
    rows = json.loads(out.read_text())
    assert [r["case"] for r in rows] == cases_.split(",")
    for r in rows:
        assert r["status"] == "smoke", r.get("message")
        assert r["planned_bytes"] > 0 and r["budget"]["temporaries"] > 0


SASS_LOOP = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_0:
        /*0010*/                   LDS.U8 R2, [R3] ;
        /*0020*/                   F2F.BF16.F16 R4, R2 ;
        /*0030*/              @!P0 MUFU.EX2 R5, R4 ;
        /*0040*/                   HMMA.16816.F32.BF16 R8, R4, R6, R8 ;
        /*0050*/                   LDS.U8 R2, [R3+0x1] ;
        /*0058*/                   STL.64 [R1+0x8], R8 ;
        /*005c*/                   LDL R9, [R1+0x10] ;
        /*0060*/               @P1 BRA `(.L_x_0) ;
.L_x_1:
        /*0070*/                   STG.E [R10], R8 ;
        /*0080*/                   BRA `(.L_x_1);
"""


def _sass_args(**overrides) -> argparse.Namespace:
    """benchmarks.sass's command line for a small gmm: a 16 x 64 x 128 tile, K = 256, N = 128."""
    args = argparse.Namespace(
        weights="bf16",
        rows=16,
        block_n=64,
        block_k=128,
        warps=4,
        stages=3,
        k=256,
        n=128,
        experts=4,
        activation=None,
        large_scales=False,
        weights_first=False,
        fp8_activations=False,
        transposed=False,
    )
    vars(args).update(overrides)
    return args


def test_sass_loop_mix_counts_the_longest_loop():
    """benchmarks.sass: the K loop is the longest backward branch's body; opcodes keep their first
    modifier, predicates are not opcodes, and the conversion/SFU pipes and the local loads and
    stores (spills) are counted apart."""
    from benchmarks import sass

    counts = sass.loop_mix(SASS_LOOP)
    assert counts == {
        "LDS.U8": 2,
        "F2F.BF16": 1,
        "MUFU.EX2": 1,
        "HMMA.16816": 1,
        "STL.64": 1,
        "LDL": 1,
        "BRA": 1,
    }
    assert sass.slow_pipe(counts) == 2 and sass.spills(counts) == 2
    with pytest.raises(ValueError, match="no backward branch"):
        sass.loop_mix(SASS_LOOP.replace("BRA `(.L_x_0)", "BRA `(.L_x_1)").replace(".L_x_1:\n", ""))


@pytest.mark.parametrize(
    "registers, shared_kib, warps, programs",
    [
        (70, 73, 4, 3),  # shared memory bounds: 3 x 74 KiB of 228
        (40, 41, 4, 5),
        (168, 8, 8, 1),  # registers bound: 168 a thread is 5376 a warp, 43008 a program
        (24, 1, 4, 16),  # warps bound: 64 a SM
        (16, 0, 1, 32),  # programs bound
    ],
)
def test_sass_programs_per_sm(registers, shared_kib, warps, programs):
    """benchmarks.sass's occupancy: the least of what sm_90's registers (256 a warp at a time),
    shared memory (1 KiB reserved a program), warps and program slots allow."""
    from benchmarks import sass

    resources = sass.Resources(registers=registers, shared=shared_kib * 1024, warps=warps)
    assert resources.programs_per_sm == programs


@pytest.mark.parametrize(
    "weights, activation, fp8_activations",
    [
        ("bf16", None, False),
        ("fp8", None, False),
        ("mxfp4", None, False),
        ("mxfp4", "swiglu", False),
        ("fp8_block", "swiglu", True),
    ],
)
def test_sass_captures_the_kernels_triton_module(weights, activation, fp8_activations):
    """benchmarks.sass lowers the gmm (plain or GLU) for an abstract H200 and captures its Triton
    module (the compile itself needs upstream Triton and is not run here); with fp8 activations
    its 64-row tile's dots are e4m3 ones that may sum a whole K step in the tensor core."""
    from benchmarks import sass

    args = _sass_args(  # (16-row fp8 activations: the byte-pair view)
        weights=weights,
        rows=64 if fp8_activations else 16,
        activation=activation,
        fp8_activations=fp8_activations,
    )
    ttir = sass.triton_module(args)
    assert ttir.startswith("module") and ttir.count("tt.dot") >= (2 if activation else 1)
    assert ("arith.divf" in ttir) == (activation is not None)  # silu's 1 / (1 + exp(-x))
    assert ("maxNumImpreciseAcc = 128" in ttir) == fp8_activations
    assert ("inline_asm" in ttir) == (weights not in ("bf16", "fp8_block"))  # the PTX decodes
    # fp8 on a 16-row tile: byte pairs, e4m3 -> f16 by the hardware in the PTX
    assert ("cvt.rn.f16x2.e4m3x2" in ttir) == (weights == "fp8")
    assert ("mul.rn.bf16x2 $0, t, $2;" in ttir) == (weights == "mxfp4")  # one scale multiply


@pytest.mark.parametrize("weights,dots", [("bf16", 1), ("fp8_block", 2), ("mxfp4", 4)])
def test_sass_captures_the_transposed_product(weights, dots):
    """benchmarks.sass --transposed: the backward's product with wᵀ, bf16's through gmm's
    transpose_rhs and the stored formats' through gmm_quant_t (values read as byte pairs; a dot
    for fp8's low and one for its high bytes, one per quarter of mxfp4's words)."""
    from benchmarks import sass

    ttir = sass.triton_module(_sass_args(weights=weights, transposed=True))
    assert ttir.count("tt.dot") == dots
    assert ("xi16" in ttir) == (weights != "bf16")  # the uint16 byte pairs (signless in TTIR)


def test_trace_report_splits_each_case_against_the_line():
    """benchmarks.trace's report: a summary row per case (step ratio, the matmul cores of both,
    what ours adds around them, idle time), then the case's own tables."""
    from benchmarks import trace

    def side(step_ms, span_us, classes):
        return {
            "step_ms": step_ms,
            "span_us": span_us,
            "kernels": {},
            "classes": classes,
            "note": "",
        }

    result = {
        "case": "gptoss/fwd/T=16384",
        "flops": 3e12,
        "moe_pallas:auto": side(6.6, 6100.0, {"gmm (Triton)": 4000.0, "combine": 120.0}),
        "cublas_line": side(5.0, 4620.0, {"cuBLAS GEMM": 4600.0}),
    }
    text = trace.report([result], "moe_pallas:auto", "meta")
    row = "| gptoss/fwd/T=16384 | 6.600 | 5.000 | 1.32 | 4000 (750) | 4600 (652) | 120 | 1980 |"
    assert row in text
    assert "## gptoss/fwd/T=16384" in text and "| **around the cores** | 120 | 0 |" in text


def test_trace_lists_a_failed_case_and_runs_the_next(monkeypatch):
    """A case that runs out of memory is a "Not traced" line with its reason, not the end of the
    run: the case after it is still traced and reported."""
    from benchmarks import trace

    line = impls.IMPLS[impls.LINE]

    def line_oom_on_train(case, inputs):
        if case.mode == "train":
            raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 4.00GiB")
        return line(case, inputs)

    monkeypatch.setitem(impls.IMPLS, impls.LINE, line_oom_on_train)
    text = trace.main(
        ["--small", "--steps", "1", "--budget", "0.01", "--case", "gptoss:train:4", "gptoss:fwd:4"]
    )
    assert "Not traced:" in text
    assert (
        "- gptoss/train/T=4: cublas_line ran out of memory: RuntimeError: RESOURCE_EXHAUSTED"
        in text
    )
    assert "## gptoss/fwd/T=4" in text and "## gptoss/train/T=4" not in text
    assert "| gptoss/fwd/T=4 |" in text and "| gptoss/train/T=4 |" not in text


def test_torch_cache_goes_back_after_every_row(monkeypatch):
    """A torch row's cached blocks go back to the card before the next row runs (jax shares the
    card); without torch loaded, or before it touched CUDA, nothing is called."""
    import types

    emptied = []
    cuda = types.SimpleNamespace(
        is_available=lambda: True,
        is_initialized=lambda: True,
        empty_cache=lambda: emptied.append(1),
    )
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    case = cases.suite_cases("decode", small=True)[0]
    params = cases.make_params(case.workload)
    rows = run.run_case(
        case, ["jax.lax.ragged_dot", "fake oom"], params, H200, 0.01, skip={"fake oom": "no"}
    )
    assert [r["status"] for r in rows] == ["ok", "skipped"] and len(emptied) == 2
    cuda.is_initialized = lambda: False
    impls.release_torch_cache()
    monkeypatch.delitem(sys.modules, "torch")
    impls.release_torch_cache()
    assert len(emptied) == 2


def test_a_non_finite_output_fails_its_row(monkeypatch):
    """A timed output holding a NaN, where the reference row's is finite, is an error row with
    the reason, not "ok" with a NaN error beside its time; so is such a row of a stored run."""
    import dataclasses as dc

    def poisoned(case, inputs):
        prep = impls.IMPLS["jax.lax.ragged_dot"](case, inputs)
        return dc.replace(prep, call=lambda: prep.call().at[0].set(jnp.nan))

    monkeypatch.setitem(impls.IMPLS, "poisoned", poisoned)
    case = cases.suite_cases("decode", small=True)[0]
    params = cases.make_params(case.workload)
    rows = run.run_case(case, ["jax.lax.ragged_dot", "poisoned"], params, H200, 0.01)
    assert [r["status"] for r in rows] == ["ok", "error"]
    assert rows[1]["message"] == "output not finite against jax.lax.ragged_dot"
    assert rows[1]["time_ms"] > 0
    # a stored run's row, as benchmarks.readme reads it
    stored = {"status": "ok", "rel_err": float("nan"), "rel_err_vs": "tokamax"}
    assert run.fail_non_finite(stored)["status"] == "error"


def test_line_takes_xla_alone_where_torch_bmm_runs_out_of_memory(monkeypatch):
    """The cuBLAS line gives way to XLA's dot where torch.bmm's outputs do not fit in torch's
    share of the card, and says so; torch's cache goes back first."""
    import types

    class OutOfMemoryError(RuntimeError):
        pass

    def from_dlpack(_):
        raise OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB.")

    emptied = []
    cuda = types.SimpleNamespace(
        is_available=lambda: True,
        is_initialized=lambda: True,
        empty_cache=lambda: emptied.append(1),
        synchronize=lambda: None,
        OutOfMemoryError=OutOfMemoryError,
    )
    monkeypatch.setitem(
        sys.modules, "torch", types.SimpleNamespace(cuda=cuda, from_dlpack=from_dlpack)
    )
    case = cases.suite_cases("decode", small=True)[0]
    inputs = run._inputs(case, cases.make_params(case.workload))
    prep = impls.IMPLS[impls.LINE](case, inputs)
    assert prep.note.startswith("xla dot_general (torch.bmm ran out of memory): ")
    assert emptied == [1]
    jax.block_until_ready(prep.call())


def test_rel_err_sums_slices_of_the_first_axis():
    """The runner's relative error, summed slice by slice (a float32 weight gradient whole would be
    a third full-size array), equals the whole-array norm ratio, for jax and numpy outputs."""
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((7, 5, 3)).astype(np.float32)
    out = ref + 1e-3 * rng.standard_normal(ref.shape).astype(np.float32)
    want = np.linalg.norm((out - ref).astype(np.float64)) / np.linalg.norm(ref.astype(np.float64))
    for slice_bytes in (1, 4 * 15 * 2, 2**30):  # one row, two rows (a ragged last slice), all
        got = run._rel_err(jnp.asarray(out, jnp.bfloat16).astype(jnp.float32), ref, slice_bytes)
        whole = run._rel_err(jnp.asarray(out), jnp.asarray(ref), slice_bytes)
        assert whole == pytest.approx(want, rel=1e-4)
        assert got == pytest.approx(run._rel_err(jnp.asarray(out, jnp.bfloat16), ref), rel=1e-4)
    assert run._rel_err(np.float32(2.0), np.float32(1.0)) == pytest.approx(1.0)
    assert run._rel_err(out, ref[:6]) is None and run._rel_err(None, ref) is None


def test_canonical_script_names_existing_suites_and_implementations():
    """benchmarks/canonical.sh (the published run's steps): without a step it prints its usage and
    exits 2; every implementation and suite it names exists, each forward suite's two halves of
    tokens cover its cases once, and every trace case parses."""
    import re

    from benchmarks import trace

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "canonical.sh"
    done = subprocess.run(["bash", str(script)], check=False, capture_output=True, text=True)
    assert done.returncode == 2 and "usage" in done.stderr
    text = script.read_text()
    names = set()
    pattern = r"^(?:IMPLS|OURS_Q|OURS_A8|PEERS_Q|OURS_TRAIN)=(\S+)$"
    for value in re.findall(pattern, text, re.MULTILINE):
        names |= set(value.split(","))
    assert len(names) == 13 and names <= set(impls.IMPLS)
    for suites in re.findall(r"--suite (\S+)", text):
        assert set(suites.split(",")) <= set(cases.SUITES)
    # the two steps of each forward suite run its cases once each
    halves = dict(re.findall(r"^(\w+_[AB])=(\S+)$", text, re.MULTILINE))
    for suite, prefix in (("gptoss", "GPTOSS"), ("swiglu256", "SWIGLU")):
        tokens = [int(t) for half in "AB" for t in halves[f"{prefix}_{half}"].split(",")]
        assert sorted(tokens) == sorted(cases.SUITE_TOKENS[suite])
        assert f'--suite {suite} --tokens "${prefix}_A"' in text
        assert f'--suite {suite} --tokens "${prefix}_B"' in text
    for case in re.findall(r"(?:gptoss|swiglu256):(?:fwd|train):\d+", text):
        trace.parse_case(case, small=False)


def test_runner_prepares_compile_only_implementations_at_once(tmp_path, monkeypatch):
    """--compile-workers 2: the implementations of impls.COMPILE_AHEAD are prepared in threads at
    once (two fakes that each wait for the other at a barrier would time out one after another),
    a prepare's exception becomes its row as it would serially and is freed with its row written
    (no reference cycle through the runner's frame keeps the case's arrays until a garbage
    collection), and a real layer still matches the peer."""
    import gc
    import weakref

    barrier = threading.Barrier(2, timeout=10)
    raised = []

    def meeting(case, inputs):
        barrier.wait()
        return impls.IMPLS["moe_pallas:pallas_triton"](case, inputs)

    class Refusal(impls.Skip):
        def __init__(self, message):
            super().__init__(message)
            raised.append(weakref.ref(self))

    def refusing(case, inputs):
        raise Refusal("not implemented: a fake")

    for name, prepare in (("meet a", meeting), ("meet b", meeting), ("refuses", refusing)):
        monkeypatch.setitem(impls.IMPLS, name, prepare)
    names = ("meet a", "meet b", "moe_pallas:pallas_triton", "refuses")
    monkeypatch.setattr(impls, "COMPILE_AHEAD", impls.COMPILE_AHEAD | set(names))
    args = ["--suite", "decode", "--small", "--tokens", "1", "--budget", "0.01", "--no-plots"]
    args += ["--impls", "jax.lax.ragged_dot," + ",".join(names), "--compile-workers", "2"]
    gc.disable()
    try:
        out = run.main([*args, "--out", str(tmp_path)])
        assert raised and all(ref() is None for ref in raised)
    finally:
        gc.enable()
    rows = {r["impl"]: r for r in json.loads((out / "results.json").read_text())["rows"]}
    assert {n: rows[n]["status"] for n in names} == {
        "meet a": "ok",
        "meet b": "ok",
        "refuses": "skipped",
        "moe_pallas:pallas_triton": "ok",
    }
    assert rows["refuses"]["message"] == "not implemented: a fake"
    for name in ("meet a", "meet b", "moe_pallas:pallas_triton"):
        assert rows[name]["rel_err_vs"] == "jax.lax.ragged_dot" and rows[name]["rel_err"] < 2e-2


def test_case_order_reads_in_tokens_whatever_the_run_order():
    """Steps that split a suite append its cases out of T order; tables and plots sort them."""
    rows = []
    for t, proj in [(16384, None), (2048, None), (4096, None), (64, "down"), (16, "gate_up")]:
        case = f"gptoss/gmm/{proj}/T={t}" if proj else f"gptoss/fwd/T={t}"
        mode = "gmm" if proj else "fwd"
        rows += [{"case": case, "workload": "gptoss", "mode": mode, "tokens": t}] * 2
    assert cases.case_order(rows) == [
        "gptoss/fwd/T=2048",
        "gptoss/fwd/T=4096",
        "gptoss/fwd/T=16384",
        "gptoss/gmm/down/T=64",
        "gptoss/gmm/gate_up/T=16",
    ]
