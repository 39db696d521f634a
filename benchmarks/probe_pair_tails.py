"""Probe: ping-pong tiles whose short last visits are paired (`MosaicConfig.pair_tails`, #32).

Part `gmm`: per (kernel, K, N) of the layers' compute-bound matmuls and two row classes (large:
65536 rows; small: 128 rows per expert), the table's choice against ping-pong tiles with and
without paired tails, on routed rows (uniform top-k ids); outputs compared with the table's.
Winners (>= 2% faster than the table) are written to OUT/winners.json.

Part `layer` (reads OUT/winners.json from part gmm, or the file given): the forward and train
steps with the old and the new entries in alternating rounds, outputs compared bit for bit.

    python -m benchmarks.probe_pair_tails gmm OUT_DIR [--budget-s S]
    python -m benchmarks.probe_pair_tails layer OUT_DIR WINNERS_JSON
"""

import copy
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import cases as C
from benchmarks import impls
from benchmarks import run as R
from benchmarks.bench_gmm import time_op
from moe_pallas import backends, dispatch, tuning

DEVICE = "NVIDIA H200"
SHAPES = [  # (kernel, K, N, E, k, what)
    ("gmm", 2880, 2880, 128, 4, "gpt-oss down"),
    ("gmm_t", 2880, 2880, 128, 4, "gpt-oss dx of down"),
    ("gmm_t", 5760, 2880, 128, 4, "gpt-oss dx of gate_up"),
    ("gmm", 2880, 5760, 128, 4, "gpt-oss gate_up (ragged_dot)"),
    ("gmm", 2048, 4096, 256, 8, "SwiGLU down"),
    ("gmm_t", 4096, 2048, 256, 8, "SwiGLU dx of down"),
    ("gmm_t", 4096, 4096, 256, 8, "SwiGLU dx of gate_up"),
    ("gmm", 4096, 4096, 256, 8, "SwiGLU gate_up (ragged_dot)"),
]
ROWS = {"large": lambda experts: 65536, "small": lambda experts: 128 * experts}


def pp(block_n, stages, pair):
    return {
        "block_m": 128,
        "block_n": block_n,
        "block_k": 64,
        "num_stages": stages,
        "grid_tile_n": 4,
        "consumers": 2,
        "split": "pingpong",
        "epi_n": 64,
        "pair_tails": pair,
    }


VARIANTS = {
    "pp192 s4 pair": pp(192, 4, True),
    "pp192 s4 whole": pp(192, 4, False),
    "pp128 s5 pair": pp(128, 5, True),
    "pp128 s5 whole": pp(128, 5, False),
}


def entries():
    return tuning.table()["devices"][DEVICE]["entries"]


def set_entries(new):
    entries()[:] = copy.deepcopy(new)


def mosaic_entry(kernel, k, n, rows, cfg):
    return {
        "backend": "mosaic_gpu",
        "kernel": kernel,
        "dtype": ["bfloat16", "float16"],
        "k": k,
        "n": n,
        "rows": rows,
        "config": cfg,
    }


def without(table, kernel, k, n, rows):
    return [
        e
        for e in table
        if not (
            e["backend"] == "mosaic_gpu"
            and (e["kernel"], e["k"], e["n"], e["rows"]) == (kernel, k, n, rows)
        )
    ]


def gmm_ab(out_dir, log, budget_s):
    start = time.perf_counter()
    base = copy.deepcopy(entries())
    winners = []
    for rows_class in ("large", "small"):
        for kernel, k_dim, n_dim, experts, top_k, what in SHAPES:
            if time.perf_counter() - start > budget_s:
                log({"stopped": "budget", "at": [rows_class, what]})
                break
            rows = ROWS[rows_class](experts)
            t = kernel == "gmm_t"
            k1, k2, k3 = jax.random.split(jax.random.key(k_dim + n_dim), 3)
            lhs = jax.random.normal(k2, (rows, k_dim), jnp.bfloat16)
            shape = (experts, n_dim, k_dim) if t else (experts, k_dim, n_dim)
            rhs = (jax.random.normal(k3, shape, jnp.float32) * k_dim**-0.5).astype(jnp.bfloat16)
            idx = jax.random.randint(k1, (rows // top_k, top_k), 0, experts, jnp.int32)
            sizes = dispatch.dispatch(idx, experts).group_sizes
            flops = 2 * rows * k_dim * n_dim

            def fn(x, w, s, t=t):  # the layer's call: the backend seam under "auto"
                return backends.gmm("auto", x, w, s, transpose_rhs=t)

            row = {"shape": what, "rows": rows, "class": rows_class}
            plain = without(base, kernel, k_dim, n_dim, rows_class)
            set_entries(base)
            ref = jax.jit(fn)(lhs, rhs, sizes)
            ref32 = ref.astype(jnp.float32)
            row["table"] = round(flops / time_op(fn, lhs, rhs, sizes) / 1e12, 1)
            best, best_label = row["table"], "table"
            outs = {}
            for label, cfg in VARIANTS.items():
                if n_dim % cfg["block_n"]:
                    continue
                set_entries(plain + [mosaic_entry(kernel, k_dim, n_dim, rows_class, cfg)])
                try:
                    out = jax.jit(fn)(lhs, rhs, sizes)
                    err = jnp.linalg.norm(out.astype(jnp.float32) - ref32) / jnp.linalg.norm(ref32)
                    row[label + " err"] = float(err)
                    outs[label] = out
                    row[label] = round(flops / time_op(fn, lhs, rhs, sizes) / 1e12, 1)
                except Exception as e:  # noqa: BLE001 - probe: record and go on
                    row[label] = f"{type(e).__name__}: {str(e)[:300]}"
                    continue
                if row[label] > 1.02 * best:
                    best, best_label = row[label], label
            for n, st in ((192, 4), (128, 5)):
                a, b = outs.get(f"pp{n} s{st} pair"), outs.get(f"pp{n} s{st} whole")
                if a is not None and b is not None:
                    row[f"pp{n} pair == whole"] = bool(jnp.array_equal(a, b))
            row["chosen"] = best_label
            if best_label != "table":
                winners.append(mosaic_entry(kernel, k_dim, n_dim, rows_class, VARIANTS[best_label]))
            log(row)
            del lhs, rhs, ref, ref32, outs
    set_entries(base)
    (out_dir / "winners.json").write_text(json.dumps(winners, indent=1))
    return winners


def layer_ab(winners, log, budget_s=1.5):
    base = copy.deepcopy(entries())
    new = base
    for e in winners:
        new = without(new, e["kernel"], e["k"], e["n"], e["rows"])
    new = new + winners
    cases = [
        C.Case("gptoss", C.WORKLOADS["gptoss"], 16384),
        C.Case("gptoss", C.WORKLOADS["gptoss"], 4096),
        C.Case("swiglu256", C.WORKLOADS["swiglu256"], 8192),
        C.Case("swiglu256", C.WORKLOADS["swiglu256"], 4096),
        C.Case("train", C.WORKLOADS["gptoss"], 16384, "train"),
        C.Case("train", C.WORKLOADS["gptoss"], 4096, "train"),
        C.Case("train", C.WORKLOADS["swiglu256"], 8192, "train"),
    ]
    for case in cases:
        params = C.make_params(case.workload)
        inputs = R._inputs(case, params)
        preps = {}
        for label, table in (("old", base), ("new", new)):
            set_entries(table)
            preps[label] = impls._ours("auto")(case, inputs)
        row = {"case": f"{case.workload.name} {case.mode} T={case.tokens}"}
        outs = {}
        for _ in range(3):
            for label, prep in preps.items():
                s, _, out = R.measure(prep, budget_s)
                row.setdefault(label, []).append(round(s * 1e3, 4))
                outs[label] = out
        same = jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), outs["old"], outs["new"])
        row["bitwise equal"] = all(jax.tree.leaves(same))
        row["old median"] = float(np.median(row["old"]))
        row["new median"] = float(np.median(row["new"]))
        log(row)
        del preps, outs, inputs, params
    set_entries(base)


def main(argv):
    part, out_dir = argv[0], Path(argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    log_path = out_dir / f"pair_tails_{part}.jsonl"

    def log(row):
        print(json.dumps(row), flush=True)
        with log_path.open("a") as f:
            f.write(json.dumps(row) + "\n")

    start = time.perf_counter()
    if part == "gmm":
        budget = float(argv[argv.index("--budget-s") + 1]) if "--budget-s" in argv else 1e9
        log({"winners": gmm_ab(out_dir, log, budget)})
    else:
        layer_ab(json.loads(Path(argv[2]).read_text()), log)
    log({"elapsed_s": time.perf_counter() - start})


if __name__ == "__main__":
    main(sys.argv[1:])
