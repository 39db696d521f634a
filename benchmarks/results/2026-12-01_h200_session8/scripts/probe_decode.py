"""Decode gmm tile sweep: the layer's two gmm calls at T (default 1), bf16, as the layer calls them
(gate_up: row gather, bias, GLU epilogue; down: bias and row scale). Kernel time from a profiler
trace (sum of the gmm kernels over a burst of 10 calls / 10)."""
import sys, itertools, collections
sys.path.insert(0, ".")
import jax, jax.numpy as jnp
from benchmarks import trace
from moe_pallas import dispatch
from moe_pallas.kernels import config as C
from moe_pallas.kernels.gmm import gmm as _gmm

WL = {"gptoss": (2880, 2880, 128, 4, "gptoss", True), "swiglu": (4096, 2048, 256, 8, "swiglu", False)}
T = int(sys.argv[1]) if len(sys.argv) > 1 else 1
fns, meta = {}, {}
for name, (h, i, e, k, act, bias) in WL.items():
    keys = iter(jax.random.split(jax.random.key(0), 8))
    x = jax.random.normal(next(keys), (T, h), jnp.bfloat16)
    idx = jax.random.randint(next(keys), (T, k), 0, e).astype(jnp.int32)
    if T == 1:
        idx = jnp.arange(k, dtype=jnp.int32)[None] * (e // k)
    d = dispatch.dispatch(idx, e)
    wgu = jax.random.normal(next(keys), (e, h, 2 * i), jnp.bfloat16) * 0.02
    wd = jax.random.normal(next(keys), (e, i, h), jnp.bfloat16) * 0.02
    bgu = jax.random.normal(next(keys), (e, 2 * i), jnp.bfloat16) if bias else None
    bd = jax.random.normal(next(keys), (e, h), jnp.bfloat16) if bias else None
    a = jax.random.normal(next(keys), (T * k, i), jnp.bfloat16)
    rs = jax.random.uniform(next(keys), (T * k,), jnp.float32)
    hit = len(set(idx.reshape(-1).tolist()))
    for proj in ("gate_up", "down"):
        wbytes = hit * (h * 2 * i if proj == "gate_up" else i * h) * 2
        if proj == "gate_up":
            op = lambda x, w, b, gs, ri, cfg: _gmm(x, w, gs, lhs_row_index=ri, bias=b, activation=act, config=cfg)
            args = (x, wgu, bgu, d.group_sizes, d.row_token)
        else:
            op = lambda x, w, b, gs, ri, cfg: _gmm(x, w, gs, bias=b, row_scale=ri, config=cfg)
            args = (a, wd, bd, d.group_sizes, rs)
        cfgs = [None] + [C.BlockConfig(16, bn, bk, group_m=8, num_warps=w, num_stages=s)
                         for bn, bk, (w, s) in itertools.product((16, 32, 64), (128, 256), ((4, 3), (4, 5), (2, 4)))]
        for cfg in cfgs:
            label = f"{name} T={T} {proj} " + ("table" if cfg is None else f"bn={cfg.block_n} bk={cfg.block_k} w={cfg.num_warps} s={cfg.num_stages}")
            f = jax.jit(lambda *a, cfg=cfg, op=op: op(*a, cfg))
            try:
                jax.block_until_ready(f(*args))
            except Exception as err:
                print(label, "failed", str(err)[:100]); continue
            fns[label] = (f, args)
            meta[label] = wbytes
data = trace._traced(fns, "/tmp/trace_decode")
wins = {}
for plane in data.planes:
    if plane.name.startswith("/host"):
        for line in plane.lines:
            for ev in line.events:
                if ev.name.endswith("#burst") and ev.name[:-6] in fns:
                    wins[ev.name[:-6]] = (ev.start_ns, ev.start_ns + ev.duration_ns)
kern = collections.defaultdict(float)
for plane in data.planes:
    if plane.name.startswith("/device:GPU"):
        for line in plane.lines:
            for ev in line.events:
                if ev.name.startswith("gmm"):
                    for label, (s, e) in wins.items():
                        if s <= ev.start_ns <= e:
                            kern[label] += ev.duration_ns
groups = collections.defaultdict(list)
for label, ns in kern.items():
    t = ns / trace.BURST / 1e9
    groups[label.rsplit(" ", 4)[0] if "table" not in label else label.rsplit(" ", 1)[0]].append((t, label))
for label in sorted(kern):
    if label.endswith("table"):
        t = kern[label] / trace.BURST / 1e9
        print(f"{label:50} {t*1e6:7.1f} us {meta[label]/t/1e12:.2f} TB/s")
        key = label[:-6]
        best = sorted((kern[l] / trace.BURST / 1e9, l) for l in kern if l.startswith(key) and not l.endswith("table"))
        for t, l in best[:6]:
            print(f"   {l:50} {t*1e6:7.1f} us {meta[l]/t/1e12:.2f} TB/s")
