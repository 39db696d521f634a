"""Probe: the layer on the table with the ping-pong entries (151c506) against the table before
them, beside the cuBLAS line, alternating rounds; and the compiled gpt-oss train step's HLO, to
name its XLA fusions.

    python -m benchmarks.probe_layer_state OLD_TUNING_JSON OUT_DIR
"""

import copy
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import moe_pallas
from benchmarks import cases as C
from benchmarks import impls
from benchmarks import run as R
from moe_pallas import tuning

DEVICE = "NVIDIA H200"


def main(old_path, out_dir):
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    entries = tuning.table()["devices"][DEVICE]["entries"]
    new = copy.deepcopy(entries)
    old = json.loads(Path(old_path).read_text())["devices"][DEVICE]["entries"]

    def log(row):
        print(json.dumps(row), flush=True)
        with (out_dir / "layer_state.jsonl").open("a") as f:
            f.write(json.dumps(row) + "\n")

    cases = [
        C.Case("gptoss", C.WORKLOADS["gptoss"], 16384),
        C.Case("train", C.WORKLOADS["gptoss"], 16384, "train"),
    ]
    for case in cases:
        params = C.make_params(case.workload)
        inputs = R._inputs(case, params)
        preps = {}
        for label, table in (("before", old), ("now", new)):
            entries[:] = copy.deepcopy(table)
            preps[label] = impls._ours("auto")(case, inputs)
        entries[:] = copy.deepcopy(new)
        preps["line"] = impls.IMPLS["cublas_line"](case, inputs)
        row = {
            "case": f"{case.workload.name} {case.mode} T={case.tokens}",
            "line note": preps["line"].note,
        }
        outs = {}
        for _ in range(3):
            for label, prep in preps.items():
                s, _, out = R.measure(prep, 1.5)
                row.setdefault(label, []).append(round(s * 1e3, 4))
                outs[label] = out
        for label in preps:
            row[label + " median"] = float(np.median(row[label]))
        row["now / line"] = row["now median"] / row["line median"]
        row["before / line"] = row["before median"] / row["line median"]
        same = jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), outs["before"], outs["now"])
        row["bitwise equal"] = all(jax.tree.leaves(same))
        log(row)
        if case.mode == "train":
            activation = case.workload.activation
            layer = lambda x, i, w, p: moe_pallas.moe_experts(
                x, i, w, p, activation=activation, implementation="auto"
            )
            args = [inputs[k] for k in ("x", "topk_idx", "topk_weight", "params", "dout")]
            text = jax.jit(impls._train_step(layer)).lower(*args).compile().as_text()
            (out_dir / "train_gptoss_16384.hlo.txt").write_text(text)
        del preps, outs, inputs, params


if __name__ == "__main__":
    main(*sys.argv[1:])
