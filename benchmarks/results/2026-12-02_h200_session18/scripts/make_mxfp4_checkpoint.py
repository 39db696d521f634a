"""Write a gpt-oss-20b-shaped MLP layer (E = 32, H = I = 2880, MXFP4 experts with biases, router)
as two safetensors shards in a folder, with a minimal writer (no safetensors package needed on the
device). Scale codes 118..123 (2^-9..2^-4) keep the expert outputs in a realistic range."""
import json
import struct
import sys
from pathlib import Path

import numpy as np

DTYPES = {np.dtype(np.uint8): "U8", np.dtype(np.float32): "F32"}
PREFIX = "model.layers.0.mlp."


def write(path, tensors):
    header, offset = {}, 0
    for name, a in tensors.items():
        header[name] = {"dtype": DTYPES[a.dtype], "shape": list(a.shape),
                        "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        for a in tensors.values():
            f.write(np.ascontiguousarray(a).tobytes())


def main(folder):
    rng = np.random.default_rng(0)
    e, h, i = 32, 2880, 2880
    experts = PREFIX + "experts."
    shard1 = {
        experts + "gate_up_proj_blocks": rng.integers(0, 256, (e, 2 * i, h // 32, 16), np.uint8),
        experts + "gate_up_proj_scales": rng.integers(118, 124, (e, 2 * i, h // 32), np.uint8),
        experts + "gate_up_proj_bias": rng.normal(0, 0.05, (e, 2 * i)).astype(np.float32),
    }
    shard2 = {
        experts + "down_proj_blocks": rng.integers(0, 256, (e, h, i // 32, 16), np.uint8),
        experts + "down_proj_scales": rng.integers(118, 124, (e, h, i // 32), np.uint8),
        experts + "down_proj_bias": rng.normal(0, 0.05, (e, h)).astype(np.float32),
        PREFIX + "router.weight": rng.normal(0, 0.02, (e, h)).astype(np.float32),
        PREFIX + "router.bias": np.zeros((e,), np.float32),
    }
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    write(folder / "model-00001-of-00002.safetensors", shard1)
    write(folder / "model-00002-of-00002.safetensors", shard2)
    print("wrote", sorted(p.name for p in folder.iterdir()))


if __name__ == "__main__":
    main(sys.argv[1])
