"""The H200's 16-bit Mosaic GPU and cuBLAS-slab entries on an H100: our bf16 layer ("auto") with
the H100's table as it is (every 16-bit product on Triton) against the same table plus copies of
the H200's mosaic_gpu / cublas_slab entries under the H100's name. One process, medians of 3
alternating rounds, ms; outputs against the table's.
Usage: python .probe/h100_mgpu_entries.py OUT.json [--small]"""
import copy, json, sys, tempfile, time
import numpy as np
from moe_pallas import tuning
from benchmarks import cases as C, impls, run as R

base = tuning.table()
dev = tuning.device_name() or "NVIDIA H100 80GB HBM3"
t = copy.deepcopy(base)
src = [e for e in t["devices"]["NVIDIA H200"]["entries"]
       if e["backend"] != "pallas_triton" and "float8" not in str(e["dtype"])]
t["devices"].setdefault(dev, {"num_sms": 132, "entries": []})["entries"].extend(copy.deepcopy(src))
f = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
json.dump(t, f)
f.close()
PATHS = {"table": tuning.TABLE_PATH, "+h200": f.name}


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


small = "--small" in sys.argv
CASES = [("gptoss", "fwd", 4096), ("gptoss", "fwd", 16384), ("gptoss", "train", 4096),
         ("gptoss", "train", 16384), ("swiglu256", "fwd", 4096), ("swiglu256", "fwd", 8192)]
res = []
for wl in ("gptoss", "swiglu256"):
    W = (C.SMALL_WORKLOADS if small else C.WORKLOADS)[wl]
    params = C.make_params(W)
    for _, mode, T in (c for c in CASES if c[0] == wl):
        case = C.Case("probe", W, 512 if small else T, mode)
        inputs = R._inputs(case, params)
        t0 = time.time()
        preps = {}
        for name, path in PATHS.items():
            tuning.TABLE_PATH = path
            preps[name] = impls._ours("auto")(case, inputs)
            preps[name].wait(preps[name].call())
        tuning.TABLE_PATH = PATHS["table"]
        outs = {k: p.wait(p.call()) for k, p in preps.items()}
        times = {k: [] for k in preps}
        for _ in range(3):
            for k, p in preps.items():
                times[k].append(R.measure(p, 0.3)[0] * 1e3)
        import jax
        o = {k: np.concatenate([np.ravel(np.asarray(x, np.float32)) for x in jax.tree.leaves(v)])
             for k, v in outs.items()}
        row = {"case": case.name, **{k: round(sorted(v)[1], 4) for k, v in times.items()},
               "err": rel(np.asarray(o["+h200"], np.float32), np.asarray(o["table"], np.float32)),
               "s": round(time.time() - t0, 1)}
        print(json.dumps(row), flush=True)
        res.append(row)
        json.dump(res, open(sys.argv[1], "w"), indent=1)
        del preps, outs, o
    del params
