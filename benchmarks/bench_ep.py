"""Expert parallelism benchmark: 1 device (all E experts) vs N devices (E/N each), weak scaling.

    python -m benchmarks.bench_ep --out DIR [--devices N] [--workload swiglu|gptoss]
        [--small] [--tokens 2048,8192] [--exchange auto|ragged|all_to_all] [--capacity-factor F]
        [--implementation auto]

Workloads (bf16, random routing: top-k of normal logits, softmax weights): "swiglu" (H=4096,
I=2048, E=256, k=8) and "gptoss" (H=I=2880, E=128, k=4, biases, clamped GLU). N: every device by
default. For each T per device: the 1-device layer on T tokens and the N-device layer on N*T
tokens (each device T tokens and E/N experts), forward, then forward+backward while the time
budget lasts, with the dropped and spilled rows of `return_stats`. Weak-scaling efficiency =
time(1 device, T) / time(N devices, T per device). First a correctness check: the N-device layer
(forward and gradients) against the 1-device one on a small case. Timing: warm-up, then the median
of blocking calls. Writes DIR/ep_<workload>_<N>dev.json after every step.
`--small`: tiny shapes on N (default 2) simulated CPU devices (all_to_all exchange), to test this
script.
"""

import argparse
import json
import os
import sys
import time
from functools import partial
from pathlib import Path

WORKLOADS = {
    "swiglu": {"hidden": 4096, "inter": 2048, "experts": 256, "top_k": 8, "bias": False},
    "gptoss": {"hidden": 2880, "inter": 2880, "experts": 128, "top_k": 4, "bias": True},
}
SMALL = {"hidden": 64, "inter": 32, "experts": 16}


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", type=Path, required=True, help="directory for ep_<date>.json")
    p.add_argument("--devices", type=int, default=None, help="N (default: all; --small: 2)")
    p.add_argument("--workload", default="swiglu", choices=sorted(WORKLOADS))
    p.add_argument("--small", action="store_true", help="tiny shapes on N simulated CPU devices")
    p.add_argument(
        "--tokens", default=None, help="T per device, comma separated (default 2048,8192)"
    )
    p.add_argument("--exchange", default="auto", choices=("auto", "ragged", "all_to_all"))
    p.add_argument("--capacity-factor", type=float, default=None, help="default: never drop")
    p.add_argument("--implementation", default="auto")
    p.add_argument("--budget-s", type=float, default=330.0, help="skip steps past this wall time")
    return p.parse_args(argv)


ARGS = parse_args()
if ARGS.small:  # before jax is imported
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "")
        + f" --xla_force_host_platform_device_count={ARGS.devices or 2}"
    )
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import moe_pallas
from benchmarks import provenance
from benchmarks.sol import median_seconds

START = time.perf_counter()


def elapsed() -> float:
    return time.perf_counter() - START


def make_inputs(tokens, shape, dtype, seed=0):
    h, i, e, k = (shape[n] for n in ("hidden", "inter", "experts", "top_k"))
    ks = jax.random.split(jax.random.key(seed), 7)
    x = jax.random.normal(ks[0], (tokens, h), dtype)
    idx = jax.lax.top_k(jax.random.normal(ks[1], (tokens, e)), k)[1]
    w = jax.nn.softmax(jax.random.normal(ks[2], (tokens, k)), axis=-1)
    params = {
        "w_gate_up": (jax.random.normal(ks[3], (e, h, 2 * i), dtype) / h**0.5).astype(dtype),
        "w_down": (jax.random.normal(ks[4], (e, i, h), dtype) / i**0.5).astype(dtype),
    }
    if shape["bias"]:
        params["b_gate_up"] = (0.1 * jax.random.normal(ks[5], (e, 2 * i))).astype(dtype)
        params["b_down"] = (0.1 * jax.random.normal(ks[6], (e, h))).astype(dtype)
    return x, idx, w, params


def place(mesh, x, idx, w, params):
    """Tokens over every mesh axis, experts over "expert"."""
    tok = NamedSharding(mesh, P(tuple(mesh.axis_names)))
    exp = NamedSharding(mesh, P("expert"))
    return (
        jax.device_put(x, tok),
        jax.device_put(idx, tok),
        jax.device_put(w, tok),
        jax.tree.map(lambda p: jax.device_put(p, exp), params),
    )


def median_ms(fn, args) -> float:
    return 1e3 * median_seconds(fn, *args, warmup=2)


def layer_fns(activation, implementation, mesh=None, **ep):
    fwd = jax.jit(
        partial(
            moe_pallas.moe_experts,
            activation=activation,
            implementation=implementation,
            mesh=mesh,
            **ep,
        )
    )

    def loss(x, idx, w, params):
        return jnp.sum(fwd(x, idx, w, params).astype(jnp.float32) ** 2)

    train = jax.jit(jax.grad(loss, argnums=(0, 2, 3)))
    return fwd, train


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def main():
    devices = jax.devices()
    n = ARGS.devices or len(devices)
    if not 2 <= n <= len(devices):
        sys.exit(f"needs 2 <= --devices <= {len(devices)} devices, got {n}: {devices}")
    shape = WORKLOADS[ARGS.workload]
    activation = ARGS.workload
    if ARGS.small:
        shape = {**shape, **SMALL}
    dtype = jnp.bfloat16
    tokens = [int(t) for t in (ARGS.tokens or ("32,64" if ARGS.small else "2048,8192")).split(",")]
    one = devices[0]
    mesh = moe_pallas.expert_mesh(n, devices=devices[:n])
    exchange = ARGS.exchange
    ep = {"exchange": exchange, "capacity_factor": ARGS.capacity_factor}
    ARGS.out.mkdir(parents=True, exist_ok=True)
    path = ARGS.out / f"ep_{ARGS.workload}_{n}dev.json"
    result = {
        "device": str(one.device_kind),
        "commit": provenance.git_commit(),
        "command": "python -m benchmarks.bench_ep " + " ".join(sys.argv[1:]),
        "devices": n,
        "jax": jax.__version__,
        "workload": ARGS.workload,
        "shape": shape,
        "dtype": "bfloat16",
        "exchange": exchange,
        "capacity_factor": ARGS.capacity_factor,
        "implementation": ARGS.implementation,
        "correctness": {},
        "rows": [],
    }

    def save():
        path.write_text(json.dumps(result, indent=1))

    # Correctness: N-device layer vs 1-device layer on a small case (forward and gradients).
    small = {
        **shape,
        "hidden": min(shape["hidden"], 256),
        "inter": min(shape["inter"], 128),
        "experts": n * max(2, -(-2 * shape["top_k"] // n)),  # divisible by N, at least 2k
    }
    x, idx, w, params = make_inputs(32 * n, small, dtype, seed=1)
    fwd1, train1 = layer_fns(activation, ARGS.implementation)
    fwd2, train2 = layer_fns(activation, ARGS.implementation, mesh, **ep)
    args1 = jax.device_put((x, idx, w, params), one)
    args2 = place(mesh, x, idx, w, params)
    g1, g2 = train1(*args1), train2(*args2)
    result["correctness"] = {
        "fwd_rel_err": rel(fwd2(*args2), fwd1(*args1)),
        "grad_rel_err": max(rel(a, b) for a, b in zip(jax.tree.leaves(g2), jax.tree.leaves(g1))),
    }
    save()
    print(f"correctness ({n} devices vs 1, bf16): {result['correctness']}", flush=True)

    for mode in ("fwd", "fwd+bwd"):
        for t in tokens:
            if elapsed() > ARGS.budget_s:
                print(f"skipping {mode} T={t}: past the {ARGS.budget_s:.0f} s budget", flush=True)
                continue
            x, idx, w, params = make_inputs(n * t, shape, dtype, seed=t)
            row = {"mode": mode, "tokens_per_device": t}
            fwd1, train1 = layer_fns(activation, ARGS.implementation)
            fwd2, train2 = layer_fns(activation, ARGS.implementation, mesh, **ep)
            f1, f2 = (fwd1, fwd2) if mode == "fwd" else (train1, train2)
            args1 = jax.device_put((x[:t], idx[:t], w[:t], params), one)
            row["ms_1dev"] = median_ms(f1, args1)
            del args1
            args2 = place(mesh, x, idx, w, params)
            row["ms_ep"] = median_ms(f2, args2)
            row["efficiency"] = row["ms_1dev"] / row["ms_ep"]
            if mode == "fwd":
                stats = jax.jit(
                    partial(
                        moe_pallas.moe_experts,
                        activation=activation,
                        mesh=mesh,
                        implementation=ARGS.implementation,
                        return_stats=True,
                        **ep,
                    )
                )(*args2)[1]
                row["dropped_rows"] = int(stats["dropped_rows"])
                row["spilled_rows"] = int(stats["spilled_rows"])
                row["rows_per_shard"] = stats["rows_per_shard"].tolist()
                row["capacity_rows"] = int(stats["capacity_rows"])
            del args2
            result["rows"].append(row)
            save()
            print(json.dumps(row), flush=True)

    head = f"{n} dev ms"
    print(f"\n{'mode':8} {'T/dev':>6} {'1 dev ms':>9} {head:>9} {'eff':>6} dropped spilled")
    for r in result["rows"]:
        print(
            f"{r['mode']:8} {r['tokens_per_device']:>6} {r['ms_1dev']:>9.3f} {r['ms_ep']:>9.3f} "
            f"{r['efficiency']:>6.2f} {r.get('dropped_rows', ''):>7} {r.get('spilled_rows', '')}"
        )
    print(f"wrote {path} in {elapsed():.0f} s")


if __name__ == "__main__":
    main()
