"""A/B: the train step's forward storing h and a from one gmm epilogue (HEAD) against h from the
gmm and the GLU in XLA (the previous code: backends.gmm patched to take glu_of_pre). Same process,
train cases, interleaved; the gradients compared (the forward's a differs in rounding)."""
import json, sys
import jax, jax.numpy as jnp
from benchmarks import cases as C, impls as I, run as R, trace as TR
from moe_pallas import backends

orig = backends.gmm


def old_gmm(policy, lhs, rhs, gs, *, keep_pre=False, activation=None, **kw):
    if keep_pre:
        kw["out_dtype"] = kw.get("out_dtype") or lhs.dtype
        fn = lambda l, r, g, **k: orig(policy, l, r, g, **k)
        return backends.glu_of_pre(fn, lhs, rhs, gs, activation=activation, **kw)
    return orig(policy, lhs, rhs, gs, activation=activation, **kw)


@jax.jit
def _sq(a, b):  # one fused reduction: no float32 copy of a [E, H, 2I] gradient
    a, b = a.astype(jnp.float32), b.astype(jnp.float32)
    return jnp.sum((a - b) ** 2), jnp.sum(b**2)


def rel(a, b):
    d, n = _sq(a, b)
    return float(jnp.sqrt(d) / jnp.maximum(jnp.sqrt(n), 1e-30))


out = {}
cases = sys.argv[2:] or ["gptoss:train:2048", "gptoss:train:4096", "gptoss:train:16384",
                         "swiglu256:train:2048", "swiglu256:train:8192"]
for text in cases:
    case = TR.parse_case(text, False)
    params = C.make_params(case.workload)
    inputs = R._inputs(case, params)
    new = I.IMPLS["moe_pallas:auto"](case, inputs)
    backends.gmm = old_gmm
    try:
        old = I.IMPLS["moe_pallas:auto"](case, inputs)
        o_old = old.wait(old.call())
    finally:
        backends.gmm = orig
    o_new = new.wait(new.call())
    errs = [rel(a, b) for a, b in zip(jax.tree.leaves(o_new), jax.tree.leaves(o_old))]
    del o_new, o_old
    times = {"new": [], "old": []}
    for rep in range(4):
        for name, prep in (("new", new), ("old", old)):
            times[name].append(R.measure(prep, 0.6)[0] * 1e3)
    out[text] = {"rel_diff_per_leaf": errs, **times,
                 "peak_new": new.peak_bytes, "peak_old": old.peak_bytes}
    print(text, json.dumps(out[text]), flush=True)
    del new, old
json.dump(out, open(sys.argv[1], "w"), indent=1)
