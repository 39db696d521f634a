"""Every kernel at every config the tuning table ships, on small shapes that hit the edges, for
NVIDIA's compute-sanitizer (memcheck, racecheck, synccheck):

    tests/sanitize.sh OUT_DIR   # this file under each tool, logs in OUT_DIR
    python -m tests.sanitize [--list] [--only SUBSTRING] [--start I] [--stop J]

Each case runs its kernel once and checks the output against a float64 reference (a sanitizer
run that computed wrong numbers is not clean either); exit status 1 if any case is off.

Shapes. Groups of sizes (0, one row, a block and a bit, a ragged tail, one hot group holding most
rows, 0 again), so every tile class meets an empty group, a one-row group, a tail and a hot group;
K and N are past a multiple of the config's blocks by a ragged remainder for Triton (masked tails);
Mosaic GPU tiles whole blocks only, so its K and N are multiples of the shipped blocks. The table's
configs are applied as the backends apply them (`BlockConfig.fit`, `MosaicConfig.fit`), so the
blocks the sanitizer sees are the shipped ones, not shrunk ones, each with the epilogues its
kernel runs. Each case prints `case I NAME` before it runs, so `sanitize.sh` can name a case the
tool itself died in and resume after it.
"""

import argparse
import dataclasses
import itertools
import sys

import jax
import jax.numpy as jnp
import numpy as np

from moe_pallas import activations, quant, tuning
from moe_pallas.backends import cublas_slab
from moe_pallas.kernels import combine, glu_bwd, gmm_mgpu, slab, tgmm_mgpu
from moe_pallas.kernels.config import BlockConfig
from moe_pallas.kernels.gmm import gmm
from moe_pallas.kernels.gmm_quant import gmm_quant
from moe_pallas.kernels.tgmm import tgmm


def _sizes(block: int, rows_hot: int) -> list[int]:
    return [0, 1, block + 5, 2 * block - 3, rows_hot, 0]


def _inputs(seed, m_rows, k, n, groups, dtype=jnp.bfloat16):
    rng = np.random.default_rng(seed)
    lhs = jnp.asarray(rng.standard_normal((m_rows, k)) * k**-0.5, dtype)
    rhs = jnp.asarray(rng.standard_normal((groups, k, n)), dtype)
    return rng, lhs, rhs


def _rel(out, ref) -> float:
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30))


def _gmm_ref(lhs, rhs, sizes, *, transpose=False, bias=None, activation=None, row_scale=None):
    lhs, rhs = np.asarray(lhs, np.float64), np.asarray(rhs, np.float64)
    rows = []
    start = 0
    for g, s in enumerate(sizes):
        w = rhs[g].T if transpose else rhs[g]
        h = lhs[start : start + s] @ w
        if bias is not None:
            h = h + np.asarray(bias, np.float64)[g]
        rows.append(h)
        start += s
    h = np.concatenate(rows)
    if activation is not None:
        gate, up = activations.split_gate_up(jnp.asarray(h, jnp.float32), activation)
        h = np.asarray(activations.glu(gate, up, activation), np.float64)
    if row_scale is not None:
        h = h * np.asarray(row_scale, np.float64)[: h.shape[0], None]
    return h


def _tgmm_ref(lhs, rhs, sizes):
    lhs, rhs = np.asarray(lhs, np.float64), np.asarray(rhs, np.float64)
    out, start = [], 0
    for s in sizes:
        out.append(lhs[start : start + s].T @ rhs[start : start + s])
        start += s
    return np.stack(out)


def triton_gmm_case(kernel: str, cfg: BlockConfig, seed: int):
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    sizes = _sizes(bm, 3 * bm + (cfg.tail_m or 7))
    m_rows, groups = sum(sizes), len(sizes)
    k, n = 2 * bk + 24, bn + 40
    activation = {"gmm_glu": "gptoss"}.get(kernel)
    n_w = 2 * n if activation else n
    rng, lhs, rhs = _inputs(seed, m_rows, k, n_w, groups)
    transpose = kernel == "gmm_t"
    if transpose:
        rhs = jnp.swapaxes(rhs, 1, 2)
    perm = jnp.asarray(rng.permutation(m_rows), jnp.int32)
    bias = jnp.asarray(rng.standard_normal((groups, n_w)) * 0.1, jnp.float32)
    row_scale = jnp.asarray(rng.uniform(0.1, 1.0, m_rows), jnp.float32)
    out = gmm(
        lhs,
        rhs,
        jnp.asarray(sizes, jnp.int32),
        lhs_row_index=None if transpose else perm,
        transpose_rhs=transpose,
        bias=None if transpose else bias,
        activation=activation,
        row_scale=row_scale,
        out_dtype=jnp.float32,
        config=cfg,
    )
    src = lhs if transpose else lhs[perm]
    ref = _gmm_ref(
        src,
        rhs,
        sizes,
        transpose=transpose,
        bias=None if transpose else bias,
        activation=activation,
        row_scale=row_scale,
    )
    return out, ref


def quant_gmm_case(fmt: str, kernel: str, cfg: BlockConfig, seed: int):
    """gmm_quant on `fmt` weights (gathered rows, bias, GLU or row scale) against float64 on the
    exactly decoded weights; K past the blocks by 64 (mxfp4 packs K in 64s), N by 40."""
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    sizes = _sizes(bm, 3 * bm + 7)
    m_rows, groups = sum(sizes), len(sizes)
    k, n = 2 * bk + 64, bn + 40
    activation = {"gmm_glu": "gptoss"}.get(kernel)
    n_w = 2 * n if activation else n
    rng, lhs, rhs = _inputs(seed, m_rows, k, n_w, groups)
    w = quant.quantize_weight(rhs * k**-0.5, fmt)
    perm = jnp.asarray(rng.permutation(m_rows), jnp.int32)
    bias = jnp.asarray(rng.standard_normal((groups, n_w)) * 0.1, jnp.float32)
    row_scale = jnp.asarray(rng.uniform(0.1, 1.0, m_rows), jnp.float32)
    epilogue = {"activation": activation, "bias": bias} if activation else {"row_scale": row_scale}
    sizes_arr = jnp.asarray(sizes, jnp.int32)
    out = gmm_quant(
        lhs, w, sizes_arr, lhs_row_index=perm, out_dtype=jnp.float32, config=cfg, **epilogue
    )
    return out, _gmm_ref(lhs[perm], w.dequantize(jnp.float32), sizes, **epilogue)


def triton_tgmm_case(cfg: BlockConfig, seed: int):
    sizes = _sizes(cfg.block_m, 4 * cfg.block_m + 9)
    m_rows, groups = sum(sizes), len(sizes)
    k, n = cfg.block_k + 24, 2 * cfg.block_n + 40
    rng, lhs, _ = _inputs(seed, m_rows, k, 1, groups)
    rhs = jnp.asarray(rng.standard_normal((m_rows, n)), jnp.bfloat16)
    out = tgmm(lhs, rhs, jnp.asarray(sizes, jnp.int32), out_dtype=jnp.float32, config=cfg)
    return out, _tgmm_ref(lhs, rhs, sizes)


def slab_tgmm_case(seed: int):
    sizes = [0, 1, 40, 29, 300, 0, 7, 33]
    m_rows, groups = sum(sizes), len(sizes)
    rng, lhs, _ = _inputs(seed, m_rows, 72, 1, groups)
    rhs = jnp.asarray(rng.standard_normal((m_rows, 200)), jnp.bfloat16)
    out, sums = cublas_slab.tgmm(
        lhs, rhs, jnp.asarray(sizes, jnp.int32), out_dtype=jnp.float32, rhs_sums=True
    )
    starts = np.cumsum([0, *sizes])
    ref_sums = np.stack(
        [np.asarray(rhs, np.float64)[a:b].sum(0) for a, b in itertools.pairwise(starts)]
    )
    return jnp.concatenate([out.reshape(-1), sums.reshape(-1)]), np.concatenate(
        [_tgmm_ref(lhs, rhs, sizes).reshape(-1), ref_sums.reshape(-1)]
    )


def mosaic_gmm_case(cfg: gmm_mgpu.MosaicConfig, activation, seed: int):
    cta_m = cfg.cta_m
    sizes = _sizes(cta_m, 3 * cta_m + 7)
    m_rows, groups = sum(sizes), len(sizes)
    cols = 2 * cfg.block_n if cfg.consumers == 2 and cfg.split == "n" else cfg.block_n
    k, n = 3 * cfg.block_k, 2 * cols  # Mosaic GPU tiles only whole blocks (no K or N tails)
    n_w = 2 * n if activation else n
    rng, lhs, rhs = _inputs(seed, m_rows, k, n_w, groups)
    bias = jnp.asarray(rng.standard_normal((groups, n_w)) * 0.1, jnp.float32)
    row_scale = jnp.asarray(rng.uniform(0.1, 1.0, m_rows), jnp.float32)
    sizes_arr = jnp.asarray(sizes, jnp.int32)
    out = gmm_mgpu.gmm(
        lhs,
        rhs,
        sizes_arr,
        bias=bias,
        activation=activation,
        row_scale=row_scale,
        out_dtype=jnp.bfloat16,  # as auto runs it: a float32 tile overflows shared memory here
        config=cfg,
    )
    return out, _gmm_ref(lhs, rhs, sizes, bias=bias, activation=activation, row_scale=row_scale)


def mosaic_tgmm_case(seed: int):
    cfg = tgmm_mgpu.TgmmMosaicConfig()
    sizes = _sizes(cfg.block_m, 4 * cfg.block_m + 9)
    m_rows, groups = sum(sizes), len(sizes)
    rng, lhs, _ = _inputs(seed, m_rows, 192, 1, groups)
    rhs = jnp.asarray(rng.standard_normal((m_rows, 304)), jnp.bfloat16)
    out = tgmm_mgpu.tgmm(lhs, rhs, jnp.asarray(sizes, jnp.int32), out_dtype=jnp.bfloat16)
    return out, _tgmm_ref(lhs, rhs, sizes)


def glu_bwd_case(activation, seed: int):
    rng = np.random.default_rng(seed)
    m_rows, inter = 37, 200
    h = jnp.asarray(rng.standard_normal((m_rows, 2 * inter)) * 3, jnp.float32)
    g = jnp.asarray(rng.standard_normal((m_rows, inter)), jnp.float32)
    w = jnp.asarray(rng.uniform(0.1, 1, m_rows), jnp.float32)
    dh, a, dw = glu_bwd.glu_backward(h, g, w, activation)

    def f(h):
        return activations.glu(*activations.split_gate_up(h, activation), activation)

    a_ref, vjp = jax.vjp(f, h.astype(jnp.float64) if jax.config.x64_enabled else h)
    (dh_ref,) = vjp((g * w[:, None]).astype(a_ref.dtype))
    dw_ref = jnp.sum(g * a_ref, axis=1)
    return (
        jnp.concatenate([dh.reshape(-1), a.reshape(-1), dw]),
        np.concatenate(
            [np.ravel(dh_ref), np.ravel(a_ref), np.ravel(dw_ref)],
        ),
    )


def combine_case(seed: int):
    rng = np.random.default_rng(seed)
    tokens, top_k, hidden = 45, 3, 300
    rows = jnp.asarray(rng.standard_normal((tokens * top_k + 4, hidden)), jnp.float32)
    pair_row = rng.permutation(tokens * top_k).reshape(tokens, top_k).astype(np.int32)
    pair_row[3, 1] = -1  # a slot that adds nothing
    out = combine.combine(rows, jnp.asarray(pair_row))
    r = np.asarray(rows, np.float64)
    ref = np.stack([sum(r[j] for j in row if j >= 0) for row in pair_row])
    return out, ref


def slab_case(seed: int):
    rng = np.random.default_rng(seed)
    sizes = [0, 1, 40, 70, 0, 5]
    offsets = np.cumsum([0, *sizes]).astype(np.int32)
    src = jnp.asarray(rng.standard_normal((sum(sizes) + 3, 300)), jnp.float32)
    index = jnp.asarray(rng.permutation(sum(sizes)), jnp.int32)
    cap = 64
    out, sums = slab.slab(src, jnp.asarray(offsets), cap, row_index=index, sums=True)
    s = np.asarray(src, np.float64)[np.asarray(index)]
    ref = np.zeros((len(sizes), cap, 300))
    ref_sums = np.zeros((len(sizes), 300))
    for g, (a, b) in enumerate(itertools.pairwise(offsets)):
        ref[g, : min(b - a, cap)] = s[a : min(b, a + cap)]
        ref_sums[g] = s[a:b].sum(0)
    return jnp.concatenate([out.reshape(-1), sums.reshape(-1)]), np.concatenate(
        [ref.reshape(-1), ref_sums.reshape(-1)]
    )


QUANT_ELEMENTS = {"float8_e4m3fn": ("fp8", "fp8_block"), "float4_e2m1fn": ("mxfp4",)}


def _dtype_names(dtype) -> set[str]:
    return {dtype} if isinstance(dtype, str) else set(dtype)


def _quant_formats(entry: dict) -> tuple[str, ...]:
    """The quantised formats whose gmm_quant runs this table entry's config: those whose lookup by
    stored element type (as `backends.pallas_triton` looks them up) returns it."""
    k, n = (entry[d] if entry[d] != "*" else 1 for d in ("k", "n"))
    return tuple(
        fmt
        for name, fmts in QUANT_ELEMENTS.items()
        if tuning.lookup(
            entry["backend"],
            entry["kernel"],
            dtype=name,
            k=k,
            n=n,
            rows=entry["rows"],
            device=tuning.table()["default_device"],
        )
        == entry["config"]
        for fmt in fmts
    )


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    run: object  # () -> (out, reference)
    bound: float = 1e-3  # bf16 operands (exact products), float32 accumulation and output


def cases() -> list[Case]:
    """One case per (kernel, distinct shipped config, quantised format or none), then the
    kernels without a table entry."""
    out, seen = [], set()
    data = tuning.table()
    entries = data["devices"][data["default_device"]]["entries"]
    for i, e in enumerate(entries):
        key = (e["backend"], e["kernel"], str(sorted(e["config"].items())))
        label = f"{e['backend']}/{e['kernel']}/{e['rows']}/{e['config']}"
        if e["backend"] == "pallas_triton":
            cfg = BlockConfig(**e["config"])
            if e["kernel"] in ("gmm", "gmm_glu"):  # gmm_quant runs these configs too
                for fmt in _quant_formats(e):
                    if (*key, fmt) in seen:
                        continue
                    seen.add((*key, fmt))
                    out.append(
                        Case(
                            f"{label}/gmm_quant/{fmt}",
                            lambda f=fmt, k=e["kernel"], cfg=cfg, i=i: quant_gmm_case(f, k, cfg, i),
                        )
                    )
            if _dtype_names(e["dtype"]) <= QUANT_ELEMENTS.keys():
                continue  # quantised element types only: gmm_quant's entry
        if key in seen:
            continue
        seen.add(key)
        if e["backend"] == "pallas_triton":
            if e["kernel"] == "tgmm":
                out.append(Case(label, lambda cfg=cfg, i=i: triton_tgmm_case(cfg, i)))
            else:
                out.append(
                    Case(label, lambda k=e["kernel"], cfg=cfg, i=i: triton_gmm_case(k, cfg, i))
                )
        elif e["backend"] == "mosaic_gpu":
            cfg = gmm_mgpu.MosaicConfig(**e["config"])
            # The backend looks entries up by kernel ("gmm_glu" for a GLU), so a plain gmm entry
            # never runs a GLU epilogue (its split halves would overflow shared memory here).
            for act in (None,) if e["kernel"] == "gmm" else ("swiglu", "gptoss"):
                out.append(
                    Case(
                        f"{label}/{act}",
                        lambda cfg=cfg, a=act, i=i: mosaic_gmm_case(cfg, a, i),
                        1e-2,  # bf16 output
                    )
                )
        elif e["backend"] == "cublas_slab":
            out.append(Case(label, lambda i=i: slab_tgmm_case(i)))
    out += [
        *(
            Case(
                f"mosaic_gpu/gmm/default/{act}",
                lambda a=act: mosaic_gmm_case(gmm_mgpu.MosaicConfig(block_n=64), a, 90),
                1e-2,
            )
            for act in ("gptoss", "swiglu")
        ),
        Case("mosaic_gpu/tgmm/default", lambda: mosaic_tgmm_case(91), 1e-2),
        Case("glu_bwd/swiglu", lambda: glu_bwd_case("swiglu", 92), 1e-5),
        Case("glu_bwd/gptoss", lambda: glu_bwd_case("gptoss", 93), 1e-5),
        Case("combine", lambda: combine_case(94), 1e-6),
        Case("slab", lambda: slab_case(95), 1e-6),
    ]
    return out


def tail16_probe(groups: int, k: int, n: int, runs: int, stages: int = 4) -> int:
    """The refused 16-row tail (docs/reliability.md): the plain gmm (128 x 256 tiles, 8 warps, row
    scale, no bias) with tail_m = 16 against the same config without a tail, bit for bit, `runs`
    times; groups of 128 + 8 rows, so every group's last visit takes a tail. Returns the number of
    runs with a wrong row (printed per run). BlockConfig refuses tail_m = 16, so the config is
    built past its check."""
    sizes = [136] * groups
    m_rows = sum(sizes)
    rng, lhs, rhs = _inputs(7, m_rows, k, n, groups)
    row_scale = jnp.asarray(rng.uniform(0.1, 1.0, m_rows), jnp.float32)
    base = BlockConfig(128, 256, 64, 8, 8, stages, 16, 0)
    args = (lhs, rhs, jnp.asarray(sizes, jnp.int32))
    want = np.asarray(gmm(*args, row_scale=row_scale, config=base))
    check = BlockConfig.__post_init__
    BlockConfig.__post_init__ = lambda self: None  # the refusal is what this probes past
    try:
        tail = dataclasses.replace(base, tail_m=16)
        fn = jax.jit(lambda *a: gmm(*a, row_scale=row_scale, config=tail))
        fn(*args)
    finally:
        BlockConfig.__post_init__ = check
    bad_runs = 0
    for run in range(runs):
        got = np.asarray(fn(*args))
        bad = np.flatnonzero((got != want).any(axis=1))
        bad_runs += bool(bad.size)
        print(
            f"tail16 stages={stages} run {run}: {bad.size} of {m_rows} rows differ; first {bad[:8].tolist()}"
        )
    return bad_runs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="print the cases and exit")
    parser.add_argument("--only", help="run the cases whose name contains this")
    parser.add_argument(
        "--start", type=int, default=0, help="skip the first START cases (resuming after a crash)"
    )
    parser.add_argument("--stop", type=int, help="run the cases before STOP only (a shard)")
    parser.add_argument(
        "--tail16",
        nargs="+",
        type=int,
        metavar="GROUPS K N RUNS [STAGES]",
        help="run only the 16-row-tail probe (tail16_probe); exit 1 if a run differs",
    )
    args = parser.parse_args(argv)
    if args.tail16:
        return 1 if tail16_probe(*args.tail16) else 0
    todo = [c for c in cases() if not args.only or args.only in c.name]
    if args.list:
        print("\n".join(c.name for c in todo))
        return 0
    failed = 0
    todo = todo[args.start : args.stop]
    for i, c in enumerate(todo, args.start):
        print(f"case {i} {c.name}", flush=True)  # sanitize.sh resumes after the case it crashed in
        try:
            out, ref = c.run()
            err = _rel(jax.block_until_ready(out), ref)
        except Exception as exc:  # noqa: BLE001 - a case that cannot run is a failed case
            print(f"FAIL {type(exc).__name__}: {str(exc).splitlines()[0][:200]}  {c.name}")
            failed += 1
            continue
        ok = err <= c.bound
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {err:.2e}  {c.name}", flush=True)
    print(f"{len(todo) - failed} of {len(todo)} cases exact within their bounds")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
