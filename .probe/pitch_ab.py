"""fp8 values stored with a 256-byte row pitch (gpt-oss K = 2880 -> rows of 3072 bytes, the padding
never read: the kernels mask K at the logical 2880) against the 2880-byte rows, the same calls
(gate_up GLU with bias and row gather, down with bias and row scale; the table's configs for
K = 2880). Weights-only fp8 and fp8_block at T = 1 / 16 / 64 / 256 / 2048, FP8 activations (fp8)
at T = 2048 / 8192. gpt-oss gate_up padded passes 2^31 bytes (128 x 5760 x 3072), which puts it
in the byte-pair view (Offsets): FP8 activations lose the as-loaded fp8 dots there. Outputs are
checked bitwise equal. Medians of 3 alternating rounds, ms.
The padded weights are quant.quantize_weight's own (Row pitch), the unpadded their rows cut.
Usage: python .probe/pitch_ab.py OUT.json [--small] [--short]"""
import dataclasses, json, sys
import jax, jax.numpy as jnp
from moe_pallas import dispatch, quant
from moe_pallas.backends import pallas_triton
from moe_pallas.kernels.gmm_quant import gmm_quant
from benchmarks.bench_gmm import time_op


def unpadded(w):
    """The product's padded weight (quant's Row pitch) with its rows cut back to K."""
    return dataclasses.replace(w, values=w.values[:, :, : w.shape[1]], k=None)


small = "--small" in sys.argv
E, H, I, TOPK = (8, 480, 480, 2) if small else (128, 2880, 2880, 4)
key = jax.random.key(0)
w_gu = jax.random.normal(key, (E, H, 2 * I), jnp.bfloat16) * 0.02
w_d = jax.random.normal(jax.random.fold_in(key, 1), (E, I, H), jnp.bfloat16) * 0.02
b_gu = 0.1 * jax.random.normal(jax.random.fold_in(key, 2), (E, 2 * I), jnp.bfloat16)
b_d = 0.1 * jax.random.normal(jax.random.fold_in(key, 3), (E, H), jnp.bfloat16)
cases = [(f, T, False) for f in ("fp8", "fp8_block") for T in ((1, 16) if small else (1, 16, 64, 256, 2048))]
cases += [("fp8", T, True) for T in ((64,) if small else (2048, 8192))]
if "--short" in sys.argv:  # fp8 decode and one FP8-activation case
    cases = [c for c in cases if c[0] == "fp8" and c[1] in (16, 64, 256, 8192)]
rows = []
for fmt, T, a8 in cases:
    qgu, qd = quant.quantize_weight(w_gu, fmt), quant.quantize_weight(w_d, fmt)
    assert qgu.k == H and qd.k == I, (qgu.k, qd.k)
    qgu0, qd0 = unpadded(qgu), unpadded(qd)
    idx = jax.random.randint(jax.random.fold_in(key, T), (T, TOPK), 0, E, jnp.int32)
    d = dispatch.dispatch(idx, E)
    x = jax.random.normal(jax.random.fold_in(key, 7), (T, H), jnp.bfloat16)
    a = jax.random.normal(jax.random.fold_in(key, 8), (T * TOPK, I), jnp.bfloat16)
    rw = jax.random.uniform(jax.random.fold_in(key, 9), (T * TOPK,), jnp.float32)
    dt = qgu0.element_dtype
    cfg_gu = pallas_triton.config("gmm_glu", dt, T * TOPK, E, H, I, "gptoss", fp8_activations=a8)
    cfg_d = pallas_triton.config("gmm", dt, T * TOPK, E, I, H, fp8_activations=a8)
    if a8:
        xq, xs = quant.quantize_rows(x)
        aq, as_ = quant.quantize_rows(a)
        gate_up = lambda x, w, s, r, xs=xs, c=cfg_gu: gmm_quant(
            x, w, s, lhs_row_index=r, bias=b_gu, activation="gptoss", config=c,
            lhs_scales=xs, out_dtype=jnp.bfloat16)
        down = lambda a, w, s, rw, as_=as_, c=cfg_d: gmm_quant(
            a, w, s, bias=b_d, row_scale=rw, config=c, lhs_scales=as_, out_dtype=jnp.bfloat16)
        xin, ain = xq, aq
    else:
        gate_up = lambda x, w, s, r, c=cfg_gu: gmm_quant(
            x, w, s, lhs_row_index=r, bias=b_gu, activation="gptoss", config=c)
        down = lambda a, w, s, rw, c=cfg_d: gmm_quant(a, w, s, bias=b_d, row_scale=rw, config=c)
        xin, ain = x, a
    variants = {"rows2880": (qgu0, qd0), "pitch": (qgu, qd)}
    same = True
    outs = {}
    for n, (qgu, qd) in variants.items():
        outs[n] = (jax.jit(gate_up)(xin, qgu, d.group_sizes, d.row_token),
                   jax.jit(down)(ain, qd, d.group_sizes, rw))
    same = all(bool(jnp.array_equal(p, q)) for p, q in zip(outs["rows2880"], outs["pitch"]))
    times = {f"{n}/{p}": [] for n in variants for p in ("gate_up", "down")}
    for _ in range(3):
        for n, (qgu, qd) in variants.items():
            times[f"{n}/gate_up"].append(time_op(gate_up, xin, qgu, d.group_sizes, d.row_token) * 1e3)
            times[f"{n}/down"].append(time_op(down, ain, qd, d.group_sizes, rw) * 1e3)
    row = {"fmt": fmt, "T": T, "a8": a8, "equal": same,
           **{k: round(sorted(v)[1], 4) for k, v in times.items()}}
    print(json.dumps(row), flush=True)
    rows.append(row)
json.dump(rows, open(sys.argv[1], "w"), indent=1)
