"""The tuning table (moe_pallas/tuning.json) and the "auto" policy that reads it."""

import dataclasses
import json
import shutil

import jax.numpy as jnp
import pytest

from moe_pallas import backends, tuning
from moe_pallas.backends import pallas_triton
from moe_pallas.kernels import BlockConfig
from moe_pallas.kernels.gmm_mgpu import MosaicConfig
from tests.helpers import as_if_h200


def test_table_is_well_formed_and_stored_one_entry_per_line():
    data = tuning.table()
    assert data["default_device"] in data["devices"]
    assert tuning.dumps(data) == tuning.TABLE_PATH.read_text()
    configs = {"pallas_triton": BlockConfig, "mosaic_gpu": MosaicConfig}
    for device in data["devices"].values():
        assert device["num_sms"] > 0
        keys = [tuning._key(e) for e in device["entries"]]
        assert len(keys) == len(set(keys)), "duplicate keys"
        for entry in device["entries"]:
            assert entry["kernel"] in (*tuning.KERNELS, *tuning.A8_KERNELS)
            assert entry["rows"] in tuning.ROWS_CLASSES
            assert entry["backend"] in ("pallas_triton", "mosaic_gpu", "cublas_slab")
            if entry["backend"] in configs:
                configs[entry["backend"]](**entry["config"])  # valid fields and values


def test_every_triton_kernel_and_class_has_a_config():
    for kernel in tuning.KERNELS:
        for rows in tuning.ROWS_CLASSES:
            got = tuning.lookup(
                "pallas_triton", kernel, dtype=jnp.bfloat16, k=64, n=64, rows=rows, device=None
            )
            assert got is not None, (kernel, rows)


def test_most_specific_entry_wins_and_writes_round_trip(tmp_path):
    path = tmp_path / "tuning.json"
    shutil.copy(tuning.TABLE_PATH, path)
    base = {"backend": "pallas_triton", "kernel": "gmm", "rows": "small"}
    exact = base | {"dtype": "bfloat16", "k": 2880, "n": "*", "config": {"block_m": 32}}
    tuning.write_entries([exact], "NVIDIA H200", path=path)
    look = lambda dtype, k: tuning.lookup(
        "pallas_triton",
        "gmm",
        dtype=dtype,
        k=k,
        n=5760,
        rows="small",
        device="NVIDIA H200",
        path=path,
    )
    assert look(jnp.bfloat16, 2880) == {"block_m": 32}
    assert look(jnp.float32, 2880)["block_m"] == 128  # the wildcard entry
    assert look(jnp.bfloat16, 4096)["block_m"] == 128
    tuning.write_entries([exact | {"config": {"block_m": 16}}], "NVIDIA H200", path=path)
    assert look(jnp.bfloat16, 2880) == {"block_m": 16}  # replaced, not added
    with pytest.raises(ValueError, match="num_sms"):
        tuning.write_entries([exact], "NVIDIA B200", path=path)
    tuning.write_entries([exact], "NVIDIA B200", num_sms=148, path=path)
    assert json.loads(path.read_text())["devices"]["NVIDIA B200"]["num_sms"] == 148
    with pytest.raises(ValueError, match="malformed"):
        tuning.write_entries([{"backend": "pallas_triton"}], "NVIDIA H200", path=path)
    assert tuning.TABLE_PATH.read_text() == tuning.dumps(tuning.table())  # package file untouched


def test_unknown_device_uses_the_default_devices_triton_entries_only():
    kwargs = {"dtype": jnp.bfloat16, "k": 2880, "n": 2880, "rows": "large"}
    assert tuning.lookup("mosaic_gpu", "gmm", device="NVIDIA H200", **kwargs) is not None
    assert tuning.lookup("mosaic_gpu", "gmm", device="NVIDIA L4", **kwargs) is None
    triton = tuning.lookup("pallas_triton", "gmm", device="NVIDIA L4", **kwargs)
    assert triton == tuning.lookup("pallas_triton", "gmm", device="NVIDIA H200", **kwargs)


def test_a_named_device_takes_the_default_devices_triton_entries_it_does_not_override():
    """The H100's table holds the Mosaic GPU FP8-activation entries measured on it (SwiGLU-256's
    two forward products, gpt-oss's in the large class) and the H200's 16-bit Mosaic GPU and
    cuBLAS-slab entries, timed there too: those apply there, the H200's FP8-activation entries
    it did not measure do not, and every Triton problem takes the H200's entry."""
    h100 = "NVIDIA H100 80GB HBM3"
    assert h100 in tuning.table()["devices"]
    a8 = {"dtype": jnp.float8_e4m3fn, "rows": "large"}
    for kernel, k, n in (("gmm_glu_a8", 4096, 2048), ("gmm_a8", 2048, 4096)):
        here = tuning.lookup("mosaic_gpu", kernel, k=k, n=n, device=h100, **a8)
        assert here == tuning.lookup("mosaic_gpu", kernel, k=k, n=n, device="NVIDIA H200", **a8)
        assert here is not None
    gptoss = {"dtype": jnp.float8_e4m3fn, "k": 2880, "n": 2880, "device": h100}
    assert tuning.lookup("mosaic_gpu", "gmm_glu_a8", rows="large", **gptoss) is not None
    assert tuning.lookup("mosaic_gpu", "gmm_glu_a8", rows="small", **gptoss) is None
    bf16 = {"dtype": jnp.bfloat16, "k": 2880, "n": 2880, "rows": "large"}
    for backend, kernel in (
        ("mosaic_gpu", "gmm"),
        ("mosaic_gpu", "gmm_t"),
        ("cublas_slab", "tgmm"),
    ):
        here = tuning.lookup(backend, kernel, device=h100, **bf16)
        assert here is not None
        assert here == tuning.lookup(backend, kernel, device="NVIDIA H200", **bf16)
    for kernel in tuning.KERNELS:
        triton = tuning.lookup("pallas_triton", kernel, device=h100, **bf16)
        assert triton is not None
        assert triton == tuning.lookup("pallas_triton", kernel, device="NVIDIA H200", **bf16)


def _gmm_problem(kernel, rows, k=2880, n=2880, dtype=jnp.bfloat16, out=jnp.bfloat16, gather=False):
    return backends.Problem(kernel, (dtype, dtype), jnp.dtype(out), k, n, rows, 128, gather, True)


def test_auto_policy_on_an_h200(monkeypatch):
    """Mosaic GPU for the table's gmm shapes only (plain, and gpt-oss's products with a
    transposed rhs; not with a row gather, a float32 output, another class or a GLU); Triton
    otherwise."""
    select = lambda p: backends.select("auto", p).name
    assert select(_gmm_problem("gmm", 65536)) == "pallas_triton"  # off GPU: not available
    as_if_h200(monkeypatch)
    assert select(_gmm_problem("gmm", 65536)) == "mosaic_gpu"
    assert select(_gmm_problem("gmm", 65536, n=5760)) == "mosaic_gpu"
    assert select(_gmm_problem("gmm", 65536, gather=True)) == "pallas_triton"
    assert select(_gmm_problem("gmm", 65536, out=jnp.float32)) == "pallas_triton"
    assert select(_gmm_problem("gmm", 8192)) == "pallas_triton"  # 64 rows per expert
    assert select(_gmm_problem("gmm", 65536, k=4096, n=4096)) == "pallas_triton"  # SwiGLU
    assert select(_gmm_problem("gmm_glu", 65536)) == "pallas_triton"
    assert select(_gmm_problem("gmm_t", 65536)) == "mosaic_gpu"  # ragged_dot's dx at gpt-oss down
    # the layer's g = dout @ w_downᵀ, a float32 output
    assert select(_gmm_problem("gmm_t", 65536, out=jnp.float32)) == "pallas_triton"
    assert select(_gmm_problem("gmm_t", 65536, k=5760)) == "mosaic_gpu"  # dx = dh @ w_gate_upᵀ
    assert select(_gmm_problem("gmm_t", 65536, k=5760, out=jnp.float32)) == "pallas_triton"
    assert select(_gmm_problem("gmm_t", 16384, k=5760)) == "pallas_triton"  # T = 4096: small


def test_explicit_policies():
    problem = _gmm_problem("gmm", 64)
    assert backends.select("pallas_triton", problem).name == "pallas_triton"
    assert backends.select("xla", problem).name == "xla"
    assert backends.select("mosaic_gpu", problem).name == "mosaic_gpu"
    f32 = _gmm_problem("gmm", 64, dtype=jnp.float32)
    assert backends.select("mosaic_gpu", f32).name == "pallas_triton"  # wgmma takes 16-bit
    with pytest.raises(ValueError, match="resolve"):
        backends.select("triton", problem)


def test_triton_config_spreads_decode_over_the_default_devices_sms():
    """Off GPU the policy spreads work over the default device's SMs, so interpret mode runs the
    configs an H200 would."""
    assert tuning.policy_sms() == tuning.table()["devices"]["NVIDIA H200"]["num_sms"]
    decode = pallas_triton.config("gmm", jnp.bfloat16, 4, 128, 2880, 2880)
    prefill = pallas_triton.config("gmm", jnp.bfloat16, 8192, 128, 2880, 2880)
    assert decode.block_n == 64 and prefill.block_n == 256
    assert dataclasses.replace(decode, block_n=prefill.block_n).block_m != prefill.block_m
