"""fp8 weights at 64-128 rows per expert: the table's 64-row wgmma tiles (x first: the decoded
tile staged in shared memory, each step's wgmma waited on) against 32-row tiles, which Triton
runs as mma.sync with the decoded weights in the dot operand's registers (wgmma needs M % 64),
each 64-row group then visited twice (its weights the second time from L2).
The layer, one process, medians of 3 alternating rounds, ms; outputs against the table's.
Usage: python .probe/fp8_mma2.py OUT.json [--small]"""
import copy, dataclasses, json, sys, tempfile, time
import numpy as np
import moe_pallas
from moe_pallas import tuning
from benchmarks import cases as C, impls, run as R

C_ = lambda bm, bn, bk, w, s, mbm=16: {"block_m": bm, "block_n": bn, "block_k": bk, "group_m": 8,
    "num_warps": w, "num_stages": s, "min_block_m": mbm, "tail_m": 0, "weights_first": False}
CONFIGS = {  # name: (gmm, gmm_glu)
    "m32_128x64": (C_(32, 128, 64, 4, 4), C_(32, 64, 64, 4, 4)),
    "m32_64x128": (C_(32, 64, 128, 4, 4), C_(32, 32, 128, 4, 4)),
    "m32_128x128": (C_(32, 128, 128, 4, 3), C_(32, 64, 128, 4, 3)),
    "m32_64x64s5": (C_(32, 64, 64, 4, 5), C_(32, 32, 64, 4, 5)),
}
base = tuning.table()
dev = tuning.device_name()
paths = {}
for name, (g, glu) in CONFIGS.items():
    t = copy.deepcopy(base)
    d = t["devices"].setdefault(dev, {"num_sms": 132, "entries": []}) if dev else t["devices"][t["default_device"]]
    for kern, cfg in (("gmm", g), ("gmm_glu", glu)):
        d["entries"].insert(0, {"backend": "pallas_triton", "kernel": kern, "dtype": "float8_e4m3fn",
                                "k": "*", "n": "*", "rows": "small", "config": cfg})
    f = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    json.dump(t, f)
    f.close()
    paths[name] = f.name
DEFAULT = tuning.TABLE_PATH


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


out_path = sys.argv[1]
small = "--small" in sys.argv
res = []
for wl in ("gptoss", "swiglu256"):
    W = (C.SMALL_WORKLOADS if small else C.WORKLOADS)[wl]
    params = C.make_params(W)
    stored = {f: moe_pallas.quantize_experts(params, f) for f in ("fp8", "fp8_block")}
    for T in ((64,) if small else (2048, 4096)):
        case = C.Case("decode", W, T, "fwd")
        inputs = R._inputs(case, params)
        t0 = time.time()
        preps = {"bf16": impls._ours("auto")(case, inputs)}
        for fmt, p in stored.items():
            for name in ("table", *CONFIGS):
                tuning.TABLE_PATH = DEFAULT if name == "table" else paths[name]
                if T == 2048 and fmt == "fp8":
                    print(name, tuning.lookup("pallas_triton", "gmm", dtype="float8_e4m3fn",
                          k=W.hidden, n=W.hidden, rows="small"), flush=True)
                try:
                    preps[f"{fmt} {name}"] = impls._ours("auto")(case, {**inputs, "params": p})
                    preps[f"{fmt} {name}"].wait(preps[f"{fmt} {name}"].call())
                except Exception as err:
                    print(fmt, name, type(err).__name__, str(err)[:300], flush=True)
                    preps.pop(f"{fmt} {name}", None)
        tuning.TABLE_PATH = DEFAULT
        outs = {k: np.asarray(p.wait(p.call()), np.float32) for k, p in preps.items()}
        times = {k: [] for k in preps}
        for _ in range(3):
            for k, p in preps.items():
                times[k].append(R.measure(p, 0.2)[0] * 1e3)
        row = {"case": case.name, **{k: round(sorted(v)[1], 4) for k, v in times.items()},
               "err_vs_table": {k: rel(outs[k], outs[k.split()[0] + " table"]) for k in outs
                                if " " in k and "table" not in k},
               "finite": all(bool(np.isfinite(v).all()) for v in outs.values()),
               "s": round(time.time() - t0, 1)}
        print(json.dumps(row), flush=True)
        res.append(row)
        json.dump(res, open(out_path, "w"), indent=1)
        del preps, outs
    del params, stored
