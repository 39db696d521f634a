"""Autotune the Triton grouped-matmul block configs per rows class on the layer's own calls and
write them into the tuning table, `moe_pallas/tuning.json`, for this device.

Each (kernel, rows class) is timed on the calls the fused layer makes, at both workloads
(`benchmarks.cases.WORKLOADS`: gpt-oss H = I = 2880, E = 128, k = 4, biases; SwiGLU-256
H = 4096, I = 2048, E = 256, k = 8) with uniform random routing at the class's token count; the
candidate with the least total time wins:

  gmm      gate_up → h (in-kernel row gather, bias) and down (bias, routing-weight row scale)
  gmm_glu  gate_up with the GLU epilogue (the no-gradient forward)
  gmm_t    dx = dh @ w_gate_upᵀ
  tgmm     d w_down = aᵀ dy and d w_gate_up = x[row_token]ᵀ dh

A winner becomes one entry of the table (`moe_pallas.tuning`): backend "pallas_triton", the kernel,
dtype/K/N "*" (one config per class for every shape), the rows class, the `BlockConfig` as a dict,
under this GPU's `device_kind` (a device new to the table is added with its SM count). Run on the
GPU the table is for; without --write the entries are printed only:

    python -m benchmarks.autotune_gmm --classes small [--kernels gmm] [--around-table] [--write]
    python -m benchmarks.autotune_gmm --weights mxfp4 --kernels gmm gmm_glu
    python -m benchmarks.autotune_gmm --weights fp8_a8 --kernels gmm gmm_glu --classes small large

With --weights fp8 or mxfp4 the expert weights are quantised (`quant.quantize_weight`) and the
forward kernels (gmm, gmm_glu) run `kernels.gmm_quant`, the backward's products with wᵀ (gmm_t:
dx through w_gate_up, the GLU's input gradient through w_down) `kernels.gmm_quant_t`; the entries
are keyed by the stored element type ("float8_e4m3fn", which fp8_block shares, or
"float4_e2m1fn"). Their candidates are tiles that
compile for sm_90 without register spills in every format: the in-register decode raises register
pressure (`python -m benchmarks.sass` counts the K loop's spills; the survey is in
docs/decisions.md, Low-precision weights). The large class adds 128- and 256-row tiles
(`QUANT_LARGE`); for mxfp4 every tile of 64 rows or more is also tried with the weights first
(`BlockConfig.weights_first`: accᵀ = w · xᵀ, the decoded weights wgmma's register operand),
except gmm_t's (`QUANT_T`); fp8 values' tiles stay x first (`kernels.gmm_quant`, Tiling).
--weights fp8_a8 tunes the forward's calls with FP8 activations (fp8 weights with
`fp8_activations`: the rows quantised per call, e4m3 x e4m3 on the FP8 tensor cores) among
`QUANT_A8`'s tiles and writes them as "gmm_a8" / "gmm_glu_a8" entries (`tuning.A8_KERNELS`); a
Triton program waits on each of its fp8 dots, so these tiles differ from the decoding ones in how
many programs an SM holds (docs/decisions.md).
"""

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
from tqdm import tqdm

from benchmarks.bench_gmm import time_op
from benchmarks.cases import SMALL_WORKLOADS, WORKLOADS
from moe_pallas import dispatch, quant, tuning
from moe_pallas.kernels.config import BlockConfig
from moe_pallas.kernels.gmm import gmm
from moe_pallas.kernels.gmm_quant import gmm_quant
from moe_pallas.kernels.gmm_quant_t import gmm_quant_t
from moe_pallas.kernels.tgmm import tgmm

C = BlockConfig
GMM_CANDIDATES = {
    "tiny": [
        C(16, 64, 128, 8, 4, 4),
        C(16, 32, 128, 8, 4, 4),
        C(16, 64, 64, 8, 4, 5),
        C(16, 128, 128, 8, 4, 3),
        C(16, 64, 256, 8, 8, 3),
    ],
    "small": [
        C(64, 128, 64, 8, 4, 4),
        C(64, 256, 64, 8, 8, 3),
        C(128, 128, 64, 8, 4, 4),
        C(128, 256, 64, 8, 8, 3),
        C(128, 128, 128, 8, 8, 3),
        C(128, 64, 128, 8, 4, 4),
        C(128, 256, 64, 8, 8, 4),
        # Bucketed M: a visit of few rows runs a shorter tile (see BlockConfig.m_paths).
        C(128, 256, 64, 8, 8, 4, min_block_m=64),
        C(128, 256, 64, 8, 8, 4, min_block_m=16),
    ],
    "large": [
        C(128, 256, 64, 8, 8, 3),
        C(128, 128, 64, 8, 4, 4),
        C(128, 256, 64, 8, 8, 4),
        C(256, 128, 64, 8, 8, 3),
        C(128, 128, 128, 8, 8, 3),
        C(128, 256, 64, 8, 8, 4, min_block_m=16),
        C(128, 256, 64, 8, 8, 3, min_block_m=32),
        C(128, 128, 64, 8, 8, 3, min_block_m=16),
        C(256, 128, 64, 8, 8, 3, min_block_m=32),
    ],
}
# A GLU tile reads 2·block_n weight columns: the same tiles with half the output columns, and more.
GLU_CANDIDATES = {
    cls: [
        *(dataclasses.replace(c, block_n=c.block_n // 2) for c in cands),
        *(c for c in cands if c.block_n <= 64),
    ]
    for cls, cands in GMM_CANDIDATES.items()
}
# Quantised weights (tiles that do not spill: module docstring); GLU block_n counts output columns,
# so its tile reads twice the weight columns of the same plain tile. The tiny class streams weights:
# a stored byte carries 1 (fp8) or 2 (mxfp4) values, so its 16-row tiles reach further along K or N
# than bf16's for the same bytes in flight per stage.
_QUANT_ROWS = {
    "gmm": [
        C(128, 128, 64, 8, 8, 4),
        C(128, 128, 64, 8, 8, 4, min_block_m=64),
        C(128, 64, 64, 8, 8, 4),
        C(64, 128, 64, 8, 4, 4),
        C(64, 64, 128, 8, 4, 4),
    ],
    "gmm_glu": [
        C(128, 64, 64, 8, 8, 4),
        C(128, 64, 64, 8, 8, 4, min_block_m=64),
        C(64, 64, 128, 8, 4, 4),
        C(64, 32, 128, 8, 4, 4),
        C(64, 64, 64, 8, 4, 4),
    ],
}
QUANT_CANDIDATES = {
    "tiny": {
        "gmm": [
            C(16, 128, 128, 8, 4, 3),
            C(16, 128, 128, 8, 4, 5),
            C(16, 128, 256, 8, 4, 3),
            C(16, 128, 256, 8, 4, 4),
            C(16, 256, 128, 8, 4, 4),
            C(16, 64, 256, 8, 4, 4),
            C(16, 256, 256, 8, 8, 3),
        ],
        "gmm_glu": [
            C(16, 64, 128, 8, 4, 3),
            C(16, 64, 128, 8, 4, 5),
            C(16, 64, 256, 8, 4, 3),
            C(16, 64, 256, 8, 4, 4),
            C(16, 128, 128, 8, 4, 4),
            C(16, 32, 256, 8, 4, 4),
            C(16, 128, 256, 8, 8, 3),
        ],
    },
    "small": _QUANT_ROWS,
    "large": _QUANT_ROWS,
}
# The large class's compute-bound tiles besides those, for every format: a decoded weight value
# serves 128 or 256 rows, and neither mxfp4's decode nor fp8_block's (their scales folded into the
# weights) scales the float32 accumulator each step, so these compile without spills
# (`benchmarks.sass`: mxfp4 0.031-0.046 K-loop instructions a thread per 1000 multiply-adds, against
# 0.080-0.092 at the 64-row tiles).
QUANT_LARGE = {
    "gmm": [
        C(256, 128, 64, 8, 8, 3),
        C(256, 128, 64, 8, 8, 4),
        C(256, 128, 64, 8, 8, 3, min_block_m=64),
        C(256, 64, 64, 8, 8, 4),
        C(128, 256, 64, 8, 8, 4),
    ],
    "gmm_glu": [
        C(256, 64, 64, 8, 8, 3),
        C(256, 64, 64, 8, 8, 4),
        C(256, 64, 64, 8, 8, 3, min_block_m=64),
        C(128, 128, 64, 8, 8, 4),
    ],
}
# The backward's products with wᵀ on the stored weights (`kernels.gmm_quant_t`: block_n output
# columns, block_k contraction rows a step; fp8_block clamps both to 128): tiles that compile
# without spills in every format (`benchmarks.sass --transposed`, gpt-oss's dx shape: 56-208
# registers, none spilled).
QUANT_T = {
    "tiny": [
        C(16, 128, 128, 8, 4, 3),
        C(16, 128, 128, 8, 4, 4),
        C(16, 256, 128, 8, 4, 3),
        C(16, 64, 128, 8, 4, 4),
    ],
    "small": [
        C(128, 128, 64, 8, 8, 4),
        C(128, 128, 64, 8, 8, 3),
        C(128, 128, 64, 8, 8, 4, min_block_m=64),
        C(64, 128, 64, 8, 4, 4),
        C(64, 256, 64, 8, 8, 3),
        C(128, 64, 64, 8, 4, 4),
    ],
}
QUANT_T["large"] = QUANT_T["small"]
# FP8 activations on 64+-row tiles (block_k 128: one activation-scale block a step): a program
# waits on each step's fp8 dot before promoting it, so programs an SM (offline SASS, the weights
# as loaded: 64 x 64 at 4 warps 3-4, 64 x 128 2, 128 x 64 at 8 warps 2, 128 x 128 1) are what
# overlaps one program's promotion with another's dot. Decode-sized calls (16- and 32-row tiles:
# float16 dots) take fp8's tiny tiles. A GLU tile holds two accumulators and two partial sums.
_A8_ROWS = {
    "gmm": [
        C(64, 64, 128, 8, 4, 3, min_block_m=16),
        C(64, 64, 128, 8, 4, 4, min_block_m=16),
        C(64, 128, 128, 8, 4, 3, min_block_m=16),
        C(128, 64, 128, 8, 8, 3, min_block_m=64),
        C(128, 128, 128, 8, 8, 4, min_block_m=64),
    ],
    "gmm_glu": [
        C(64, 32, 128, 8, 4, 3, min_block_m=16),
        C(64, 64, 128, 8, 4, 3, min_block_m=16),
        C(64, 64, 128, 8, 4, 4, min_block_m=16),
        C(128, 64, 128, 8, 8, 3, min_block_m=64),
    ],
}
QUANT_A8 = {"tiny": QUANT_CANDIDATES["tiny"], "small": _A8_ROWS, "large": _A8_ROWS}
QUANT_FORMATS = {"fp8": "float8_e4m3fn", "mxfp4": "float4_e2m1fn", "fp8_a8": "float8_e4m3fn"}
TGMM_CANDIDATES = [
    C(32, 128, 128, 1, 4, 4),
    C(64, 128, 128, 1, 4, 3),
    C(32, 128, 128, 4, 4, 4),
    C(32, 128, 128, 16, 4, 4),
    C(64, 128, 128, 8, 4, 3),
    C(64, 128, 64, 8, 4, 4),
    C(64, 256, 128, 4, 8, 3),
    C(128, 128, 128, 4, 8, 3),
    C(32, 256, 128, 8, 8, 3),
    C(16, 128, 128, 16, 4, 4),
]
TOKENS = {"tiny": 64, "small": 2048, "large": {"gptoss": 16384, "swiglu256": 8192}}


def _problem(workload, tokens, small=False, weights="bf16"):
    """The arrays of one layer step, dispatched: x, weights (quantised to `weights` unless
    "bf16"), biases, h, a, dh, dy, metadata."""
    w = (SMALL_WORKLOADS if small else WORKLOADS)[workload]
    hidden, inter, experts, top_k = w.hidden, w.inter, w.experts, w.top_k
    keys = iter(jax.random.split(jax.random.key(tokens), 10))
    bf16 = jnp.bfloat16
    d = dispatch.dispatch(
        jax.random.randint(next(keys), (tokens, top_k), 0, experts, jnp.int32), experts
    )
    m = tokens * top_k
    p = {
        "x": jax.random.normal(next(keys), (tokens, hidden), bf16),
        "w_gate_up": jax.random.normal(next(keys), (experts, hidden, 2 * inter), bf16) * 0.02,
        "w_down": jax.random.normal(next(keys), (experts, inter, hidden), bf16) * 0.02,
        "h": jax.random.normal(next(keys), (m, 2 * inter), bf16),
        "a": jax.random.normal(next(keys), (m, inter), bf16),
        "dy": jax.random.normal(next(keys), (m, hidden), bf16),
        "row_weight": jax.random.uniform(next(keys), (m,), jnp.float32),
        "row_token": d.row_token,
        "sizes": d.group_sizes,
    }
    p["dh"] = p["h"]
    if weights != "bf16":
        fmt, a8 = weights.removesuffix("_a8"), weights.endswith("_a8")
        for name in ("w_gate_up", "w_down"):
            q = quant.quantize_weight(p[name], fmt)
            p[name] = dataclasses.replace(q, fp8_activations=True) if a8 else q
    if w.bias:
        p["b_gate_up"] = jax.random.normal(next(keys), (experts, 2 * inter), bf16)
        p["b_down"] = jax.random.normal(next(keys), (experts, hidden), bf16)
    p["activation"] = w.activation
    return p


def _calls(kernel, cfg, p):
    """[(op(carry, *args), carry, args)] of one kernel's layer calls with config cfg (gmm and
    gmm_glu through `kernels.gmm_quant` on quantised weights)."""
    bias_gu, bias_d = p.get("b_gate_up"), p.get("b_down")
    quantised = quant.is_quantized(p["w_down"])
    if quantised and kernel not in ("gmm", "gmm_glu", "gmm_t"):
        raise ValueError(
            f"kernel {kernel!r} does not run on quantised weights (gmm, gmm_glu, gmm_t do)."
        )
    mm = gmm_quant if quantised else gmm
    if quantised and p["w_down"].fp8_activations:  # rows quantised per call, as the backend does
        if kernel == "gmm_t":
            raise ValueError("FP8 activations are tuned for the forward's gmm and gmm_glu.")

        def mm(lhs, w, s, **kw):
            q, scales = quant.quantize_rows(lhs)
            return gmm_quant(q, w, s, lhs_scales=scales, out_dtype=lhs.dtype, **kw)

    if kernel == "gmm":
        return [
            (
                lambda x, w, s, r: mm(x, w, s, lhs_row_index=r, bias=bias_gu, config=cfg),
                p["x"],
                (p["w_gate_up"], p["sizes"], p["row_token"]),
            ),
            (
                lambda a, w, s, rw: mm(a, w, s, bias=bias_d, row_scale=rw, config=cfg),
                p["a"],
                (p["w_down"], p["sizes"], p["row_weight"]),
            ),
        ]
    if kernel == "gmm_glu":
        act = p["activation"]
        return [
            (
                lambda x, w, s, r: mm(
                    x, w, s, lhs_row_index=r, bias=bias_gu, activation=act, config=cfg
                ),
                p["x"],
                (p["w_gate_up"], p["sizes"], p["row_token"]),
            )
        ]
    if kernel == "gmm_t" and quantised:  # dx, and the GLU's input gradient through w_down
        return [
            (
                lambda dh, w, s: gmm_quant_t(dh, w, s, config=cfg),
                p["dh"],
                (p["w_gate_up"], p["sizes"]),
            ),
            (
                lambda dy, w, s, r: gmm_quant_t(dy, w, s, lhs_row_index=r, config=cfg),
                p["x"],
                (p["w_down"], p["sizes"], p["row_token"]),
            ),
        ]
    if kernel == "gmm_t":
        return [
            (
                lambda dh, w, s: gmm(dh, w, s, transpose_rhs=True, config=cfg),
                p["dh"],
                (p["w_gate_up"], p["sizes"]),
            )
        ]
    if kernel == "tgmm":
        return [
            (lambda a, dy, s: tgmm(a, dy, s, config=cfg), p["a"], (p["dy"], p["sizes"])),
            (
                lambda x, dh, s, r: tgmm(x, dh, s, lhs_row_index=r, config=cfg),
                p["x"],
                (p["dh"], p["sizes"], p["row_token"]),
            ),
        ]
    raise ValueError(kernel)


def table_config(kernel, cls, device, *, workload="gptoss", path=tuning.TABLE_PATH):
    """The table's Triton config for (kernel, class) on `device` (the default device's off the
    table), looked up at the workload's gate_up shape, or None."""
    w = WORKLOADS[workload]
    found = tuning.lookup(
        "pallas_triton",
        kernel,
        dtype=jnp.bfloat16,
        k=w.hidden,
        n=2 * w.inter,
        rows=cls,
        device=device,
        path=path,
    )
    return None if found is None else BlockConfig(**found)


def _candidates(
    kernel, cls, around_table=False, device=None, path=tuning.TABLE_PATH, weights="bf16"
):
    if weights == "fp8_a8":
        if around_table or kernel not in QUANT_A8[cls]:
            raise ValueError(
                "FP8 activations are tuned for gmm and gmm_glu (--kernels gmm gmm_glu, without "
                "--around-table)."
            )
        return QUANT_A8[cls][kernel]
    if weights != "bf16":
        if around_table or kernel not in (*QUANT_CANDIDATES[cls], "gmm_t"):
            raise ValueError(
                "quantised weights are tuned for gmm, gmm_glu and gmm_t (--kernels gmm gmm_glu "
                "gmm_t, without --around-table)."
            )
        if kernel == "gmm_t":
            return QUANT_T[cls]
        extra = QUANT_LARGE[kernel] if cls == "large" else []
        tiles = [*QUANT_CANDIDATES[cls][kernel], *extra]
        if weights != "mxfp4":  # fp8 values' tiles stay x first (kernels.gmm_quant, Tiling)
            return tiles
        # each wgmma tile also with the weights first (BlockConfig.weights_first)
        return tiles + [
            dataclasses.replace(c, weights_first=True) for c in tiles if c.block_m >= 64
        ]
    seed = table_config(kernel, cls, device, path=path) if around_table else None
    if seed is not None:  # the table's entry, its bucketed-M and tail_m variants (gmm kernels)
        if kernel == "tgmm":
            return [seed]
        lows = [m for m in (seed.block_m // 2, 16) if 16 <= m < seed.block_m]
        shortest = 64 if seed.num_warps >= 8 else 32  # the tails BlockConfig allows
        tails = [
            dataclasses.replace(seed, tail_m=t)
            for t in (0, 32, 64)
            if t == 0 or shortest <= t <= seed.block_m
        ]
        lows = [dataclasses.replace(seed, min_block_m=m) for m in lows]
        return list(dict.fromkeys([seed, *lows, *tails]))
    if kernel == "tgmm":
        return TGMM_CANDIDATES
    return (GLU_CANDIDATES if kernel == "gmm_glu" else GMM_CANDIDATES)[cls]


# --small: tiny workloads, tokens and tiles, to test this script on CPU (interpret mode).
SMALL_CANDIDATES = [C(16, 16, 16, 2, 4, 2), C(16, 32, 16, 1, 4, 2)]


def entry(kernel: str, cls: str, cfg: BlockConfig, weights: str = "bf16") -> dict:
    """The tuning-table entry of a winner: every shape of the class, every dtype (bf16 weights)
    or the quantised weights' element type (FP8 activations: the "_a8" kernel's)."""
    return {
        "backend": "pallas_triton",
        "kernel": f"{kernel}_a8" if weights == "fp8_a8" else kernel,
        "dtype": QUANT_FORMATS.get(weights, "*"),
        "k": "*",
        "n": "*",
        "rows": cls,
        "config": dataclasses.asdict(cfg),
    }


def tune(
    kernels,
    classes,
    workloads,
    small=False,
    around_table=False,
    device=None,
    path=tuning.TABLE_PATH,
    done=lambda entries, log: None,
    weights="bf16",
):
    """(entries, log) after timing every candidate: one entry per (kernel, class) that had a
    candidate run; `done(entries, log)` after each, so a run stopped by a time limit keeps what
    it measured."""
    entries, log = [], []
    plan = {
        (cls, kernel): SMALL_CANDIDATES
        if small
        else _candidates(kernel, cls, around_table, device, path, weights)
        for cls in classes
        for kernel in kernels
    }
    bar = tqdm(total=sum(map(len, plan.values())), desc="autotune", unit="cfg", file=sys.stderr)
    for cls in classes:
        problems = {}
        for w in workloads:
            tokens = TOKENS[cls]
            tokens = tokens[w] if isinstance(tokens, dict) else tokens
            problems[w] = _problem(w, 16 if small else tokens, small, weights)
        for kernel in kernels:
            best = None
            for cfg in plan[(cls, kernel)]:
                record = {
                    "kernel": kernel,
                    "rows": cls,
                    "weights": weights,
                    "config": dataclasses.asdict(cfg),
                }
                bar.set_postfix_str(f"{kernel} {cls}")
                try:
                    per_workload = {
                        w: sum(
                            time_op(op, carry, *args, target_s=0.03) * 1e3
                            for op, carry, args in _calls(kernel, cfg, p)
                        )
                        for w, p in problems.items()
                    }
                except Exception as err:  # noqa: BLE001 - e.g. shared memory exceeded
                    log.append({**record, "error": str(err)[:200]})
                    bar.write(f"{kernel:7} {cls:6} {cfg} failed: {str(err)[:100]}")
                    bar.update()
                    continue
                total = sum(per_workload.values())
                log.append({**record, "ms": per_workload, "total_ms": total})
                bar.write(f"{kernel:7} {cls:6} {cfg} {per_workload} {total:.3f} ms")
                bar.update()
                if best is None or total < best[0]:
                    best = (total, cfg)
            if best is not None:
                entries.append(entry(kernel, cls, best[1], weights))
            done(entries, log)
        del problems
    bar.close()
    return entries, log


def _device_sms(device) -> int | None:
    """The GPU's streaming multiprocessors as jax reports them (None off GPU)."""
    if device.platform != "gpu":
        return None
    return getattr(device, "num_cores", None) or getattr(device, "core_count", None)


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--write", action="store_true", help="write the entries into --table (default: print them)"
    )
    parser.add_argument(
        "--table",
        type=Path,
        default=tuning.TABLE_PATH,
        help="the table to write (default: the package's moe_pallas/tuning.json)",
    )
    parser.add_argument(
        "--device",
        help="the table's device name to write under (default: this GPU's device_kind)",
    )
    parser.add_argument(
        "--num-sms", type=int, help="SMs of a device new to the table (default: this GPU's)"
    )
    parser.add_argument("--log", type=Path, help="JSON file for every candidate's times")
    parser.add_argument(
        "--kernels", nargs="+", default=list(tuning.KERNELS), choices=tuning.KERNELS
    )
    parser.add_argument("--classes", nargs="+", default=list(TOKENS), choices=tuning.ROWS_CLASSES)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument(
        "--weights",
        default="bf16",
        choices=["bf16", *QUANT_FORMATS],
        help="expert weights: bf16, or quantised (gmm, gmm_glu and gmm_t; fp8_a8: fp8 with FP8 "
        "activations, gmm and gmm_glu)",
    )
    parser.add_argument("--small", action="store_true", help="tiny shapes (CPU smoke test)")
    parser.add_argument(
        "--around-table",
        action="store_true",
        help="time only each table entry and its bucketed-M (min_block_m below block_m) and "
        "tail_m variants",
    )
    args = parser.parse_args(argv)
    gpu = jax.devices()[0]
    device = args.device or (gpu.device_kind if gpu.platform == "gpu" else None)
    if args.write and device is None:
        parser.error(
            "--write: off a GPU the kernels run in interpret mode and their times mean nothing; "
            "run on the GPU the table is for (or name it with --device, e.g. in a test)."
        )
    num_sms = args.num_sms or _device_sms(gpu)

    def done(entries, log):
        if args.log:
            meta = {"device": gpu.device_kind, "jax": jax.__version__}
            args.log.write_text(json.dumps({**meta, "log": log}, indent=1))
        if args.write and entries:
            tuning.write_entries(entries, device, num_sms=num_sms, path=args.table)

    entries, _ = tune(
        args.kernels,
        args.classes,
        args.workloads,
        args.small,
        args.around_table,
        device,
        args.table,
        done=done,
        weights=args.weights,
    )
    for e in entries:
        print(json.dumps(e))
    if args.write:
        print(f"wrote {len(entries)} entries for {device!r} into {args.table}")
    return entries


if __name__ == "__main__":
    main()
