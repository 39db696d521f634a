"""gmm_mgpu's in-kernel row gather (kernels/row_gather_mgpu.py) against what ran before it: the
same kernel on an XLA-gathered copy (x[row_token] + gmm_mgpu), and Triton's gmm with its own
in-kernel gather (what "auto" runs), at the layer's gate_up (gather, bias, GLU) and dlhs gmm_t
(gather, transposed rhs) shapes, with the suites' routing. Bitwise equality of the gather and the
copy outputs (same kernel, same rows) is printed as `same`. Prints JSON lines.
Run: python probe_gather_gmm.py [gptoss:2048,...]
"""

import functools
import json
import sys

import jax
import jax.numpy as jnp

from benchmarks import cases as _cases
from benchmarks import run as _run
from moe_pallas.dispatch import dispatch
from moe_pallas.kernels.gmm import gmm as gmm_triton
from moe_pallas.kernels import gmm_mgpu
from probe_common import wall_time


def _time(variants, *args):
    """({label_ms: median ms, same: copy and gather bitwise equal}, {label: output})."""
    row, outs = {}, {}
    for label, fn in variants.items():
        outs[label] = jax.jit(fn)(*args)
        row[label + "_ms"] = wall_time(fn, *args) * 1e3
    row["same"] = bool(jnp.array_equal(outs["copy"], outs["gather"]))
    return row, outs


def main():
    spec = sys.argv[1] if len(sys.argv) > 1 else "gptoss:1,gptoss:16,gptoss:2048,gptoss:16384,swiglu256:1,swiglu256:2048"
    for item in spec.split(","):
        name, tokens = item.split(":")
        w = _cases.WORKLOADS[name]
        case = _cases.Case(name, w, int(tokens))
        params = _cases.make_params(w)
        inputs = _run._inputs(case, params)
        x, topk_idx = inputs["x"], inputs["topk_idx"]
        d = dispatch(topk_idx, w.experts)
        wgu, bgu = params["w_gate_up"], params.get("b_gate_up")
        kw = dict(bias=bgu, activation=w.activation)
        variants = {
            "copy": lambda x, wgu, gs, ri: gmm_mgpu.gmm(x[ri], wgu, gs, **kw),
            "gather": lambda x, wgu, gs, ri: gmm_mgpu.gmm(x, wgu, gs, lhs_row_index=ri, **kw),
            "triton": lambda x, wgu, gs, ri: gmm_triton(x, wgu, gs, lhs_row_index=ri, **kw),
        }
        row, outs = _time(variants, x, wgu, d.group_sizes, d.row_token)
        row["gather_vs_triton_maxdiff"] = float(
            jnp.max(jnp.abs(outs["gather"].astype(jnp.float32) - outs["triton"].astype(jnp.float32))))
        print(json.dumps(dict(case=case.name, kernel="gate_up") | row), flush=True)
        # dlhs: g = dout[row_token] @ w_down^T
        dout = jax.random.normal(jax.random.key(3), x.shape, x.dtype)
        tv = {
            "copy": lambda d_, wd, gs, ri: gmm_mgpu.gmm(d_[ri], wd, gs, transpose_rhs=True),
            "gather": lambda d_, wd, gs, ri: gmm_mgpu.gmm(d_, wd, gs, transpose_rhs=True, lhs_row_index=ri),
        }
        row, _ = _time(tv, dout, params["w_down"], d.group_sizes, d.row_token)
        print(json.dumps(dict(case=case.name, kernel="dlhs_t") | row), flush=True)

if __name__ == "__main__":
    main()
