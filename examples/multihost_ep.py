"""Expert parallelism over N processes x M GPUs: one global mesh, the same `moe_experts` call.

Every process runs this script; `jax.distributed.initialize()` joins them, `jax.devices()` then
lists all N*M devices and `moe_pallas.expert_mesh` lays them out as ("data", "expert") with the
expert axis inner (neighbouring devices, one host's NVLink domain when it fits). Each process
builds the global arrays from the shards it owns, calls the jitted layer (forward and a gradient)
and checks its own output shards against a single-device computation.

Launch (see docs/expert_parallel.md):
  # 2 hosts x 8 GPUs, experts over the 8 GPUs of a host, data parallel across hosts
  host0$ python examples/multihost_ep.py --coordinator host0:1234 --num-processes 2 --process-id 0 --expert-shards 8
  host1$ python examples/multihost_ep.py --coordinator host0:1234 --num-processes 2 --process-id 1 --expert-shards 8
  # under Slurm or Open MPI, jax.distributed.initialize() finds them itself:
  srun -N 2 --ntasks-per-node=1 python examples/multihost_ep.py --expert-shards 8
  # on one machine without GPUs: 2 processes x 2 CPU devices (gloo collectives)
  python examples/multihost_ep.py --cpu-devices 2 --coordinator localhost:1234 --num-processes 2 --process-id 0 &
  python examples/multihost_ep.py --cpu-devices 2 --coordinator localhost:1234 --num-processes 2 --process-id 1
"""

import argparse
import os


def parse_args():
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--coordinator", help="host:port of process 0 (omit under Slurm/MPI)")
    p.add_argument("--num-processes", type=int)
    p.add_argument("--process-id", type=int)
    p.add_argument("--expert-shards", type=int, default=None, help="default: every device")
    p.add_argument(
        "--cpu-devices", type=int, default=0, help="simulate this many CPU devices per process"
    )
    p.add_argument("--tokens", type=int, default=512, help="global T")
    p.add_argument("--exchange", default="auto", choices=("auto", "ragged", "all_to_all"))
    return p.parse_args()


ARGS = parse_args()
if ARGS.cpu_devices:  # before jax is imported; flags already set (e.g. by the tests) are kept
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "")
        + f" --xla_force_host_platform_device_count={ARGS.cpu_devices}"
    )
    os.environ["JAX_PLATFORMS"] = "cpu"

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import moe_pallas

H, I, E, K = 256, 128, 32, 4


def global_array(value: np.ndarray, sharding: NamedSharding) -> jax.Array:
    """Each process supplies only the shards its devices hold (here cut from a shared copy)."""
    return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])


def main():
    if ARGS.cpu_devices:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(ARGS.coordinator, ARGS.num_processes, ARGS.process_id)
    me = jax.process_index()
    mesh = moe_pallas.expert_mesh(ARGS.expert_shards)
    print(
        f"process {me}/{jax.process_count()}: {jax.local_device_count()} local devices, "
        f"mesh {dict(mesh.shape)}",
        flush=True,
    )

    # Same seed everywhere: every process can cut its shards (a real job loads its data shard).
    rng = np.random.default_rng(0)
    x = rng.standard_normal((ARGS.tokens, H)).astype(np.float32)
    logits = rng.standard_normal((ARGS.tokens, E)).astype(np.float32)
    topk_idx = np.argsort(-logits, axis=1)[:, :K].astype(np.int32)
    topk_weight = np.take_along_axis(logits, topk_idx, axis=1)
    topk_weight = np.exp(topk_weight) / np.exp(topk_weight).sum(1, keepdims=True)
    params = {
        "w_gate_up": rng.standard_normal((E, H, 2 * I)).astype(np.float32) / H**0.5,
        "w_down": rng.standard_normal((E, I, H)).astype(np.float32) / I**0.5,
    }

    tokens = NamedSharding(mesh, P(("data", "expert")))
    experts = NamedSharding(mesh, P("expert"))
    g_x, g_idx, g_w = (global_array(a, tokens) for a in (x, topk_idx, topk_weight))
    g_params = {n: global_array(p, experts) for n, p in params.items()}

    layer = jax.jit(
        lambda x, i, w, p: moe_pallas.moe_experts(
            x, i, w, p, activation="swiglu", mesh=mesh, exchange=ARGS.exchange, return_stats=True
        )
    )
    out, stats = layer(g_x, g_idx, g_w, g_params)
    # global arrays are arguments, never closed over (they span other processes' devices)
    grad = jax.jit(
        jax.grad(lambda x, i, w, p: jnp.sum(layer(x, i, w, p)[0] ** 2), argnums=(0, 2, 3))
    )
    grads = grad(g_x, g_idx, g_w, g_params)
    jax.block_until_ready(grads)

    # numpy inputs are not committed to the mesh: this runs on one local device
    reference = np.asarray(
        jax.jit(lambda *a: moe_pallas.moe_experts(*a, activation="swiglu"))(
            x, topk_idx, topk_weight, params
        )
    )
    stats = multihost_utils.process_allgather(stats, tiled=True)  # global values on every process
    worst = max(
        float(
            np.linalg.norm(np.asarray(s.data) - reference[s.index])
            / np.linalg.norm(reference[s.index])
        )
        for s in out.addressable_shards
    )
    print(
        f"process {me}: dropped_rows={int(stats['dropped_rows'])} "
        f"rows_per_shard={stats['rows_per_shard'].tolist()} "
        f"max rel err of my output shards vs one device: {worst:.2e}",
        flush=True,
    )
    if worst > 1e-4:
        raise SystemExit(
            f"process {me}: expert-parallel output differs from the single-device layer"
        )
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
