"""Where the expert-parallel layer's time goes: a jax.profiler trace of the N-device forward, the
exchange alone (identity experts) and fwd+bwd, summarised per GPU kernel.

    PYTHONPATH=. python3 benchmarks/profile_ep.py --out DIR [--workload swiglu|gptoss] [--tokens 2048]

Options are bench_ep.py's (it reads them when imported): the first --tokens value is used, and
--exchange, --capacity-factor and --implementation apply as there.

The report per call and device is `benchmarks.trace.profile`'s.
"""

import sys

import jax
import jax.numpy as jnp

import moe_pallas
from benchmarks import bench_ep, trace
from moe_pallas import parallel


def main():
    args = bench_ep.ARGS
    tokens = int((args.tokens or "2048").split(",")[0])
    shape = bench_ep.WORKLOADS[args.workload]
    if args.small:
        shape = {**shape, **bench_ep.SMALL}
    n = args.devices or len(jax.devices())
    if n < 2:
        sys.exit("needs at least 2 devices")
    mesh = moe_pallas.expert_mesh(n, devices=jax.devices()[:n])
    inputs = bench_ep.place(mesh, *bench_ep.make_inputs(n * tokens, shape, jnp.bfloat16))
    exchange = parallel.resolve_exchange(args.exchange)
    ep = {"exchange": exchange, "capacity_factor": args.capacity_factor}
    fwd, train = bench_ep.layer_fns(args.workload, args.implementation, mesh, **ep)
    capacity = parallel.capacity_rows(exchange, tokens * shape["top_k"], n, args.capacity_factor)
    exchange = bench_ep.exchange_round_trip(
        mesh, exchange, tokens, shape["top_k"], shape["experts"], capacity
    )
    fns = {"fwd": (fwd, inputs), "exchange": (exchange, inputs[:3]), "train": (train, inputs)}
    print(trace.profile(fns, f"{args.out}/trace"))


if __name__ == "__main__":
    main()
