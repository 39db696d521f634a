"""The train case gpt-oss T = 2048 (moe_pallas:auto) timed three ways, same compiled step:
the runner's measure() (samples of >= 20 ms), samples of 30 calls, and a 10-call trace span."""
import sys, time, statistics
sys.path.insert(0, ".")
import jax
from benchmarks import cases as C, impls as I, run as R

for wl, t in (("gptoss", 2048), ("swiglu256", 2048)):
    case = C.Case("train", C.WORKLOADS[wl], t, "train")
    params = C.make_params(case.workload)
    prep = I._ours("auto")(case, R._inputs(case, params))
    for rep in range(2):
        med, n, _ = R.measure(prep, 8.0)
        print(f"{wl} T={t} measure(): {med*1e3:.3f} ms ({n} samples)", flush=True)
    for inner in (1, 3, 30):
        times = []
        for _ in range(7):
            t0 = time.perf_counter()
            for _ in range(inner):
                out = prep.call()
            jax.block_until_ready(out)
            times.append((time.perf_counter() - t0) / inner)
            del out
        print(f"{wl} T={t} {inner:2d} calls per sample: median {statistics.median(times)*1e3:.3f} ms, min {min(times)*1e3:.3f}", flush=True)
    del prep, params
