"""gpt-oss T = 1 with fp8 weights: the layer timed alone (bursts, `run.measure`) several times,
then alternating with bf16, then alone again, in one process, ms; and with mxfp4. Does the
neighbour in the measurement change what fp8 T = 1 reads? Usage: python .probe/t1_probe.py"""
import json
import moe_pallas
from benchmarks import cases as C, impls, run as R

W = C.WORKLOADS["gptoss"]
params = C.make_params(W)
case = C.Case("decode", W, 1, "fwd")
inputs = R._inputs(case, params)
preps = {"bf16": impls._ours("auto")(case, inputs)}
for f in ("fp8", "mxfp4"):
    preps[f] = impls._ours("auto")(case, {**inputs, "params": moe_pallas.quantize_experts(params, f)})
for p in preps.values():
    p.wait(p.call())
m = lambda k: round(R.measure(preps[k], 0.2)[0] * 1e3, 4)
out = {"fp8 alone": [m("fp8") for _ in range(3)], "bf16 alone": [m("bf16") for _ in range(3)]}
out["alternating fp8/bf16/mxfp4"] = [(m("fp8"), m("bf16"), m("mxfp4")) for _ in range(3)]
out["fp8 alone again"] = [m("fp8") for _ in range(3)]
print(json.dumps(out), flush=True)
