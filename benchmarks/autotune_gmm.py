"""Autotune the gmm / tgmm block configs per shape class and rewrite the table in
moe_pallas/kernels/config.py (between its BEGIN/END TABLE markers).

Each class is timed at a gpt-oss gate_up shape (K = 2880, N = 5760, E = 128; gmm_t is the
transposed-rhs product of the input gradient) with a row count of its class; the fastest candidate
wins. Run on the GPU the table is for:

    PYTHONPATH=. python3 benchmarks/autotune_gmm.py --write moe_pallas/kernels/config.py
"""

import argparse
import dataclasses
import json
import pathlib
import re

import jax
import jax.numpy as jnp

from benchmarks.bench_gmm import time_op
from moe_pallas import dispatch
from moe_pallas.kernels import config as _config
from moe_pallas.kernels import gmm, tgmm

C = _config.BlockConfig
CANDIDATES = {
    "tiny": [
        C(16, 64, 128, 8, 4, 4),
        C(16, 32, 128, 8, 4, 4),
        C(16, 64, 64, 8, 4, 5),
        C(16, 128, 128, 8, 4, 3),
        C(16, 64, 256, 8, 8, 3),
    ],
    "small": [
        C(64, 128, 64, 8, 4, 4),
        C(64, 256, 64, 8, 8, 3),
        C(128, 128, 64, 8, 4, 4),
        C(128, 256, 64, 8, 8, 3),
        C(64, 128, 128, 8, 4, 3),
        C(64, 256, 64, 8, 4, 4),
        C(128, 256, 64, 8, 8, 4),
    ],
    "large": [
        C(128, 256, 64, 8, 8, 3),
        C(128, 128, 64, 8, 4, 4),
        C(128, 256, 64, 8, 8, 4),
        C(256, 128, 64, 8, 8, 3),
        C(128, 128, 128, 8, 8, 3),
    ],
}
TGMM_CANDIDATES = [
    C(64, 128, 128, 8, 4, 3),
    C(64, 128, 64, 8, 4, 4),
    C(128, 128, 128, 8, 8, 3),
    C(32, 128, 128, 8, 4, 4),
    C(64, 256, 128, 8, 8, 3),
    C(32, 256, 128, 8, 8, 3),
    C(16, 128, 128, 8, 4, 4),
    C(32, 128, 64, 8, 4, 4),
]
TOKENS = {"tiny": 64, "small": 2048, "large": 16384}
K_DIM, N_DIM, E, TOP_K = 2880, 5760, 128, 4


def _problem(t):
    k1, k2, k3, k4 = jax.random.split(jax.random.key(t), 4)
    sizes = dispatch.dispatch(jax.random.randint(k1, (t, TOP_K), 0, E, jnp.int32), E).group_sizes
    m = t * TOP_K
    lhs = jax.random.normal(k2, (m, K_DIM), jnp.bfloat16)
    rhs = jax.random.normal(k3, (E, K_DIM, N_DIM), jnp.bfloat16)
    d_out = jax.random.normal(k4, (m, N_DIM), jnp.bfloat16)
    return lhs, rhs, d_out, sizes


def _ops(cfg):
    return {
        "gmm": (lambda x, w, s: gmm(x, w, s, config=cfg), "lhs", "rhs"),
        "gmm_t": (lambda dy, w, s: gmm(dy, w, s, transpose_rhs=True, config=cfg), "d_out", "rhs"),
        "tgmm": (lambda x, dy, s: tgmm(x, dy, s, config=cfg), "lhs", "d_out"),
    }


def tune(kernels, classes):
    table = dict(_config._TABLE)
    log = []
    for cls in classes:
        lhs, rhs, d_out, sizes = _problem(TOKENS[cls])
        arrays = {"lhs": lhs, "rhs": rhs, "d_out": d_out}
        for kernel in kernels:
            best = None
            for cfg in TGMM_CANDIDATES if kernel == "tgmm" else CANDIDATES[cls]:
                fn, a, b = _ops(cfg)[kernel]
                try:
                    s = time_op(fn, arrays[a], arrays[b], sizes, target_s=0.03)
                except Exception as err:  # noqa: BLE001 - e.g. shared memory exceeded
                    log.append(
                        {
                            "kernel": kernel,
                            "cls": cls,
                            "cfg": dataclasses.asdict(cfg),
                            "error": str(err)[:200],
                        }
                    )
                    continue
                log.append(
                    {"kernel": kernel, "cls": cls, "cfg": dataclasses.asdict(cfg), "ms": s * 1e3}
                )
                print(f"{kernel:6} {cls:6} {cfg} {s * 1e3:.3f} ms", flush=True)
                if best is None or s < best[0]:
                    best = (s, cfg)
            if best is not None:
                table[(kernel, cls)] = best[1]
        del lhs, rhs, d_out
    return table, log


def render(table):
    lines = ["_TABLE: dict[tuple[str, str], BlockConfig] = {"]
    for (kernel, cls), c in sorted(table.items()):
        lines.append(
            f'    ("{kernel}", "{cls}"): BlockConfig({c.block_m}, {c.block_n}, {c.block_k}, '
            f"group_m={c.group_m}, num_warps={c.num_warps}, num_stages={c.num_stages}),"
        )
    return "\n".join([*lines, "}"])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", help="config.py to rewrite (default: print the table only)")
    parser.add_argument("--log", default="gmm_autotune.json")
    parser.add_argument("--kernels", nargs="+", default=["gmm", "gmm_t", "tgmm"])
    parser.add_argument("--classes", nargs="+", default=list(TOKENS))
    args = parser.parse_args()
    table, log = tune(args.kernels, args.classes)
    with open(args.log, "w") as f:
        json.dump(
            {"device": jax.devices()[0].device_kind, "jax": jax.__version__, "log": log},
            f,
            indent=1,
        )
    text = render(table)
    print(text)
    if args.write:
        path = pathlib.Path(args.write)
        src = path.read_text()
        src = re.sub(
            r"(# BEGIN TABLE.*?\n).*?(\n# END TABLE)",
            lambda m: m[1] + text + m[2],
            src,
            flags=re.DOTALL,
        )
        path.write_text(src)


if __name__ == "__main__":
    main()
