"""`read_safetensors`: the tensors of .safetensors files as memory-mapped numpy arrays.

The format: an 8-byte little-endian header size, a JSON header mapping each tensor's name to its
dtype, shape and byte range, then the bytes. safetensors' own numpy and flax loaders (0.8.0)
fail on float8 tensors, which the FP8 checkpoints of DeepSeek-V3 and Qwen3 hold; numpy arrays of
jax's float8 and bfloat16 dtypes (ml_dtypes) hold them here.
"""

import json
import os

import jax.numpy as jnp
import numpy as np

_SAFETENSORS_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "BF16": jnp.bfloat16,  # jax's bfloat16 and float8 types are numpy dtypes (ml_dtypes)
    "F8_E4M3": jnp.float8_e4m3fn,
    "F8_E5M2": jnp.float8_e5m2,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U64": np.uint64,
    "U32": np.uint32,
    "U16": np.uint16,
    "U8": np.uint8,
    "BOOL": np.bool_,
}


def read_safetensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The tensors of a .safetensors file, or of every *.safetensors file of a folder (a sharded
    checkpoint), as read-only numpy arrays mapped from the files: bytes are read when used, so one
    layer's experts of a large checkpoint cost one layer's reads. FP8 included: safetensors' own
    numpy and flax loaders fail on float8 (0.8.0)."""
    if os.path.isdir(path):
        shards = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
        if not shards:
            raise ValueError(f"{os.fspath(path)!r} holds no .safetensors file.")
        tensors = {}
        for shard in shards:
            for name, value in _read_safetensors_file(os.path.join(path, shard)).items():
                if name in tensors:
                    raise ValueError(f"{name} is in two shards of {os.fspath(path)!r}.")
                tensors[name] = value
        return tensors
    return _read_safetensors_file(path)


def _read_safetensors_file(path) -> dict[str, np.ndarray]:
    with open(path, "rb") as f:
        head = f.read(8)
        size = int.from_bytes(head, "little") if len(head) == 8 else -1
        try:
            header = json.loads(f.read(size)) if size > 0 else None
        except (UnicodeDecodeError, json.JSONDecodeError):
            header = None
        if size <= 0 or not isinstance(header, dict):
            raise ValueError(f"{os.fspath(path)!r} is not a safetensors file (unreadable header).")
        f.seek(0, os.SEEK_END)
        data_bytes = f.tell() - 8 - size
    data = (
        np.memmap(path, np.uint8, mode="r", offset=8 + size)
        if data_bytes > 0
        else np.zeros(0, np.uint8)
    )
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in _SAFETENSORS_DTYPES:
            raise ValueError(
                f"{name} has dtype {info['dtype']}, which read_safetensors does not know; "
                f"known: {sorted(_SAFETENSORS_DTYPES)}."
            )
        begin, end = info["data_offsets"]
        if not 0 <= begin <= end <= data_bytes:
            raise ValueError(f"{name}'s bytes [{begin}, {end}) lie outside the file's data.")
        dtype = np.dtype(_SAFETENSORS_DTYPES[info["dtype"]])
        tensors[name] = data[begin:end].view(dtype).reshape(info["shape"])
    return tensors
