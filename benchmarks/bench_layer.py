"""Dev benchmark of the fused expert layer: large fwd+bwd cases, peak memory, per-stage times.

    python -m benchmarks.bench_layer [--cases train:gptoss:16384,fwd:gptoss:2048,...]
                                     [--impls moe_pallas:pallas_triton,jax.lax.ragged_dot]
                                     [--breakdown gptoss:2048,swiglu256:2048] [--out FILE.json]

The suites are `python -m benchmarks.run`'s job; this script adds what it does not time: fwd+bwd
at the large token counts, the memory of one fwd+bwd step (XLA's compiled memory analysis:
arguments + outputs + temporaries) against weights + grads + inputs + residuals
(`moe_pallas.fused`: h [T·k, 2I] in x's dtype) and the time of each kernel of the fused path. (Not jax's peak_bytes_in_use: the runner's timing loop keeps up to three
steps' outputs alive, which tripled the gradients in the first H200 run.)
Timing: `benchmarks.run.measure` (warm-up, then median of blocking batched samples).
"""

import argparse
import json
import sys

import jax
import jax.numpy as jnp

from benchmarks import cases as _cases
from benchmarks import impls as _impls
from benchmarks import run as _run
from benchmarks import sol as _sol
from moe_pallas import dispatch as _dispatch
from moe_pallas import fused
from moe_pallas.activations import glu, split_gate_up
from moe_pallas.kernels.combine import combine
from moe_pallas.kernels.gmm import gmm
from moe_pallas.kernels.tgmm import tgmm

DEFAULT_CASES = (
    "train:gptoss:16384,train:gptoss:2048,train:swiglu256:2048,train:swiglu256:8192,"
    "fwd:gptoss:1,fwd:swiglu256:1"
)


def _nbytes(tree) -> int:
    return sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(tree))


def memory_budget(case: _cases.Case, params: dict) -> dict:
    """Bytes the fwd+bwd step must hold: weights, their grads, inputs (+ their grads), residuals."""
    w, t = case.workload, case.tokens
    weights = _nbytes(params)
    # x and dx (bf16), dout (float32), topk_idx, topk_weight and its grad.
    inputs = t * w.hidden * (2 + 2 + 4) + t * w.top_k * (4 + 4 + 4)
    residual_h = t * w.top_k * 2 * w.inter * 2
    total = 2 * weights + inputs + residual_h
    return {"weights": weights, "inputs": inputs, "residual_h": residual_h, "total": total}


def _stage_fns(activation, inputs):
    """The kernels of the fused path as separate jitted calls, on the case's real routing."""
    x, idx, tw, p = (inputs[k] for k in ("x", "topk_idx", "topk_weight", "params"))
    e = p["w_gate_up"].shape[0]
    d, _, row_weight = fused._routing(idx, tw, e)
    bias = "b_down" in p
    a = gmm(
        x,
        p["w_gate_up"],
        d.group_sizes,
        lhs_row_index=d.row_token,
        bias=p.get("b_gate_up"),
        activation=activation,
    )
    h = gmm(x, p["w_gate_up"], d.group_sizes, lhs_row_index=d.row_token, bias=p.get("b_gate_up"))
    y = gmm(a, p["w_down"], d.group_sizes, bias=p.get("b_down"), row_scale=row_weight)
    dout = inputs["dout"].astype(x.dtype)
    pair_row = d.pair_row.reshape(idx.shape)
    return {
        "dispatch": (lambda idx: _dispatch.dispatch(idx, e), (idx,)),
        "gate_up+act": (
            lambda x, w: gmm(
                x,
                w,
                d.group_sizes,
                lhs_row_index=d.row_token,
                bias=p.get("b_gate_up"),
                activation=activation,
            ),
            (x, p["w_gate_up"]),
        ),
        "gate_up (h, train fwd)": (
            lambda x, w: gmm(
                x, w, d.group_sizes, lhs_row_index=d.row_token, bias=p.get("b_gate_up")
            ),
            (x, p["w_gate_up"]),
        ),
        # Variants that locate the cost of the gate_up and down kernels (schedule, gather, epilogue).
        "tile_schedule": (
            lambda sizes: _dispatch.tile_schedule(sizes, d.row_token.shape[0], 128),
            (d.group_sizes,),
        ),
        "gate_up: XLA x[row_token] + gmm": (
            lambda x, w: gmm(x[d.row_token], w, d.group_sizes, bias=p.get("b_gate_up")),
            (x, p["w_gate_up"]),
        ),
        "gate_up: in-kernel gather, no bias": (
            lambda x, w: gmm(x, w, d.group_sizes, lhs_row_index=d.row_token),
            (x, p["w_gate_up"]),
        ),
        "down: no bias, no row_scale": (
            lambda a, w: gmm(a, w, d.group_sizes),
            (a, p["w_down"]),
        ),
        "glu(h) xla": (
            lambda h: glu(*split_gate_up(h.astype(jnp.float32), activation), activation).astype(
                h.dtype
            ),
            (h,),
        ),
        "down+bias+weight": (
            lambda a, w: gmm(a, w, d.group_sizes, bias=p.get("b_down"), row_scale=row_weight),
            (a, p["w_down"]),
        ),
        "combine": (lambda y: combine(y, pair_row), (y,)),
        "bwd dlhs (gmm_t g + GLU pass)": (
            lambda dout, w: fused.dlhs(activation, "pallas_triton", dout, w, h, d, row_weight),
            (dout, p["w_down"]),
        ),
        "bwd dy gather": (
            lambda dout: (dout[d.row_token].astype(jnp.float32) * row_weight[:, None]).astype(
                x.dtype
            ),
            (dout,),
        ),
        # with the bias gradients (rhs_sums) where the workload has biases, as the layer runs it
        "bwd tgmm w_down": (lambda a, dy: tgmm(a, dy, d.group_sizes, rhs_sums=bias), (a, y)),
        "bwd tgmm w_gate_up": (
            lambda x, dh: tgmm(x, dh, d.group_sizes, lhs_row_index=d.row_token, rhs_sums=bias),
            (x, h),
        ),
        "bwd dx gmm_t": (
            lambda dh, w: gmm(dh, w, d.group_sizes, transpose_rhs=True),
            (h, p["w_gate_up"]),
        ),
    }


def _time(fn, args, budget) -> float:
    compiled = jax.jit(fn).lower(*args).compile()
    prep = _impls.Prepared(
        lambda: compiled(*args), jax.block_until_ready, None, 0.0, lambda o: None
    )
    return _run.measure(prep, budget)[0] * 1e3


def breakdown(case: _cases.Case, inputs: dict, budget: float, only: str = "") -> dict:
    """Milliseconds of each stage of the fused path (or the error that stopped it); `only`: the
    stages whose name contains one of these comma-separated strings."""
    stages = _stage_fns(case.workload.activation, inputs)
    wanted = [w for w in only.split(",") if w]
    out = {}
    for name, (fn, args) in stages.items():
        if wanted and not any(w in name for w in wanted):
            continue
        try:
            out[name] = _time(fn, args, budget)
            shown = f"{out[name]:8.3f} ms"
        except Exception as err:  # noqa: BLE001 - a failing stage is a result
            out[name] = shown = f"{type(err).__name__}: {str(err).strip().splitlines()[0][:120]}"
        print(f"  {case.workload.name} T={case.tokens} {name:36s} {shown}", flush=True)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--cases", default=DEFAULT_CASES, help="mode:workload:tokens, comma-separated"
    )
    parser.add_argument("--impls", default="moe_pallas:pallas_triton")
    parser.add_argument("--breakdown", default="gptoss:2048,swiglu256:2048,gptoss:1")
    parser.add_argument("--stages", default="", help="breakdown stages containing these strings")
    parser.add_argument("--budget", type=float, default=0.3)
    parser.add_argument("--out", help="JSON file to write")
    parser.add_argument("--small", action="store_true", help="tiny workloads (CPU smoke test)")
    args = parser.parse_args(argv)
    device = _sol.detect_device() or _sol.DEVICES["h200"]
    results = {
        "device": jax.devices()[0].device_kind,
        "jax": jax.__version__,
        "command": " ".join(sys.argv),
        "commit": _run._git_commit(),
        "cases": [],
        "breakdown": {},
    }
    workloads = _cases.SMALL_WORKLOADS if args.small else _cases.WORKLOADS
    params, params_of = None, None
    for i, spec in enumerate(s for s in args.cases.split(",") if s):
        mode, name, tokens = spec.split(":")
        case = _cases.Case("layer", workloads[name], int(tokens), mode)
        if params_of != name:
            params = None
            params = _cases.make_params(case.workload)
            params_of = name
        rows = _run.run_case(case, args.impls.split(","), params, device, args.budget)
        if mode == "train":
            budget = memory_budget(case, params)
            for r in rows:
                if r.get("peak_mem_gib"):
                    r["memory"] = {
                        **budget,
                        "over_budget": r["peak_mem_gib"] * 2**30 / budget["total"],
                    }
        for r in rows:
            print(
                f"{r['case']:28s} {r['impl']:26s} {r['status']:6s} "
                f"{r.get('time_ms') or float('nan'):9.3f} ms  SOL {r['sol_ms']:7.3f} ms  "
                f"{r.get('pct_sol') or 0:5.1f}% SOL  rel_err {r.get('rel_err')}  "
                f"mem {r.get('peak_mem_gib')} GiB {r.get('memory', '')} {r['message']}",
                flush=True,
            )
        results["cases"] += rows
        _write(args.out, results)
    for spec in (s for s in args.breakdown.split(",") if s):
        name, tokens = spec.split(":")
        case = _cases.Case("layer", workloads[name], int(tokens), "train")
        if params_of != name:
            params = None
            params = _cases.make_params(case.workload)
            params_of = name
        results["breakdown"][case.name] = breakdown(
            case, _run._inputs(case, params), args.budget, args.stages
        )
        _write(args.out, results)
    return results


def _write(path, results) -> None:
    """Rewritten after every case, so a crash or a timeout keeps what was measured."""
    if path:
        with open(path, "w") as f:
            json.dump(results, f, indent=1, default=str)


if __name__ == "__main__":
    main()
