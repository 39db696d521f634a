"""A/B: dy built inside the weight-gradient tgmm's loads (HEAD) against dy materialised by XLA
(the previous code: backends.tgmm patched to materialise scaled rows first). Same process, train
cases, interleaved; outputs compared bitwise."""
import json, sys, time
import jax, jax.numpy as jnp
from benchmarks import cases as C, impls as I, run as R, trace as TR
from moe_pallas import backends

orig = backends.tgmm


def old_tgmm(policy, lhs, rhs, gs, *, rhs_row_index=None, rhs_row_scale=None, **kw):
    if rhs_row_index is not None or rhs_row_scale is not None:
        rhs = backends.scaled_rows(rhs, rhs_row_index, rhs_row_scale)
    return orig(policy, lhs, rhs, gs, **kw)


out = {}
cases = sys.argv[2:] or ["gptoss:train:2048", "gptoss:train:4096", "gptoss:train:16384",
                         "swiglu256:train:2048", "swiglu256:train:8192"]
for text in cases:
    case = TR.parse_case(text, False)
    params = C.make_params(case.workload)
    inputs = R._inputs(case, params)
    new = I.IMPLS["moe_pallas:auto"](case, inputs)
    backends.tgmm = old_tgmm
    try:
        old = I.IMPLS["moe_pallas:auto"](case, inputs)
        o_old = old.wait(old.call())
    finally:
        backends.tgmm = orig
    o_new = new.wait(new.call())
    same = all(bool(jnp.array_equal(a, b)) for a, b in
               zip(jax.tree.leaves(o_new), jax.tree.leaves(o_old)))
    times = {"new": [], "old": []}
    for rep in range(4):
        for name, prep in (("new", new), ("old", old)):
            times[name].append(R.measure(prep, 0.6)[0] * 1e3)
    out[text] = {"bitwise_equal": same, **times,
                 "peak_new": new.peak_bytes, "peak_old": old.peak_bytes}
    print(text, json.dumps(out[text]), flush=True)
    del new, old
json.dump(out, open(sys.argv[1], "w"), indent=1)
