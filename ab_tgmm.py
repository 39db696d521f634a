"""Scratch A/B (not committed): tgmm configs, time_op vs per-call timing, random vs real inputs."""
import jax, jax.numpy as jnp
from benchmarks import cases as _cases, run as _run, impls as _impls
from benchmarks.bench_gmm import time_op
from benchmarks.autotune_gmm import _problem
from moe_pallas import fused
from moe_pallas.kernels import BlockConfig, gmm, tgmm

OLD = BlockConfig(32, 128, 128, 1, 4, 4)
NEW = BlockConfig(64, 128, 128, 8, 4, 3)
p = _problem("gptoss", 2048)
case = _cases.Case("layer", _cases.WORKLOADS["gptoss"], 2048, "train")
params = _cases.make_params(case.workload)
inp = _run._inputs(case, params)
d, _, rw = fused._routing(inp["topk_idx"], inp["topk_weight"], 128)
x = inp["x"]
h = gmm(x, params["w_gate_up"], d.group_sizes, lhs_row_index=d.row_token, bias=params["b_gate_up"])
real = {"x": x, "dh": h, "sizes": d.group_sizes, "row_token": d.row_token}
for name, q in (("random", p), ("real", real)):
    for cfg in (OLD, NEW):
        f = lambda x, dh, s, r: tgmm(x, dh, s, lhs_row_index=r, config=cfg)
        t1 = time_op(f, q["x"], q["dh"], q["sizes"], q["row_token"], target_s=0.05) * 1e3
        g = jax.jit(f)
        args = (q["x"], q["dh"], q["sizes"], q["row_token"])
        prep = _impls.Prepared(lambda: g(*args), jax.block_until_ready, None, 0.0, lambda o: None)
        t2 = _run.measure(prep, 0.3)[0] * 1e3
        print(f"tgmm w_gate_up {name:6} {cfg} time_op {t1:.3f} ms  measure {t2:.3f} ms", flush=True)
