"""What the runner times: our backends and the peers, each prepared for one case.

An implementation's `prepare(case, inputs)` returns a `Prepared` (a zero-argument call that launches
one step, how to wait for it, and its peak memory), or raises `Skip` with the reason (not importable,
not implemented, would not fit). Layer cases time the whole expert layer (dispatch → gate_up →
activation → down → combine), "train" cases its forward + backward (gradients of x, weights and
routing weights); gmm/tgmm cases time one grouped matmul.

  moe_pallas:<backend>  `moe_pallas.moe_experts(..., implementation=backend)` for "auto" (what a
                        user gets by default), "pallas_triton" and "mosaic_gpu"; gmm cases use
                        `moe_pallas.ragged_dot` / `moe_pallas.tgmm`.
  jax.lax.ragged_dot    our "xla" backend (`moe_experts(implementation="xla")`: the same layer
                        around jax.lax.ragged_dot, on GPU a dense masked matmul).
  tokamax               plain JAX glue around `tokamax.ragged_dot(implementation="mosaic")`.
  torch._grouped_mm     the same glue in PyTorch around `torch._grouped_mm`, combine by index_add_.
  torch_loop            a loop over experts with `index_add_` (slow; not in the default set).
  moe_pallas:auto+FMT   our layer with the expert weights stored as FMT (fp8, fp8_block, mxfp4;
                        forward cases), its message the weight-read floor of the stored bytes;
                        FMT fp8_a8 / fp8_block_a8: those weights with `fp8_activations` (the
                        activations in e4m3 too, products on the FP8 tensor cores).
  moe_pallas:auto+fp8_training  our train step with `fp8_training` (train cases): bf16 weights
                        quantised per call, the forward's products and the backward's with wᵀ on
                        the FP8 tensor cores.
  tokamax+FMT           the tokamax glue with FMT weights as a qwix QArray (`qarray_parts`), so
                        tokamax's quantised ragged_dot runs (on Hopper: scales that tile K only).
  cublas_line           the yardstick: the case's matmul work as cuBLAS batched dots with perfect
                        balance, no gather, activation, scatter or routing (`_line_matmuls`);
                        the faster of torch.bmm and XLA's batched dot_general, timed here.
"""

import dataclasses
import functools
import importlib
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

import moe_pallas
from benchmarks.cases import Case, hit_experts
from moe_pallas import quant
from moe_pallas.dispatch import dispatch


class Skip(Exception):
    """The implementation does not run this case; the message says why."""


@dataclasses.dataclass
class Prepared:
    call: Callable[[], Any]  # launches one step, returns its (possibly still running) output
    wait: Callable[[Any], Any]  # blocks until an output is ready
    peak_bytes: float | None  # device memory of one step (jax: compiled arguments+outputs+temps)
    compile_s: float
    output: Callable[[Any], jax.Array | None]  # the comparable output of a step (fwd/gmm), or None
    note: str = ""  # what ran, where an implementation picks among variants (the row's message)


# ---------------------------------------------------------------- jax side


def _glu(h, activation):
    """The workloads' GLUs on gate_up's float32 output (the peers' own copy of the math):
    gpt-oss interleaves gate and up columns and clamps them (limit 7, alpha 1.702); SwiGLU takes
    the first half as gate."""
    if activation == "gptoss":
        gate, up = jnp.minimum(h[..., 0::2], 7.0), jnp.clip(h[..., 1::2], -7.0, 7.0)
        return (up + 1) * gate * jax.nn.sigmoid(1.702 * gate)
    gate, up = jnp.split(h, 2, axis=-1)
    return jax.nn.silu(gate) * up


def _ragged_layer(x, topk_idx, topk_weight, params, activation, ragged_dot):
    """The expert layer around any `ragged_dot(lhs, rhs, group_sizes) -> f32`, plain JAX glue."""
    num_tokens, top_k = topk_idx.shape
    d = dispatch(topk_idx, params["w_gate_up"].shape[0])
    row_expert = topk_idx.reshape(-1)[d.row_pair]
    h = ragged_dot(x[d.row_token], params["w_gate_up"], d.group_sizes)
    if "b_gate_up" in params:
        h = h + params["b_gate_up"].astype(jnp.float32)[row_expert]
    a = _glu(h, activation).astype(x.dtype)
    y = ragged_dot(a, params["w_down"], d.group_sizes)
    if "b_down" in params:
        y = y + params["b_down"].astype(jnp.float32)[row_expert]
    y = y * topk_weight.reshape(-1)[d.row_pair].astype(jnp.float32)[:, None]
    return jnp.sum(y[d.pair_row].reshape(num_tokens, top_k, -1), axis=1).astype(x.dtype)


def _train_step(layer):
    """The loss <layer(x, ...), dout> and its gradients with respect to x, topk_weight and the
    params. The loss is returned, as a training step uses it: with gradients alone XLA drops the
    forward's last matmul and combine (their output feeds nothing the gradients need)."""

    def step(x, topk_idx, topk_weight, params, dout):
        def loss(x, topk_weight, params):
            return jnp.vdot(layer(x, topk_idx, topk_weight, params).astype(jnp.float32), dout)

        return jax.value_and_grad(loss, argnums=(0, 1, 2))(x, topk_weight, params)

    return step


def _prepare_jax(fn, args, train_output=False) -> Prepared:
    start = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_s = time.perf_counter() - start
    mem = compiled.memory_analysis()
    peak = None
    if mem is not None:
        peak = float(mem.argument_size_in_bytes + mem.output_size_in_bytes + mem.temp_size_in_bytes)
    return Prepared(
        call=lambda: compiled(*args),
        wait=jax.block_until_ready,
        peak_bytes=peak,
        compile_s=compile_s,
        output=(lambda out: None) if train_output else (lambda out: out),
    )


def _jax_case(case: Case, inputs: dict, layer, ragged_dot) -> Prepared:
    """Prepare a jax implementation given its layer function and its gmm function."""
    x, topk_idx, topk_weight, params = (
        inputs[k] for k in ("x", "topk_idx", "topk_weight", "params")
    )
    if case.mode == "fwd":
        return _prepare_jax(layer, (x, topk_idx, topk_weight, params))
    if case.mode == "train":
        dout = inputs["dout"]
        return _prepare_jax(_train_step(layer), (x, topk_idx, topk_weight, params, dout), True)
    lhs, rhs, group_sizes = inputs["lhs"], inputs["rhs"], inputs["group_sizes"]
    if case.mode == "gmm":
        return _prepare_jax(ragged_dot, (lhs, rhs, group_sizes))

    def tgmm(lhs, dy, group_sizes):  # dW[g] = lhs[g]ᵀ @ dy[g]: the transpose rule of ragged_dot
        _, vjp = jax.vjp(lambda w: ragged_dot(lhs, w, group_sizes), rhs)
        return vjp(dy.astype(jnp.float32))[0]

    return _prepare_jax(tgmm, (lhs, inputs["dy"], group_sizes))


def _ours(backend: str, fp8_training: bool = False):
    def prepare(case: Case, inputs: dict) -> Prepared:
        if fp8_training and case.mode != "train":
            raise Skip("fp8_training is a training option: train cases only")
        activation = case.workload.activation
        if case.mode == "gmm":
            return _prepare_jax(
                # Output in lhs's dtype, as the layer's matmuls write (and the line's batched dots).
                lambda lhs, rhs, gs: moe_pallas.ragged_dot(lhs, rhs, gs, implementation=backend),
                (inputs["lhs"], inputs["rhs"], inputs["group_sizes"]),
            )
        if case.mode == "tgmm":
            return _prepare_jax(
                lambda lhs, dy, gs: moe_pallas.tgmm(lhs, dy, gs, implementation=backend),
                (inputs["lhs"], inputs["dy"], inputs["group_sizes"]),
            )

        def layer(x, topk_idx, topk_weight, params):
            return moe_pallas.moe_experts(
                x,
                topk_idx,
                topk_weight,
                params,
                activation=activation,
                implementation=backend,
                fp8_training=fp8_training,
            )

        return _jax_case(case, inputs, layer, None)

    return prepare


QUANT_FORMATS = ("fp8", "fp8_block", "mxfp4")
A8 = "_a8"  # a format's suffix for its weights with `fp8_activations` (ours only)
A8_FORMATS = ("fp8" + A8, "fp8_block" + A8)


def weight_format(impl: str) -> str | None:
    """The quantised weight format an implementation's name carries ("moe_pallas:auto+fp8":
    "fp8"), or None for bf16 weights."""
    fmt = impl.rpartition("+")[2]
    return fmt if "+" in impl and fmt in QUANT_FORMATS + A8_FORMATS else None


@functools.cache
def read_bandwidth() -> float:
    """Bytes/s of a streaming read: an XLA sum of a 4 GiB bf16 array (32 MiB off GPU), timed as
    the suites are (bursts of 20 back-to-back calls with one wait, median of 5 bursts), since a
    blocking call per sample adds the host's wait to a read of about a millisecond."""
    size = 1 << (31 if jax.default_backend() == "gpu" else 24)
    x = jax.random.normal(jax.random.key(0), (size,), jnp.bfloat16)
    total = jax.jit(lambda v: jnp.sum(v, dtype=jnp.float32))
    jax.block_until_ready(total(x))
    times = []
    for _ in range(5):
        start = time.perf_counter()
        jax.block_until_ready([total(x) for _ in range(20)])
        times.append((time.perf_counter() - start) / 20)
    return x.nbytes / sorted(times)[2]


def _quantized_params(case: Case, inputs: dict, fmt: str) -> dict:
    if case.mode != "fwd":
        raise Skip("not implemented: quantised weights run forward layer cases only")
    # eagerly, so that mxfp4's scale bound is known (`QuantizedWeight.small_scales`), as after
    # load_experts
    base = fmt.removesuffix(A8)
    return moe_pallas.quantize_experts(inputs["params"], base, fp8_activations=base != fmt)


FLOOR = "weight-read floor "


def floor_ms(row: dict) -> float | None:
    """A quantised-weights row's weight-read floor in ms (its message, `_floor_note`), else None.
    Such rows have no % SOL: the case's SOL counts bf16 weight bytes, the floor the stored ones."""
    message = row.get("message") or ""
    return float(message[len(FLOOR) :].split(" ", 1)[0]) if message.startswith(FLOOR) else None


def _floor_note(case: Case, inputs: dict, qparams: dict) -> str:
    """The weight-read floor: the stored bytes of the hit experts (values, scales, biases) plus
    x and out, at the measured read bandwidth; fp8 rows' padding (quant's Row pitch), which no
    kernel reads, is not counted."""
    hit = hit_experts(inputs["topk_idx"], case.workload.experts)
    per_expert = sum(_bytes_read(v) / case.workload.experts for v in qparams.values())
    floor_bytes = hit * per_expert + 2 * inputs["x"].nbytes
    bandwidth = read_bandwidth()
    return (
        f"{FLOOR}{floor_bytes / bandwidth * 1e3:.4g} ms ({floor_bytes / 1e6:.4g} MB "
        f"at {bandwidth / 1e12:.2f} TB/s measured)"
    )


def _bytes_read(v) -> int:
    """A parameter's bytes: a `QuantizedWeight`'s values up to its logical K and its scales, an
    array's own."""
    if quant.is_quantized(v) and v.k is not None:
        return v.values.nbytes // v.values.shape[2] * v.k + v.scales.nbytes
    return sum(a.nbytes for a in jax.tree.leaves(v))


def _ours_quantized(fmt: str):
    """Our layer with the expert weights stored in `fmt` (moe_pallas.quantize_experts, outside
    the timing); the row's message gives the weight-read floor (`_floor_note`)."""

    def prepare(case: Case, inputs: dict) -> Prepared:
        qparams = _quantized_params(case, inputs, fmt)
        prep = _ours("auto")(case, {**inputs, "params": qparams})
        prep.note = _floor_note(case, inputs, qparams)
        return prep

    return prepare


def qarray_parts(w: quant.QuantizedWeight, scale_dtype) -> tuple[jax.Array, jax.Array]:
    """(qvalue, scale) of the qwix QArray equal to `w`: qvalue [E, K, N] in the stored element
    type (fp8 values transposed from their N-major storage), scale [E, K / tile_k, N] in
    `scale_dtype` (qwix's dequantised dtype), so that w[e, k, n] = qvalue[e, k, n] ·
    scale[e, k // tile_k, n]. tokamax's Hopper kernel takes scales that tile K only, so
    fp8_block's 128 x 128 block scales repeat along N (N and K must be multiples of 128 then) and
    mxfp4's codes unpack to float4_e2m1fn with 2^(e8m0 − 127) scales."""
    values = w.unpadded_values
    if w.fmt == "fp8":
        return jnp.swapaxes(values, 1, 2), w.scales[:, None, :].astype(scale_dtype)
    if w.fmt == "fp8_block":
        _, k, n = w.shape
        if k % quant.FP8_BLOCK or n % quant.FP8_BLOCK:
            raise Skip(f"fp8_block as a QArray needs K and N multiples of 128 (K={k}, N={n})")
        scales = w.scales
        if scales.shape[2] != n:
            scales = jnp.repeat(scales, quant.FP8_BLOCK, axis=2)
        return jnp.swapaxes(values, 1, 2), scales.astype(scale_dtype)
    codes = quant.mxfp4_codes(w.values)
    qvalue = jnp.asarray(quant.E2M1)[codes].astype(jnp.float4_e2m1fn)
    scale = jnp.ldexp(jnp.ones(w.scales.shape, jnp.float32), w.scales.astype(jnp.int32) - 127)
    return qvalue, scale.astype(scale_dtype)


# tokamax's sm90 kernel converts the stored values to its scales' dtype, the activations' too,
# and the H200 converts e4m3 to float16 only: its fp8 formats run on float16 activations.
TOKAMAX_FP8_DTYPE = jnp.float16


def _tokamax_quantized(fmt: str):
    """The tokamax glue with `fmt` weights handed to tokamax as qwix QArrays (`qarray_parts`,
    converted outside the timing), for fp8 with x (and so the scales) in float16 inside the
    layer (`TOKAMAX_FP8_DTYPE`); the row's message gives our format's weight-read floor."""

    def prepare(case: Case, inputs: dict) -> Prepared:
        qparams = _quantized_params(case, inputs, fmt)
        ragged_dot = _tokamax_ragged_dot()
        qwix = importlib.import_module("qwix")
        dtype = inputs["x"].dtype if fmt == "mxfp4" else TOKAMAX_FP8_DTYPE
        params = {
            name: qarray_parts(v, dtype) if quant.is_quantized(v) else v
            for name, v in qparams.items()
        }

        def layer(x, topk_idx, topk_weight, params):
            params = {
                name: qwix.QArray(qvalue=v[0], scale=v[1], qtype=v[0].dtype)
                if isinstance(v, tuple)
                else v
                for name, v in params.items()
            }
            out = _ragged_layer(
                x.astype(dtype), topk_idx, topk_weight, params, case.workload.activation, ragged_dot
            )
            return out.astype(x.dtype)

        prep = _jax_case(case, {**inputs, "params": params}, layer, ragged_dot)
        prep.note = _floor_note(case, inputs, qparams)
        if dtype != inputs["x"].dtype:
            prep.note += f"; x in {jnp.dtype(dtype).name} (tokamax's fp8 path on the H200)"
        return prep

    return prepare


def _xla_dense_estimate(case: Case) -> tuple[float, float]:
    """(bytes, seconds) of jax.lax.ragged_dot's dense GPU fallback: every row times every group
    (an f32 [E, M, N] product; its transpose for tgmm also masks lhs and dy per group)."""
    w = case.workload
    m = case.tokens * w.top_k
    if case.mode in ("gmm", "tgmm"):
        mm, k, n = case.gmm_shape()
        dense = w.experts * mm * (n if case.mode == "gmm" else 2 * (k + n)) * 4.0
        return dense, 2.0 * mm * w.experts * k * n / 7e14  # ~700 TFLOP/s measured
    scale = 3 if case.mode == "train" else 1
    dense = m * w.experts * max(2 * w.inter, w.hidden) * 4.0 * scale
    return dense, scale * 2.0 * m * w.experts * (w.hidden * 2 * w.inter + w.inter * w.hidden) / 7e14


def _prepare_xla(case: Case, inputs: dict) -> Prepared:
    if jax.default_backend() == "gpu":
        need, seconds = _xla_dense_estimate(case)
        need += sum(p.nbytes for p in inputs["params"].values())
        limit = jax.devices()[0].memory_stats().get("bytes_limit", 0)
        if limit and need > 0.9 * limit:
            raise Skip(f"would not fit: the dense fallback needs ~{need / 2**30:.0f} GiB (oom)")
        if seconds > 1.0:
            raise Skip(f"too slow: ~{seconds:.1f} s per call estimated (dense fallback)")

    def ragged_dot(lhs, rhs, group_sizes):
        return jax.lax.ragged_dot(lhs, rhs, group_sizes, preferred_element_type=jnp.float32)

    def layer(x, topk_idx, topk_weight, params):
        return moe_pallas.moe_experts(
            x,
            topk_idx,
            topk_weight,
            params,
            activation=case.workload.activation,
            implementation="xla",
        )

    return _jax_case(case, inputs, layer, ragged_dot)


def _peer_path() -> None:
    """Make the carried peer libraries importable: benchmarks/fetch_peers.sh installs tokamax into
    .peers/site and writes the xprof stub it imports into .peers/stub."""
    root = Path(__file__).resolve().parent.parent / ".peers"
    for sub in ("stub", "site"):
        if (root / sub).is_dir() and str(root / sub) not in sys.path:
            sys.path.insert(0, str(root / sub))


def _tokamax_ragged_dot():
    """tokamax's Mosaic GPU ragged_dot as `ragged_dot(lhs, rhs, group_sizes) -> float32` (rhs an
    array or a qwix QArray); Skip where tokamax cannot run."""
    _peer_path()
    try:
        tokamax = importlib.import_module("tokamax")
    except Exception as err:  # noqa: BLE001 - any import failure means "not available here"
        raise Skip(
            f"tokamax not importable ({type(err).__name__}: {err}); see benchmarks/fetch_peers.sh"
        ) from None
    if jax.default_backend() != "gpu":
        raise Skip("tokamax's mosaic ragged_dot needs a Hopper GPU")

    def ragged_dot(lhs, rhs, group_sizes):
        # Output in the operands' dtype: tokamax's backward rejects f32 cotangents for bf16 weights.
        out = tokamax.ragged_dot(
            lhs, rhs, group_sizes, preferred_element_type=lhs.dtype, implementation="mosaic"
        )
        return out.astype(jnp.float32)

    return ragged_dot


def _prepare_tokamax(case: Case, inputs: dict) -> Prepared:
    ragged_dot = _tokamax_ragged_dot()

    def layer(x, topk_idx, topk_weight, params):
        return _ragged_layer(x, topk_idx, topk_weight, params, case.workload.activation, ragged_dot)

    return _jax_case(case, inputs, layer, ragged_dot)


# ---------------------------------------------------------------- torch side


def _torch():
    try:
        import torch
    except ImportError:
        raise Skip("torch is not installed") from None
    if not torch.cuda.is_available():
        raise Skip("torch has no CUDA device")
    return torch


def release_torch_cache() -> None:
    """Give the blocks torch's caching allocator holds back to the card, where torch has run: jax
    shares the card, and a torch row's cache (a train step's weight clones and gradients) would
    otherwise sit beside the rows that come after it."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def _torch_glu(h, activation, torch):
    if activation == "gptoss":
        gate, up = h[..., 0::2].clamp(max=7.0), h[..., 1::2].clamp(-7.0, 7.0)
        return (up + 1) * gate * torch.sigmoid(1.702 * gate)
    gate, up = h.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


def _torch_grouped_layer(torch, activation):
    def layer(x, topk_idx, topk_weight, params):
        num_experts = params["w_gate_up"].shape[0]
        top_k = topk_idx.shape[1]
        flat = topk_idx.reshape(-1)
        order = torch.argsort(flat, stable=True)
        token = order // top_k
        offs = torch.cumsum(torch.bincount(flat, minlength=num_experts), 0).to(torch.int32)
        row_expert = flat[order]
        h = torch._grouped_mm(x[token], params["w_gate_up"], offs=offs).float()
        if "b_gate_up" in params:
            h = h + params["b_gate_up"][row_expert]
        a = _torch_glu(h, activation, torch).to(x.dtype)
        y = torch._grouped_mm(a, params["w_down"], offs=offs).float()
        if "b_down" in params:
            y = y + params["b_down"][row_expert]
        y = y * topk_weight.reshape(-1)[order, None]
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device).index_add_(0, token, y)
        return out.to(x.dtype)

    return layer


def _torch_loop_layer(torch, activation):
    def layer(x, topk_idx, topk_weight, params):
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        for e in range(params["w_gate_up"].shape[0]):
            token, slot = torch.where(topk_idx == e)
            if token.numel() == 0:
                continue
            h = (x[token] @ params["w_gate_up"][e]).float()
            if "b_gate_up" in params:
                h = h + params["b_gate_up"][e]
            y = (_torch_glu(h, activation, torch).to(x.dtype) @ params["w_down"][e]).float()
            if "b_down" in params:
                y = y + params["b_down"][e]
            out.index_add_(0, token, y * topk_weight[token, slot, None])
        return out.to(x.dtype)

    return layer


def _to_torch(value, torch):
    return torch.from_dlpack(value) if isinstance(value, jax.Array) else value


def _torch_prepare(case: Case, inputs: dict, layer, torch) -> Prepared:
    t = {k: _to_torch(v, torch) for k, v in inputs.items() if k != "params"}
    params = {k: torch.from_dlpack(v) for k, v in inputs["params"].items()}
    if case.mode == "gmm":
        lhs, rhs = t["lhs"], t["rhs"]
        offs = torch.cumsum(t["group_sizes"], 0).to(torch.int32)
        fn = lambda: torch._grouped_mm(lhs, rhs, offs=offs)
    elif case.mode == "tgmm":
        lhs_t, dy = t["lhs"].t(), t["dy"]
        offs = torch.cumsum(t["group_sizes"], 0).to(torch.int32)
        fn = lambda: torch._grouped_mm(lhs_t, dy, offs=offs)
    elif case.mode == "fwd":
        args = (t["x"], t["topk_idx"].long(), t["topk_weight"], params)
        fn = lambda: layer(*args)
    else:
        x = t["x"].detach().clone().requires_grad_()
        w = t["topk_weight"].detach().clone().requires_grad_()
        p = {k: v.detach().clone().requires_grad_() for k, v in params.items()}
        idx, dout = t["topk_idx"].long(), t["dout"]

        def fn():
            out = layer(x, idx, w, p)
            return torch.autograd.grad(out, (x, w, *p.values()), dout.to(out.dtype))

    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # give cached blocks of earlier cases back (jax shares the card)
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return Prepared(
        call=fn,
        wait=lambda _: torch.cuda.synchronize(),
        peak_bytes=float(torch.cuda.max_memory_allocated() - base),
        compile_s=time.perf_counter() - start,
        # Widened on the host: a float32 copy on the card would ask torch's share of it for
        # 16 GiB more at a SwiGLU-256 weight gradient.
        output=lambda out: out.cpu().float().numpy() if case.mode != "train" else None,
    )


def _prepare_torch_grouped(case: Case, inputs: dict) -> Prepared:
    torch = _torch()
    if not hasattr(torch, "_grouped_mm"):
        raise Skip(f"torch {torch.__version__} has no torch._grouped_mm")
    return _torch_prepare(
        case, inputs, _torch_grouped_layer(torch, case.workload.activation), torch
    )


def _prepare_torch_loop(case: Case, inputs: dict) -> Prepared:
    if case.mode in ("gmm", "tgmm"):
        raise Skip("the loop over experts is a layer, not a grouped matmul")
    torch = _torch()
    return _torch_prepare(case, inputs, _torch_loop_layer(torch, case.workload.activation), torch)


# ---------------------------------------------------------------- the cuBLAS line


def _line_matmuls(case: Case, hit: int) -> list[tuple[int, int, int, int, str]]:
    """The line's batched matmuls (batch, m, k, n, kind): the case's matmuls over the `hit`
    experts its routing reaches, its M = T·k rows split evenly (m = ⌈M / hit⌉ rows each).
    Kinds: "nn" is A[b, m, k] @ B[b, k, n] (a projection X @ W); "nt" is A[b, m, k] @ B[b, n, k]ᵀ
    (its input gradient dY @ Wᵀ, listed with k and n swapped); "tn" is A[b, m, k]ᵀ @ B[b, m, n]
    (its weight gradient Xᵀ @ dY).
    Forward: 2 matmuls (gate_up, down); train: 6 (each with its two gradients); gmm: 1; tgmm: the
    one "tn"."""
    w = case.workload
    if case.mode in ("gmm", "tgmm"):
        m, k, n = case.gmm_shape()
        return [(hit, -(-m // hit), k, n, "nn" if case.mode == "gmm" else "tn")]
    rows = -(-case.tokens * w.top_k // hit)
    out = []
    for k, n in ((w.hidden, 2 * w.inter), (w.inter, w.hidden)):
        out.append((hit, rows, k, n, "nn"))
        if case.mode == "train":
            out += [(hit, rows, n, k, "nt"), (hit, rows, k, n, "tn")]
    return out


def _line_operands(matmuls, dtype, seed):
    """Random operands per matmul: (a, b) with the shapes its kind multiplies. Operands of one
    shape are one array (a projection's weight serves its forward and its input gradient, X and
    dY its weight gradient), as in the layer: fresh weight-sized arrays per matmul held ~13 GB
    more at SwiGLU-256's train step, where torch._grouped_mm, timed after the line, then ran out
    of memory."""
    key = jax.random.key(seed)
    arrays: dict[tuple[int, ...], jax.Array] = {}

    def normal(shape):  # N(0, 1/64): products of K such terms stay far from bf16's range
        if shape not in arrays:
            x = jax.random.normal(jax.random.fold_in(key, len(arrays)), shape, dtype)
            arrays[shape] = x * jnp.asarray(0.125, dtype)
        return arrays[shape]

    operands = []
    for b, m, k, n, kind in matmuls:
        a_shape, b_shape = {
            "nn": ((b, m, k), (b, k, n)),
            "nt": ((b, m, k), (b, n, k)),
            "tn": ((b, m, k), (b, m, n)),
        }[kind]
        operands.append((normal(a_shape), normal(b_shape)))
    return operands


_LINE_DIMS = {  # dot_general dimension numbers per kind: ((contract), (batch))
    "nn": (((2,), (1,)), ((0,), (0,))),
    "nt": (((2,), (2,)), ((0,), (0,))),
    "tn": (((1,), (1,)), ((0,), (0,))),
}


def _line_xla(matmuls, operands) -> Prepared:
    kinds = [kind for *_, kind in matmuls]

    def step(operands):
        return [
            jax.lax.dot_general(a, b, _LINE_DIMS[kind]) for kind, (a, b) in zip(kinds, operands)
        ]

    return _prepare_jax(step, (operands,), train_output=True)


def _line_torch(matmuls, operands, torch) -> Prepared:
    ops = []
    for (*_, kind), (a, b) in zip(matmuls, operands):
        a, b = torch.from_dlpack(a), torch.from_dlpack(b)
        a = a.transpose(1, 2) if kind == "tn" else a
        b = b.transpose(1, 2) if kind == "nt" else b
        ops.append((a, b))

    def fn():
        return [torch.bmm(a, b) for a, b in ops]

    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return Prepared(
        call=fn,
        wait=lambda _: torch.cuda.synchronize(),
        peak_bytes=None,
        compile_s=time.perf_counter() - start,
        output=lambda out: None,
    )


def _quick_seconds(prep: Prepared, calls: int = 5, repeats: int = 3) -> float:
    """Best of `repeats` bursts of `calls` back-to-back calls: enough to rank two variants."""
    prep.wait(prep.call())
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            last = prep.call()
        prep.wait(last)
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def _prepare_line(case: Case, inputs: dict) -> Prepared:
    """The cuBLAS line of a case: XLA's batched dot and, where torch has CUDA, torch.bmm; the
    faster of the two (XLA's ran 5-10% slower than torch.bmm on some of these shapes on an H200).
    torch.bmm's outputs come from torch's share of the card: where they do not fit, XLA's dot is
    the line alone and the row's note says why."""
    hit = hit_experts(inputs["topk_idx"], case.workload.experts)
    matmuls = _line_matmuls(case, hit)
    operands = _line_operands(matmuls, inputs["x"].dtype, case.seed + 2)
    variants = {"xla dot_general": _line_xla(matmuls, operands)}
    without = ""
    try:
        torch = _torch()
        try:
            variants["torch.bmm"] = _line_torch(matmuls, operands, torch)
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            without = " (torch.bmm ran out of memory)"
    except Skip:
        pass
    if len(variants) == 1:
        name, prep = next(iter(variants.items()))
    else:
        name = min(variants, key=lambda v: _quick_seconds(variants[v]))
        prep = variants[name]
    prep.note = f"{name}{without}: " + ", ".join(_line_shape(*mm) for mm in matmuls)
    return prep


def _line_shape(b, m, k, n, kind) -> str:
    """One batched matmul as text, e.g. 128×[512,2880]·[2880,5760] (ᵀ marks a transposed operand)."""
    a, c = {
        "nn": (f"[{m},{k}]", f"[{k},{n}]"),
        "nt": (f"[{m},{k}]", f"[{n},{k}]ᵀ"),
        "tn": (f"[{m},{k}]ᵀ", f"[{m},{n}]"),
    }[kind]
    return f"{b}×{a}·{c}"


OURS = ("moe_pallas:auto", "moe_pallas:pallas_triton", "moe_pallas:mosaic_gpu")
# Our layer's train step with `fp8_training` (train cases; the products on the FP8 tensor cores).
FP8_TRAINING = "moe_pallas:auto+fp8_training"
PEERS = ("jax.lax.ragged_dot", "tokamax", "torch._grouped_mm", "torch_loop")
LINE = "cublas_line"
# What a run times unless --impls says otherwise: what users get by default, next to the peers.
DEFAULT = ("moe_pallas:auto", LINE, "jax.lax.ragged_dot", "tokamax", "torch._grouped_mm")
IMPLS: dict[str, Callable[[Case, dict], Prepared]] = {
    **{name: _ours(name.split(":")[1]) for name in OURS},
    FP8_TRAINING: _ours("auto", fp8_training=True),
    "jax.lax.ragged_dot": _prepare_xla,
    "tokamax": _prepare_tokamax,
    "torch._grouped_mm": _prepare_torch_grouped,
    "torch_loop": _prepare_torch_loop,
    LINE: _prepare_line,
    **{f"moe_pallas:auto+{fmt}": _ours_quantized(fmt) for fmt in QUANT_FORMATS + A8_FORMATS},
    **{f"tokamax+{fmt}": _tokamax_quantized(fmt) for fmt in QUANT_FORMATS},
}
# Implementations whose prepare only traces and compiles jax code, so that the runner may prepare
# them in threads at once (`benchmarks.run --compile-workers`): no step is run and nothing is timed,
# except XLA's autotuning of our weight gradients' batched matmul (cublas_slab) in "train" cases, the
# only one of them that times kernels while compiling. The line (it times its variants), torch (it
# runs a step) and jax.lax.ragged_dot (its dense XLA dot is autotuned too) are prepared alone, as
# are the quantised weights' implementations: each holds its own copy of the case's weights, and
# all of them at once (SwiGLU-256's decode cases: 33 GB for ours, tokamax's besides) left the
# line too little of the device's memory.
COMPILE_AHEAD = frozenset([*OURS, FP8_TRAINING, "tokamax"])
