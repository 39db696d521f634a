"""fp8 activations' wgmma tiles on gpt-oss (layer, medians of 3 alternating rounds, ms): the large
and small classes' quantised gmm / gmm_glu calls forced to each config (weights fp8_a8)."""
import dataclasses, json, sys, time
import numpy as np
import moe_pallas
from moe_pallas.backends import pallas_triton as pt
from moe_pallas.kernels.config import BlockConfig
from benchmarks import cases as C, impls, run as R

CONFIG = pt.config
VARIANTS = {
    "table": None,
    "128x128w8s4": BlockConfig(128, 128, 128, 8, 8, 4, min_block_m=64),
    "128x256w8s3": BlockConfig(128, 256, 128, 8, 8, 3, min_block_m=64),
    "128x128w4s4": BlockConfig(128, 128, 128, 8, 4, 4, min_block_m=64),
    "64x256w4s4": BlockConfig(64, 256, 128, 8, 4, 4, min_block_m=16),
    "256x128w8s3": BlockConfig(256, 128, 128, 8, 8, 3, min_block_m=64),
}
wl = "gptoss"
params = C.make_params(C.WORKLOADS[wl])
q = moe_pallas.quantize_experts(params, "fp8_block", fp8_activations=True)
res = []
for T in (2048, 16384):
    case = C.Case("decode", C.WORKLOADS[wl], T, "fwd")
    inputs = R._inputs(case, params)
    preps = {"bf16": impls._ours("auto")(case, inputs)}
    for name, cfg in VARIANTS.items():
        if cfg is not None:
            def patched(kernel, dtype, num_rows, num_groups, k, n, activation=None, cfg=cfg):
                base = CONFIG(kernel, dtype, num_rows, num_groups, k, n, activation)
                if str(dtype) == "float8_e4m3fn" and base.block_m >= 64:
                    bn = cfg.block_n // (2 if activation else 1)
                    return dataclasses.replace(cfg, block_n=bn)
                return base
            pt.config = patched
        try:
            preps[name] = impls._ours("auto")(case, {**inputs, "params": q})
        except Exception as e:
            print(name, "failed", str(e)[:200], flush=True)
        finally:
            pt.config = CONFIG
    outs = {k: np.asarray(p.wait(p.call()), np.float32) for k, p in preps.items()}
    times = {k: [] for k in preps}
    for _ in range(3):
        for k, p in preps.items():
            times[k].append(R.measure(p, 0.2)[0] * 1e3)
    row = {"T": T, **{k: round(sorted(v)[1], 4) for k, v in times.items()},
           "vs_table": {k: float(np.linalg.norm(outs[k] - outs["table"]) / np.linalg.norm(outs["table"])) for k in outs if k not in ("bf16",)}}
    print(json.dumps(row), flush=True)
    res.append(row)
json.dump(res, open(sys.argv[1], "w"), indent=1)
