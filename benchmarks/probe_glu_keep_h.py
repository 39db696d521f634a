"""Probe: the train step with gate_up writing h and a in one kernel (`keep_pre_activation`)
against h then an XLA GLU pass, alternating rounds in one process, gradients compared.

    python -m benchmarks.probe_glu_keep_h OUT_DIR
"""

import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import cases as C
from benchmarks import impls
from benchmarks import run as R
from moe_pallas import backends
from moe_pallas.activations import glu, split_gate_up

ONE_KERNEL = backends.gmm


def two_passes(policy, *args, keep_pre_activation=False, **kwargs):
    """The forward as before: h from the plain gmm, then the GLU of h in XLA."""
    if not keep_pre_activation:
        return ONE_KERNEL(policy, *args, **kwargs)
    activation = kwargs.pop("activation")
    h = ONE_KERNEL(policy, *args, **kwargs)
    a = glu(*split_gate_up(h.astype(jnp.float32), activation), activation).astype(h.dtype)
    return a, h


def main(out_dir):
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cases = [
        C.Case("train", C.WORKLOADS["gptoss"], 16384, "train"),
        C.Case("train", C.WORKLOADS["swiglu256"], 8192, "train"),
        C.Case("train", C.WORKLOADS["gptoss"], 4096, "train"),
        C.Case("train", C.WORKLOADS["swiglu256"], 2048, "train"),
    ]
    for case in cases:
        params = C.make_params(case.workload)
        inputs = R._inputs(case, params)
        preps = {}
        for label, fn in (("h + XLA glu", two_passes), ("one kernel", ONE_KERNEL)):
            backends.gmm = fn
            preps[label] = impls._ours("auto")(case, inputs)
        backends.gmm = ONE_KERNEL
        row = {"case": f"{case.workload.name} train T={case.tokens}"}
        outs = {}
        for _ in range(3):
            for label, prep in preps.items():
                s, _, out = R.measure(prep, 1.5)
                row.setdefault(label, []).append(round(s * 1e3, 4))
                outs[label] = out
        for label in preps:
            row[label + " median"] = float(np.median(row[label]))
        diffs = jax.tree.map(
            lambda a, b: float(
                jnp.linalg.norm((a - b).astype(jnp.float32))
                / jnp.maximum(jnp.linalg.norm(b.astype(jnp.float32)), 1e-30)
            ),
            outs["one kernel"],
            outs["h + XLA glu"],
        )
        row["max rel diff of loss and gradients"] = max(jax.tree.leaves(diffs))
        print(json.dumps(row), flush=True)
        with (out_dir / "keep_h.jsonl").open("a") as f:
            f.write(json.dumps(row) + "\n")
        del preps, outs, inputs, params


if __name__ == "__main__":
    main(*sys.argv[1:])
