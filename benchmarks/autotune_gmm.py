"""Autotune the grouped-matmul block configs per shape class on the layer's own calls and rewrite
the table in moe_pallas/kernels/config.py (between its BEGIN/END TABLE markers).

Each (kernel, class) is timed on the calls the fused layer makes, at both seed workloads
(`benchmarks.cases.WORKLOADS`: gpt-oss H = I = 2880, E = 128, k = 4, biases; SwiGLU-256
H = 4096, I = 2048, E = 256, k = 8) with uniform random routing at the class's token count; the
candidate with the least total time wins:

  gmm      gate_up → h (in-kernel row gather, bias) and down (bias, routing-weight row scale)
  gmm_glu  gate_up with the GLU epilogue (the no-gradient forward)
  gmm_t    dx = dh @ w_gate_upᵀ
  tgmm     d w_down = aᵀ dy and d w_gate_up = x[row_token]ᵀ dh

Run on the GPU the table is for:

    PYTHONPATH=. python3 benchmarks/autotune_gmm.py --classes small --write moe_pallas/kernels/config.py
"""

import argparse
import dataclasses
import json
import pathlib
import re

import jax
import jax.numpy as jnp

from benchmarks.bench_gmm import time_op
from benchmarks.cases import SMALL_WORKLOADS, WORKLOADS
from moe_pallas import dispatch
from moe_pallas.kernels import config as _config
from moe_pallas.kernels import gmm, tgmm

C = _config.BlockConfig
GMM_CANDIDATES = {
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
        C(128, 128, 128, 8, 8, 3),
        C(128, 64, 128, 8, 4, 4),
        C(128, 256, 64, 8, 8, 4),
        # Bucketed M: a visit of few rows runs a shorter tile (see BlockConfig.m_paths).
        C(128, 256, 64, 8, 8, 4, min_block_m=64),
        C(128, 256, 64, 8, 8, 4, min_block_m=16),
    ],
    "large": [
        C(128, 256, 64, 8, 8, 3),
        C(128, 128, 64, 8, 4, 4),
        C(128, 256, 64, 8, 8, 4),
        C(256, 128, 64, 8, 8, 3),
        C(128, 128, 128, 8, 8, 3),
        C(128, 256, 64, 8, 8, 4, min_block_m=16),
        C(128, 256, 64, 8, 8, 3, min_block_m=32),
        C(128, 128, 64, 8, 8, 3, min_block_m=16),
        C(256, 128, 64, 8, 8, 3, min_block_m=32),
    ],
}
# A GLU tile reads 2·block_n weight columns: the same tiles with half the output columns, and more.
GLU_CANDIDATES = {
    cls: [
        *(dataclasses.replace(c, block_n=c.block_n // 2) for c in cands),
        *(c for c in cands if c.block_n <= 64),
    ]
    for cls, cands in GMM_CANDIDATES.items()
}
TGMM_CANDIDATES = [
    C(32, 128, 128, 1, 4, 4),
    C(64, 128, 128, 1, 4, 3),
    C(32, 128, 128, 4, 4, 4),
    C(32, 128, 128, 16, 4, 4),
    C(64, 128, 128, 8, 4, 3),
    C(64, 128, 64, 8, 4, 4),
    C(64, 256, 128, 4, 8, 3),
    C(128, 128, 128, 4, 8, 3),
    C(32, 256, 128, 8, 8, 3),
    C(16, 128, 128, 16, 4, 4),
]
TOKENS = {"tiny": 64, "small": 2048, "large": {"gptoss": 16384, "swiglu256": 8192}}


def _problem(workload, tokens, small=False):
    """The arrays of one layer step, dispatched: x, weights, biases, h, a, dh, dy, metadata."""
    w = (SMALL_WORKLOADS if small else WORKLOADS)[workload]
    hidden, inter, experts, top_k = w.hidden, w.inter, w.experts, w.top_k
    keys = iter(jax.random.split(jax.random.key(tokens), 10))
    bf16 = jnp.bfloat16
    d = dispatch.dispatch(
        jax.random.randint(next(keys), (tokens, top_k), 0, experts, jnp.int32), experts
    )
    m = tokens * top_k
    p = {
        "x": jax.random.normal(next(keys), (tokens, hidden), bf16),
        "w_gate_up": jax.random.normal(next(keys), (experts, hidden, 2 * inter), bf16) * 0.02,
        "w_down": jax.random.normal(next(keys), (experts, inter, hidden), bf16) * 0.02,
        "h": jax.random.normal(next(keys), (m, 2 * inter), bf16),
        "a": jax.random.normal(next(keys), (m, inter), bf16),
        "dy": jax.random.normal(next(keys), (m, hidden), bf16),
        "row_weight": jax.random.uniform(next(keys), (m,), jnp.float32),
        "row_token": d.row_token,
        "sizes": d.group_sizes,
    }
    p["dh"] = p["h"]
    if w.bias:
        p["b_gate_up"] = jax.random.normal(next(keys), (experts, 2 * inter), bf16)
        p["b_down"] = jax.random.normal(next(keys), (experts, hidden), bf16)
    p["activation"] = w.activation
    return p


def _calls(kernel, cfg, p):
    """[(op(carry, *args), carry, args)] of one kernel's layer calls with config cfg."""
    bias_gu, bias_d = p.get("b_gate_up"), p.get("b_down")
    if kernel == "gmm":
        return [
            (
                lambda x, w, s, r: gmm(x, w, s, lhs_row_index=r, bias=bias_gu, config=cfg),
                p["x"],
                (p["w_gate_up"], p["sizes"], p["row_token"]),
            ),
            (
                lambda a, w, s, rw: gmm(a, w, s, bias=bias_d, row_scale=rw, config=cfg),
                p["a"],
                (p["w_down"], p["sizes"], p["row_weight"]),
            ),
        ]
    if kernel == "gmm_glu":
        act = p["activation"]
        return [
            (
                lambda x, w, s, r: gmm(
                    x, w, s, lhs_row_index=r, bias=bias_gu, activation=act, config=cfg
                ),
                p["x"],
                (p["w_gate_up"], p["sizes"], p["row_token"]),
            )
        ]
    if kernel == "gmm_t":
        return [
            (
                lambda dh, w, s: gmm(dh, w, s, transpose_rhs=True, config=cfg),
                p["dh"],
                (p["w_gate_up"], p["sizes"]),
            )
        ]
    if kernel == "tgmm":
        return [
            (lambda a, dy, s: tgmm(a, dy, s, config=cfg), p["a"], (p["dy"], p["sizes"])),
            (
                lambda x, dh, s, r: tgmm(x, dh, s, lhs_row_index=r, config=cfg),
                p["x"],
                (p["dh"], p["sizes"], p["row_token"]),
            ),
        ]
    raise ValueError(kernel)


def _candidates(kernel, cls, around_table=False):
    if around_table:  # the table's entry, its bucketed-M and tail_m variants (gmm kernels only)
        entry = _config._TABLE[(kernel, cls)]
        lows = [m for m in (entry.block_m // 2, 16) if 16 <= m < entry.block_m]
        if kernel == "tgmm":
            return [entry]
        tails = [dataclasses.replace(entry, tail_m=t) for t in (0, 32, 64) if t <= entry.block_m]
        lows = [dataclasses.replace(entry, min_block_m=m) for m in lows]
        return list(dict.fromkeys([entry, *lows, *tails]))
    if kernel == "tgmm":
        return TGMM_CANDIDATES
    return (GLU_CANDIDATES if kernel == "gmm_glu" else GMM_CANDIDATES)[cls]


# --small: tiny workloads, tokens and tiles, to test this script on CPU (interpret mode).
SMALL_CANDIDATES = [C(16, 16, 16, 2, 4, 2), C(16, 32, 16, 1, 4, 2)]


def tune(kernels, classes, workloads, small=False, around_table=False, done=lambda t, log: None):
    """(table, log) after timing every candidate; `done(table, log)` after each (kernel, class),
    so a run stopped by a time limit keeps what it measured."""
    table = dict(_config._TABLE)
    log = []
    for cls in classes:
        problems = {}
        for w in workloads:
            tokens = TOKENS[cls]
            tokens = tokens[w] if isinstance(tokens, dict) else tokens
            problems[w] = _problem(w, 16 if small else tokens, small)
        for kernel in kernels:
            best = None
            for cfg in SMALL_CANDIDATES if small else _candidates(kernel, cls, around_table):
                entry = {"kernel": kernel, "cls": cls, "cfg": dataclasses.asdict(cfg)}
                try:
                    per_workload = {
                        w: sum(
                            time_op(op, carry, *args, target_s=0.03) * 1e3
                            for op, carry, args in _calls(kernel, cfg, p)
                        )
                        for w, p in problems.items()
                    }
                except Exception as err:  # noqa: BLE001 - e.g. shared memory exceeded
                    log.append({**entry, "error": str(err)[:200]})
                    print(f"{kernel:7} {cls:6} {cfg} failed: {str(err)[:100]}", flush=True)
                    continue
                total = sum(per_workload.values())
                log.append({**entry, "ms": per_workload, "total_ms": total})
                print(f"{kernel:7} {cls:6} {cfg} {per_workload} {total:.3f} ms", flush=True)
                if best is None or total < best[0]:
                    best = (total, cfg)
            if best is not None:
                table[(kernel, cls)] = best[1]
            done(table, log)
        del problems
    return table, log


def render(table):
    lines = ["_TABLE: dict[tuple[str, str], BlockConfig] = {"]
    for (kernel, cls), c in sorted(table.items()):
        args = (
            f"{c.block_m}, {c.block_n}, {c.block_k}, group_m={c.group_m}, "
            f"num_warps={c.num_warps}, num_stages={c.num_stages}"
            + ("" if c.min_block_m is None else f", min_block_m={c.min_block_m}")
            + (f", tail_m={c.tail_m}" if c.tail_m else "")
        )
        line = f'    ("{kernel}", "{cls}"): BlockConfig({args}),'
        if len(line) > 100:  # wrapped as ruff format would (line length 100)
            line = f'    ("{kernel}", "{cls}"): BlockConfig(\n        {args}\n    ),'
        lines.append(line)
    return "\n".join([*lines, "}"])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", help="config.py to rewrite (default: print the table only)")
    parser.add_argument("--log", default="gmm_autotune.json")
    parser.add_argument("--kernels", nargs="+", default=["gmm", "gmm_glu", "gmm_t", "tgmm"])
    parser.add_argument("--classes", nargs="+", default=list(TOKENS))
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    parser.add_argument("--small", action="store_true", help="tiny shapes (CPU smoke test)")
    parser.add_argument(
        "--around-table",
        action="store_true",
        help="time only each table entry and its bucketed-M variants (min_block_m below block_m) and tail_m variants",
    )
    args = parser.parse_args(argv)

    def write(table, log):
        with open(args.log, "w") as f:
            meta = {"device": jax.devices()[0].device_kind, "jax": jax.__version__}
            json.dump({**meta, "log": log}, f, indent=1)
        if args.write:
            path = pathlib.Path(args.write)
            src = re.sub(
                r"(# BEGIN TABLE.*?\n).*?(\n# END TABLE)",
                lambda m: m[1] + render(table) + m[2],
                path.read_text(),
                flags=re.DOTALL,
            )
            path.write_text(src)

    table, _ = tune(
        args.kernels, args.classes, args.workloads, args.small, args.around_table, done=write
    )
    print(render(table))


if __name__ == "__main__":
    main()
