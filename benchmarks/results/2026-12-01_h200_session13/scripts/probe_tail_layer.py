"""The layer ("auto") with the table's tail_m against the same table without it, alternating
rounds (benchmarks.run.measure): forward at ~128 rows per expert, a train step, a T = 2048 control."""
import dataclasses, json, os
from benchmarks import cases as _cases
from benchmarks import run as _run
from moe_pallas.kernels import config as C
from probe_common import alternate, prepare_variants

no_tail = {k: dataclasses.replace(v, tail_m=0) for k, v in C._TABLE.items()}
variants = {"tail_m=0": no_tail, "table (tail_m=16)": dict(C._TABLE)}
CASES = [("gptoss", 4096, "fwd"), ("swiglu256", 4096, "fwd"), ("swiglu256", 3803, "fwd"),
         ("gptoss", 4096, "train"), ("gptoss", 2048, "fwd")]
out = []
for name, tokens, mode in CASES:
    w = _cases.WORKLOADS[name]
    case = _cases.Case(name if mode == "fwd" else "train", w, tokens, mode)
    inputs = _run._inputs(case, _cases.make_params(w))
    preps = prepare_variants(case, inputs, C, "_TABLE", variants)
    alternate(preps, out, rounds=3, case=f"{name}/{mode}/T={tokens}")
    del preps, inputs
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "tail_layer.json"), "w"), indent=1)
