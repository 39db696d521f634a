"""read_safetensors against safetensors' own loaders, FP8 and folders of shards included, and its
errors on files that are not safetensors."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.flax
import safetensors.numpy

import moe_pallas
from tests.test_weights import gpt_oss_tensors


def test_read_safetensors_matches_safetensors(tmp_path):
    rng = np.random.default_rng(17)
    tensors = {
        "f32": rng.standard_normal((3, 5)).astype(np.float32),
        "f16": rng.standard_normal(7).astype(np.float16),
        "i32": rng.integers(-9, 9, (2, 2, 2)).astype(np.int32),
        "u8": rng.integers(0, 256, 11).astype(np.uint8),
        "flag": rng.random(4) > 0.5,
        "scalar": np.asarray(2.5, np.float64),
        "empty": np.zeros((0, 3), np.float32),
    }
    path = tmp_path / "plain.safetensors"
    safetensors.numpy.save_file(tensors, str(path), metadata={"format": "np"})
    read = moe_pallas.read_safetensors(path)
    assert sorted(read) == sorted(tensors)
    for name, value in safetensors.numpy.load_file(str(path)).items():
        assert read[name].dtype == value.dtype and read[name].shape == value.shape, name
        np.testing.assert_array_equal(read[name], value)
    low = {
        "bf16": jnp.asarray(rng.standard_normal((4, 3)), jnp.bfloat16),
        "e4m3": jnp.asarray(rng.standard_normal((5, 2)) * 50, jnp.float8_e4m3fn),
        "e5m2": jnp.asarray(rng.standard_normal(6), jnp.float8_e5m2),
    }
    path = tmp_path / "low.safetensors"
    safetensors.flax.save_file(low, str(path))
    read = moe_pallas.read_safetensors(path)
    for name, value in low.items():
        assert read[name].dtype == value.dtype, name
        np.testing.assert_array_equal(read[name].astype(np.float32), value.astype(jnp.float32))


def test_read_safetensors_errors(tmp_path):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{oops")
    with pytest.raises(ValueError, match="not a safetensors file"):
        moe_pallas.read_safetensors(path)

    def write(header, data):
        text = json.dumps(header).encode()
        path.write_bytes(len(text).to_bytes(8, "little") + text + data)

    write({"z": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}}, bytes(8))
    with pytest.raises(ValueError, match="z has dtype C64"):
        moe_pallas.read_safetensors(path)
    write({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, bytes(8))
    with pytest.raises(ValueError, match=r"x's bytes \[0, 16\) lie outside"):
        moe_pallas.read_safetensors(path)


def test_read_safetensors_folder(tmp_path):
    """A sharded checkpoint: every *.safetensors file of the folder, nothing else."""
    tensors = gpt_oss_tensors(np.random.default_rng(21))
    names = sorted(tensors)
    safetensors.numpy.save_file({k: tensors[k] for k in names[:2]}, str(tmp_path / "a.safetensors"))
    safetensors.numpy.save_file({k: tensors[k] for k in names[2:]}, str(tmp_path / "b.safetensors"))
    (tmp_path / "model.safetensors.index.json").write_text("{}")
    read = moe_pallas.read_safetensors(tmp_path)
    assert sorted(read) == names
    for name in names:
        np.testing.assert_array_equal(read[name], tensors[name])
    safetensors.numpy.save_file({names[0]: tensors[names[0]]}, str(tmp_path / "c.safetensors"))
    with pytest.raises(ValueError, match=f"{names[0]} is in two shards"):
        moe_pallas.read_safetensors(tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no .safetensors file"):
        moe_pallas.read_safetensors(tmp_path / "empty")
