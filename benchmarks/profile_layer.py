"""Where the one-device layer's time goes: a jax.profiler trace of forward and fwd+bwd per case,
summarised per GPU kernel (`benchmarks.trace.profile`: span, busy time, gaps, kernels by time).

    PYTHONPATH=. python3 benchmarks/profile_layer.py [--cases gptoss:2048,swiglu256:2048,gptoss:1]
                                                     [--modes fwd,train] [--small] [--out DIR]

The inputs are the benchmark runner's (`benchmarks.run._inputs`: the case's router on random
logits), the layer `moe_experts(implementation=--implementation)`, fwd+bwd its gradients of x,
topk_weight and the params, as the runner times them.
"""

import argparse

import jax

import moe_pallas
from benchmarks import cases as _cases
from benchmarks import impls as _impls
from benchmarks import run as _run
from benchmarks import trace


def layer_fns(case: _cases.Case, inputs: dict, implementation: str) -> dict:
    """{"<case> fwd": (jitted forward, args), "<case> train": (jitted fwd+bwd, args)}."""
    activation = case.workload.activation

    def layer(x, topk_idx, topk_weight, params):
        return moe_pallas.moe_experts(
            x, topk_idx, topk_weight, params, activation=activation, implementation=implementation
        )

    args = tuple(inputs[k] for k in ("x", "topk_idx", "topk_weight", "params"))
    if case.mode == "fwd":
        return {case.name: (jax.jit(layer), args)}
    return {case.name: (jax.jit(_impls._train_step(layer)), (*args, inputs["dout"]))}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="gptoss:2048,swiglu256:2048,gptoss:1,swiglu256:1")
    parser.add_argument("--modes", default="fwd,train")
    parser.add_argument("--implementation", default="auto")
    parser.add_argument("--small", action="store_true", help="tiny workloads (CPU smoke test)")
    parser.add_argument("--out", default="/tmp", help="folder for the (deleted) trace")
    args = parser.parse_args(argv)
    workloads = _cases.SMALL_WORKLOADS if args.small else _cases.WORKLOADS
    for spec in (s for s in args.cases.split(",") if s):
        name, tokens = spec.split(":")
        params = _cases.make_params(workloads[name])
        fns = {}
        for mode in args.modes.split(","):
            case = _cases.Case("layer", workloads[name], int(tokens), mode)
            fns |= layer_fns(case, _run._inputs(case, params), args.implementation)
        print(trace.profile(fns, f"{args.out}/trace_{name}_{tokens}"), flush=True)
        del params, fns


if __name__ == "__main__":
    main()
