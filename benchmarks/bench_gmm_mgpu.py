"""Time the grouped matmuls of both Pallas backends side by side: Triton (`kernels.gmm`,
`kernels.tgmm`) and Mosaic GPU (`kernels.gmm_mgpu` for every config of --configs,
`kernels.tgmm_mgpu` for every config of --tgmm-configs), at the gmm shapes of bench_gmm.py.

Per case (workload, projection, T): M = T·k rows routed uniformly at random, bf16 in and out, f32
accumulation; the median time of bench_gmm.time_op (a jitted loop of dependent calls), TFLOP/s,
TB/s of the bytes that must move (weights of the experts hit, lhs, out), their fraction of the
H200 ceilings (989 TFLOP/s, 4.8 TB/s), and the relative error of each Mosaic config against the
Triton output (a wrong Mosaic result is recorded next to its time, never hidden). tgmm columns
time the weight gradient of the same case, `lhsᵀ @ d_out` per expert, d_out [M, N] (bytes: lhs,
d_out and the [E, K, N] output; empty experts' zeros are written too). For gate_up, the
"swiglu"/"gptoss" columns time the workload's fused GLU epilogue in both backends (Mosaic: the
default config and every --configs entry, whose block_n counts output columns; a config the GLU
does not take is recorded as an error);
for down, the "bias+row_scale" columns the layer's down call (bias and routing weight fused) with
every config. Targets of
issue 8: >= 700 TFLOP/s compute-bound, >= 90% of 4.8 TB/s bandwidth-bound. A config that fails
to compile (e.g. shared memory) is recorded as an error and the run goes on.

    PYTHONPATH=. python3 benchmarks/bench_gmm_mgpu.py --out gmm_mgpu.json
    PYTHONPATH=. python3 benchmarks/bench_gmm_mgpu.py --workloads gptoss --tokens 2048 \\
        --configs 128,128,64,4,4 128,128,64,3,4,2 64,128,64,4,8 --tgmm-configs 64,64,256,4
"""

import argparse
import datetime
import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.bench_gmm import TOKENS, WORKLOADS, cases, time_op
from moe_pallas import dispatch
from moe_pallas.kernels import gmm, gmm_mgpu, tgmm, tgmm_mgpu

PEAK_TFLOPS, PEAK_TBPS = 989.0, 4.8
DEFAULT_CONFIGS = (
    "128,128,64,4,4",
    "128,256,64,3,4",
    "64,128,64,4,4",
    "64,64,64,6,8",
    "128,128,64,3,4,2",  # warp-specialised: CTA tile 128 x 256 (4 stages exceed 227 KiB)
    "64,128,64,5,4,2",
    "128,128,64,3,4,2m",  # two consumers along M: CTA tile 256 x 128 (jax's hopper example)
)
DEFAULT_TGMM_CONFIGS = ("64,64,256,4", "64,64,128,6", "128,64,256,3")


def parse_config(text: str) -> gmm_mgpu.MosaicConfig:
    """ "block_m,block_n,block_k,num_stages,grid_tile_n[,consumers[m]]" -> MosaicConfig ("2m":
    two consumer warpgroups splitting the tile's rows, "2": its columns)."""
    *ints, last = text.split(",")
    split = "m" if last.endswith("m") else "n"
    return gmm_mgpu.MosaicConfig(*map(int, [*ints, last.rstrip("m")]), split=split)


def parse_tgmm_config(text: str) -> tgmm_mgpu.TgmmMosaicConfig:
    """ "block_m,block_k,block_n,num_stages[,ctas_per_sm[,producer]]" -> TgmmMosaicConfig."""
    return tgmm_mgpu.TgmmMosaicConfig(*map(int, text.split(",")))


def run_case(name, proj, t, top_k, e, k_dim, n_dim, configs, tgmm_configs, seed=0):
    k1, k2, k3, k4 = jax.random.split(jax.random.key(seed), 4)
    m = t * top_k
    sizes = dispatch.dispatch(jax.random.randint(k1, (t, top_k), 0, e, jnp.int32), e).group_sizes
    lhs = jax.random.normal(k2, (m, k_dim), jnp.bfloat16)
    rhs = (jax.random.normal(k3, (e, k_dim, n_dim), jnp.bfloat16) * k_dim**-0.5).astype(
        jnp.bfloat16
    )
    hit = int((sizes > 0).sum())
    flops = 2 * m * k_dim * n_dim
    nbytes = 2 * (hit * k_dim * n_dim + m * k_dim + m * n_dim)
    row = {"workload": name, "proj": proj, "T": t, "M": m, "K": k_dim, "N": n_dim, "E": e}
    row["experts_hit"] = hit
    d_out = jax.random.normal(k4, (m, n_dim), jnp.bfloat16)

    def record(label, fn, reference, b, nbytes):
        try:
            out = np.asarray(jax.jit(fn)(lhs, b, sizes), np.float32)
            err = float(np.linalg.norm(out - reference) / max(np.linalg.norm(reference), 1e-30))
            s = time_op(lambda x, w, g: fn(x, w, g), lhs, b, sizes)
            row[label] = {
                "ms": s * 1e3,
                "tflops": flops / s / 1e12,
                "tbps": nbytes / s / 1e12,
                "pct_peak_flops": 100 * flops / s / 1e12 / PEAK_TFLOPS,
                "pct_peak_bw": 100 * nbytes / s / 1e12 / PEAK_TBPS,
                "rel_err_vs_triton": err,
            }
        except Exception as err:  # noqa: BLE001 - a failing config is recorded, not fatal
            row[label] = {"error": f"{type(err).__name__}: {str(err)[:300]}"}

    reference = np.asarray(jax.jit(gmm)(lhs, rhs, sizes), np.float32)
    record("pallas_triton", gmm, reference, rhs, nbytes)
    for text, cfg in configs.items():
        fn = lambda x, w, g, cfg=cfg: gmm_mgpu.gmm(x, w, g, config=cfg)
        record(f"mosaic_gpu[{text}]", fn, reference, rhs, nbytes)
    if proj == "gate_up":  # the fused GLU epilogue of the workload (name), default configs
        glu_bytes = 2 * (hit * k_dim * n_dim + m * k_dim + m * n_dim // 2)
        triton_glu = lambda x, w, g: gmm(x, w, g, activation=name)
        reference = np.asarray(jax.jit(triton_glu)(lhs, rhs, sizes), np.float32)
        record(f"{name} pallas_triton", triton_glu, reference, rhs, glu_bytes)
        mosaic_glu = lambda x, w, g: gmm_mgpu.gmm(x, w, g, activation=name)
        record(f"{name} mosaic_gpu", mosaic_glu, reference, rhs, glu_bytes)
        for text, cfg in configs.items():  # block_n counts output columns (a GLU reads twice)
            fn = lambda x, w, g, cfg=cfg: gmm_mgpu.gmm(x, w, g, activation=name, config=cfg)
            record(f"{name} mosaic_gpu[{text}]", fn, reference, rhs, glu_bytes)
    if proj == "down":  # the layer's down call: bias and routing-weight row scale in the epilogue
        bias = jax.random.normal(k4, (e, n_dim), jnp.bfloat16)
        row_scale = jax.random.uniform(k1, (m,), jnp.float32)
        triton_epi = lambda x, w, g: gmm(x, w, g, bias=bias, row_scale=row_scale)
        reference = np.asarray(jax.jit(triton_epi)(lhs, rhs, sizes), np.float32)
        record("bias+row_scale pallas_triton", triton_epi, reference, rhs, nbytes)
        for text, cfg in configs.items():
            fn = lambda x, w, g, cfg=cfg: gmm_mgpu.gmm(
                x, w, g, bias=bias, row_scale=row_scale, config=cfg
            )
            record(f"bias+row_scale mosaic_gpu[{text}]", fn, reference, rhs, nbytes)
    if not tgmm_configs:
        return row
    reference = np.asarray(jax.jit(tgmm)(lhs, d_out, sizes), np.float32)
    tgmm_bytes = 2 * (e * k_dim * n_dim + m * k_dim + m * n_dim)
    record("tgmm pallas_triton", tgmm, reference, d_out, tgmm_bytes)
    for text, cfg in tgmm_configs.items():
        fn = lambda x, y, g, cfg=cfg: tgmm_mgpu.tgmm(x, y, g, config=cfg)
        record(f"tgmm mosaic_gpu[{text}]", fn, reference, d_out, tgmm_bytes)
    return row


def _fmt(col):
    if "error" in col:
        return "ERR " + col["error"][:60]
    return f"{col['ms']:.3f}ms {col['tflops']:.0f}TF {col['tbps']:.2f}TB/s err={col['rel_err_vs_triton']:.1e}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="gmm_mgpu_bench.json")
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    parser.add_argument("--tokens", nargs="+", type=int, default=list(TOKENS))
    parser.add_argument("--configs", nargs="+", default=list(DEFAULT_CONFIGS))
    parser.add_argument(
        "--tgmm-configs",
        nargs="*",
        default=list(DEFAULT_TGMM_CONFIGS),
        help="none given: no tgmm columns",
    )
    parser.add_argument(
        "--cases", nargs="+", help="only these workload:proj:T, e.g. gptoss:down:16384"
    )
    args = parser.parse_args()
    configs = {text: parse_config(text) for text in args.configs}
    tgmm_configs = {text: parse_tgmm_config(text) for text in args.tgmm_configs}
    meta = {
        "date": datetime.date.today().isoformat(),
        "device": str(jax.devices()[0].device_kind),
        "jax": jax.__version__,
        "command": "PYTHONPATH=. python3 benchmarks/bench_gmm_mgpu.py " + " ".join(sys.argv[1:]),
        "git_commit": subprocess.run(
            ["git", "rev-parse", "HEAD"], check=False, capture_output=True, text=True
        ).stdout.strip(),
        "config_fields": "block_m,block_n,block_k,num_stages,grid_tile_n[,consumers[m]]",
        "tgmm_config_fields": "block_m,block_k,block_n,num_stages,grid_tile_n",
    }
    rows = []
    for case in cases(args.workloads, args.tokens):
        if args.cases and f"{case[0]}:{case[1]}:{case[2]}" not in args.cases:
            continue
        rows.append(run_case(*case, configs, tgmm_configs))
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
        r = rows[-1]
        print(f"{r['workload']:7} {r['proj']:8} T={r['T']:5} M={r['M']:6} hit={r['experts_hit']:3}")
        for label, col in r.items():
            if isinstance(col, dict):
                print(f"    {label:28} {_fmt(col)}", flush=True)


if __name__ == "__main__":
    main()
