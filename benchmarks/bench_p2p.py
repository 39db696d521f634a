"""GPU-to-GPU bandwidth of the machine: the ceiling of the expert-parallel exchange.

    PYTHONPATH=. python3 benchmarks/bench_p2p.py [--mib 256] [--out p2p.json]

Times (`benchmarks.sol.median_seconds`: median of 5 after a warm-up, bf16 random data) on the
first two devices:
  - copy: `jax.device_put` of a [N] array from device 0 to device 1;
  - all_to_all: `jax.lax.all_to_all` inside `jax.shard_map` over 2 devices, each sending half of
    its [N] shard to the other;
  - ragged_all_to_all: the same exchange through `jax.lax.ragged_all_to_all` (EP's "ragged").
GB/s counts the bytes that cross between the devices (copy: N; the exchanges: N/2 each way).
"""

import argparse
import json
import shutil
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from benchmarks.sol import median_seconds


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256, help="bytes per device, MiB")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    devices = jax.devices()[:2]
    if len(devices) < 2:
        raise SystemExit(f"needs 2 devices, found {jax.devices()}")
    n = args.mib * 2**20 // 2  # bf16 elements per device
    rows = n // 1024
    mesh = Mesh(np.asarray(devices), ("x",))
    x0 = jax.device_put(
        jax.random.normal(jax.random.key(0), (rows, 1024), jnp.bfloat16), devices[0]
    )
    result = {"device": devices[0].device_kind, "jax": jax.__version__, "mib": args.mib}
    if shutil.which("nvidia-smi"):
        topo = subprocess.run(
            ["nvidia-smi", "topo", "-m"], capture_output=True, text=True, check=False
        )
        result["topology"] = topo.stdout
        print(topo.stdout)
    seconds = median_seconds(lambda a: jax.device_put(a, devices[1]), x0, repeats=5)
    result["copy_gbps"] = rows * 1024 * 2 / seconds / 1e9

    both = jax.device_put(
        jnp.concatenate([x0, x0]), NamedSharding(mesh, P("x"))
    )  # [2 * rows, 1024], one [rows, 1024] shard per device

    def a2a(block):
        return jax.lax.all_to_all(block, "x", 0, 0, tiled=True)

    def ragged(block):
        half = block.shape[0] // 2
        me = jax.lax.axis_index("x")
        sizes = jnp.full((2,), half, jnp.int32)
        offsets = jnp.arange(2, dtype=jnp.int32) * half
        out_offsets = jnp.full((2,), me * half, jnp.int32)
        return jax.lax.ragged_all_to_all(
            block, jnp.zeros_like(block), offsets, sizes, out_offsets, sizes, axis_name="x"
        )

    for name, body in (("all_to_all", a2a), ("ragged_all_to_all", ragged)):
        fn = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
        seconds = median_seconds(fn, both, repeats=5)
        result[f"{name}_gbps"] = rows * 1024 * 2 / 2 / seconds / 1e9
        result[f"{name}_ms"] = seconds * 1e3
    for key in ("copy_gbps", "all_to_all_gbps", "ragged_all_to_all_gbps"):
        print(f"{key:24s} {result[key]:8.1f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
