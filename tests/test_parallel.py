"""Expert parallelism (moe_pallas.parallel): shard_map exchanges against the single-device layer.

The 8-device cases run once, in a subprocess (tests/ep_cases.py) that sets
--xla_force_host_platform_device_count=8 before importing jax; each test below checks one case.
Tests in this process use the one-device mesh, argument errors and the 2-GPU ragged path;
the multi-host example runs as 2 processes x 2 CPU devices.
"""

import fcntl
import json
import os
import socket
import subprocess
import sys
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import moe_pallas
from moe_pallas.parallel import capacity_rows

HERE = os.path.dirname(__file__)
F32, BF16 = 1e-5, 2e-2


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    """Results of ep_cases.py, run once per pytest session, even when xdist splits this module."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the pytest session's directory, shared by the workers
    path = root / "ep_cases.json"
    with open(root / "ep_cases.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            run = subprocess.run(
                [sys.executable, os.path.join(HERE, "ep_cases.py")],
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
                env={**os.environ, "JAX_PLATFORMS": "cpu"},
            )
            lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
            assert lines, (
                f"ep_cases.py printed no results:\n{run.stdout[-2000:]}\n{run.stderr[-4000:]}"
            )
            path.write_text(lines[-1])
    return json.loads(path.read_text())


@pytest.mark.parametrize(
    "case",
    [
        "a2a_ep8",
        "a2a_ep4_data2_gptoss_tail",
        "a2a_one_hot_expert",
        "ragged_ep8_emulated",
        "a2a_ep2_pallas_gptoss",
    ],
)
def test_forward_and_grads_match_one_device(cases, case):
    assert cases[case]["fwd"] < F32 and cases[case]["grad"] < F32, cases[case]


@pytest.mark.parametrize(
    "case",
    [
        "a2a_ep4_data2_fp8_block_pallas",
        "a2a_ep4_data2_fp8_block_a8_pallas",
        "a2a_ep4_data2_mxfp4_pallas",
        "a2a_ep4_data2_fp8_xla",
    ],
)
def test_quantised_weights_split_over_the_mesh_match_one_device(cases, case):
    """Stored fp8 / mxfp4 experts sharded over "expert" (values and scales alike), fp8_block also
    with fp8 activations (quantised per row, so each shard's rows as on one device): the Pallas
    path is the single-device kernel on each shard's rows (bitwise equal here); "xla" dequantises
    per call and sums in another order (bf16 outputs). Weight gradients stay refused."""
    c = cases[case]
    tol = BF16 if case.endswith("xla") else F32
    assert c["fwd"] < tol and c["grad"] < tol, c
    assert "quantised expert weights" in c["weight_grad"] or "uint8" in c["weight_grad"], c


def test_fp8_training_split_over_the_mesh_matches_one_device(cases):
    """FP8 training's block on each shard's rows and experts: forward and the gradients of x and
    the routing weights as on one device; the weights' and biases' within bf16 rounding (each
    data shard's bf16 gradient summed over "data", as without fp8_training: 2.6-2.9e-3)."""
    c = cases["a2a_ep4_data2_fp8_training_pallas"]
    assert c["fwd"] < F32 and c["grad"] < F32, c
    assert c["param_grads"] == 4 and c["param_grad"] < BF16, c


def test_dropless_all_to_all_spills_into_a_second_round_only_on_overflow(cases):
    balanced, spill = cases["a2a_dropless_balanced"], cases["a2a_dropless_spill"]
    for case in (balanced, spill):
        assert case["fwd"] < F32 and case["grad"] < F32 and case["dropped"] == 0, case
        assert case["rows_computed"] == 64 * 2, case  # every (token, slot) row, once
    assert balanced["spilled"] == 0, balanced
    # slot 0 of all 64 tokens on expert 3 (shard 0): 8 rows per source device against a first
    # round of ceil(1.25 * 16 / 2) = 10, plus the slot-1 rows for shard 0: some pair overflows
    assert spill["spilled"] > 0, spill


@pytest.mark.parametrize("case", ["a2a_ep2_data4_bf16", "explicit_mesh_T1"])
def test_forward_matches_one_device_and_reference(cases, case):
    tol = BF16 if "bf16" in case else F32
    assert cases[case]["fwd"] < tol and cases[case]["fwd_vs_f32_reference"] < tol, cases[case]


@pytest.mark.parametrize("case", ["a2a_drop", "ragged_drop_emulated"])
def test_drops_are_exactly_the_rows_past_capacity(cases, case):
    c = cases[case]
    assert c["expected_dropped"] > 0, "the case must overflow to test anything"
    assert c["dropped"] == c["expected_dropped"] and c["rows_computed"] == c["expected_rows"], c
    assert c["fwd"] < F32, c


def test_real_ragged_all_to_all_traces_with_gradients(cases):
    assert cases["ragged_lowers"]["ragged_ops"] >= 4  # 3 forward + 1 back, and their transposes


def test_debug_checks_raise_on_every_device(cases):
    assert "capacity_factor" in cases["debug_raises"]["drop"]
    assert "expert ids outside" in cases["debug_raises"]["bad_id"]


def test_argument_errors_name_the_fix(cases):
    assert "divisible" in cases["errors"]["indivisible_experts"]
    assert "expert_axis='experts'" in cases["errors"]["bad_axis"]


def _inputs(T=24, E=8, k=2, H=16, I=8, dtype=jnp.float32, seed=0):
    ks = jax.random.split(jax.random.key(seed), 5)
    x = jax.random.normal(ks[0], (T, H)).astype(dtype)
    idx = jax.lax.top_k(jax.random.normal(ks[1], (T, E)), k)[1]
    w = jax.random.uniform(ks[2], (T, k))
    params = {
        "w_gate_up": (jax.random.normal(ks[3], (E, H, 2 * I)) / 4).astype(dtype),
        "w_down": (jax.random.normal(ks[4], (E, I, H)) / 3).astype(dtype),
    }
    return x, idx, w, params


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def test_one_device_mesh_equals_no_mesh_with_stats():
    x, idx, w, params = _inputs()
    idx = idx.at[0, 0].set(-1)  # out of range: contributes zero, not counted as computed
    single = moe_pallas.moe_experts(x, idx, w, params, activation="swiglu")
    mesh = moe_pallas.expert_mesh(devices=jax.devices()[:1])
    out, stats = jax.jit(
        partial(
            moe_pallas.moe_experts,
            activation="swiglu",
            mesh=mesh,
            exchange="all_to_all",
            return_stats=True,
        )
    )(x, idx, w, params)
    assert _rel(out, single) < F32
    assert int(stats["dropped_rows"]) == 0 and stats["rows_per_shard"].tolist() == [idx.size - 1]
    out, stats = moe_pallas.moe_experts(x, idx, w, params, activation="swiglu", return_stats=True)
    assert _rel(out, single) == 0 and stats["rows_per_shard"].tolist() == [idx.size - 1]


def test_capacity_rows():
    assert capacity_rows("all_to_all", 64, 8, None) == 10  # dropless: the first round, 1.25x
    assert capacity_rows("all_to_all", 64, 8, 1.25) == 10
    assert capacity_rows("ragged", 64, 8, None) == 512
    assert capacity_rows("ragged", 64, 8, 1.25) == 80
    assert capacity_rows("ragged", 64, 8, 100.0) == 512


def test_expert_mesh_and_option_errors():
    mesh = moe_pallas.expert_mesh()
    assert mesh.axis_names == ("data", "expert") and mesh.size == len(jax.devices())
    with pytest.raises(ValueError, match="does not tile"):
        moe_pallas.expert_mesh(num_expert_shards=len(jax.devices()) + 1)
    x, idx, w, params = _inputs()
    call = partial(moe_pallas.moe_experts, x, idx, w, params, activation="swiglu", mesh=mesh)
    with pytest.raises(ValueError, match="exchange="):
        call(exchange="nccl")
    with pytest.raises(ValueError, match="capacity_factor"):
        call(capacity_factor=0.0)
    with pytest.raises(TypeError, match="expert_mesh"):
        moe_pallas.moe_experts(x, idx, w, params, activation="swiglu", mesh="expert")


@pytest.mark.gpu
@pytest.mark.parametrize("exchange", ["ragged", "all_to_all"])
def test_exchanges_on_two_gpus(exchange):
    if len(jax.devices()) < 2:
        pytest.skip("needs 2 GPUs")
    mesh = moe_pallas.expert_mesh(2, devices=jax.devices()[:2])
    x, idx, w, params = _inputs(T=256, E=16, k=4, H=128, I=64, dtype=jnp.bfloat16, seed=1)
    single = partial(moe_pallas.moe_experts, activation="swiglu")
    ep = partial(single, mesh=mesh, exchange=exchange)
    hot = idx.at[:, 0].set(0)  # half of the rows to shard 0: overflows a balanced buffer
    for routing in (idx, hot):
        out, stats = jax.jit(partial(ep, return_stats=True))(x, routing, w, params)
        assert _rel(out, single(x, routing, w, params)) < BF16
        assert int(stats["dropped_rows"]) == 0 and int(stats["rows_per_shard"].sum()) == idx.size
    if exchange == "all_to_all":  # the hot routing took the dropless second round
        assert int(stats["spilled_rows"]) > 0
    loss = lambda fn, x, w, p: jnp.sum(fn(x, hot, w, p).astype(jnp.float32) ** 2)
    g_ep = jax.jit(jax.grad(partial(loss, ep), argnums=(0, 1, 2)))(x, w, params)
    g_one = jax.jit(jax.grad(partial(loss, single), argnums=(0, 1, 2)))(x, w, params)
    for a, b in zip(jax.tree.leaves(g_ep), jax.tree.leaves(g_one)):
        assert _rel(a, b) < BF16
    out, stats = jax.jit(partial(ep, capacity_factor=0.5, return_stats=True))(x, hot, w, params)
    assert int(stats["dropped_rows"]) > 0 and bool(jnp.isfinite(out.astype(jnp.float32)).all())
    assert int(stats["rows_per_shard"].sum()) + int(stats["dropped_rows"]) == hot.size


def test_two_processes_run_the_multihost_example():
    """examples/multihost_ep.py as 2 processes x 2 CPU devices (gloo), experts over processes."""
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    script = os.path.join(HERE, "..", "examples", "multihost_ep.py")
    env = {**os.environ, "PYTHONPATH": os.path.join(HERE, "..")}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                script,
                "--cpu-devices",
                "2",
                "--coordinator",
                f"localhost:{port}",
                "--num-processes",
                "2",
                "--process-id",
                str(i),
                "--tokens",
                "64",
                "--exchange",
                "all_to_all",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(2)
    ]
    outputs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outputs):
        assert p.returncode == 0, err[-3000:]
        assert "dropped_rows=0" in out and "vs one device" in out, out
