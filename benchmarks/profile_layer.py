"""Where the one-device layer's time goes: a jax.profiler trace of forward and fwd+bwd per case,
summarised per GPU kernel (`benchmarks.trace.profile`: span, busy time, gaps, kernels by time).

    PYTHONPATH=. python3 benchmarks/profile_layer.py [--cases gptoss:2048,swiglu256:2048,gptoss:1]
                                                     [--modes fwd,train] [--small] [--out DIR]

The calls are the ones the benchmark runner times (`benchmarks.impls`: its inputs, the case's
router on random logits, and its compiled `moe_experts(implementation=--implementation)` forward
or loss-and-gradients step).
"""

import argparse

from benchmarks import cases as _cases
from benchmarks import impls as _impls
from benchmarks import run as _run
from benchmarks import trace


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
            prep = _impls._ours(args.implementation)(case, _run._inputs(case, params))
            fns[case.name] = (prep.call, ())
        print(trace.profile(fns, f"{args.out}/trace_{name}_{tokens}"), flush=True)
        del params, fns


if __name__ == "__main__":
    main()
