"""Speed-of-light (SOL) arithmetic: the fastest a case could run on a device.

    SOL = max(FLOPs / peak_flops, bytes / bandwidth)

Expert layer, forward (T tokens, top-k, hidden H, intermediate I, `hit` experts receiving rows):
    FLOPs = 2·T·k·(H·2I + I·H)
    bytes = hit·(H·2I + I·H [+ 2I + H biases])·w + T·H·x (x in) + T·H·x (out)
Forward + backward ("train"): FLOPs ×3 (dX and dW per matmul); the weights are read twice (forward,
dX) and the weight gradients written once, so weight bytes ×3; activations x, out, dout, dx.
Grouped matmul `[M, K] @ W[g]: [K, N]` (gmm): FLOPs 2·M·K·N, bytes hit·K·N + M·K + M·N.
Transposed grouped matmul (tgmm, dW[g] = lhs[g]ᵀ @ rhs[g]): FLOPs 2·M·K·N, bytes M·K + M·N + G·K·N
(dW written in the weights' dtype).
Bytes ignore routing metadata (a few bytes per row) and assume each weight is read once.
"""

import dataclasses
import functools
import time

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Device:
    name: str
    peak_flops: dict[str, float]  # dense tensor-core FLOP/s by operand dtype
    bandwidth: float  # bytes/s of device memory

    def flops_rate(self, dtype) -> float:
        return self.peak_flops[jnp.dtype(dtype).name]


# Datasheet numbers (SXM parts); float32 operands run on tensor cores as tf32.
DEVICES: dict[str, Device] = {
    "h200": Device("h200", {"bfloat16": 989e12, "float16": 989e12, "float32": 494.5e12}, 4.8e12),
    "h100": Device("h100", {"bfloat16": 989e12, "float16": 989e12, "float32": 494.5e12}, 3.35e12),
}


@dataclasses.dataclass(frozen=True)
class Cost:
    flops: float
    bytes: float

    def sol_seconds(self, device: Device, dtype) -> float:
        return max(self.flops / device.flops_rate(dtype), self.bytes / device.bandwidth)

    def intensity(self) -> float:
        """Arithmetic intensity, FLOP per byte (the roofline's x axis)."""
        return self.flops / self.bytes


def layer_cost(
    tokens: int,
    hidden: int,
    inter: int,
    top_k: int,
    hit: int,
    *,
    itemsize: int = 2,
    bias: bool = False,
    train: bool = False,
) -> Cost:
    """FLOPs and bytes of the expert layer (see the module doc); `hit` = experts with ≥ 1 row."""
    per_expert = hidden * 2 * inter + inter * hidden + ((2 * inter + hidden) if bias else 0)
    flops = 2.0 * tokens * top_k * (hidden * 2 * inter + inter * hidden)
    act = tokens * hidden * itemsize
    if train:
        return Cost(3 * flops, 3 * hit * per_expert * itemsize + 4 * act)
    return Cost(flops, hit * per_expert * itemsize + 2 * act)


def gmm_cost(m: int, k: int, n: int, hit: int, *, itemsize: int = 2) -> Cost:
    return Cost(2.0 * m * k * n, (hit * k * n + m * k + m * n) * itemsize)


def tgmm_cost(
    m: int, k: int, n: int, groups: int, *, itemsize: int = 2, out_itemsize: int = 2
) -> Cost:
    return Cost(2.0 * m * k * n, (m * k + m * n) * itemsize + groups * k * n * out_itemsize)


def detect_device() -> Device | None:
    """The datasheet entry for jax's first device (matched by name), or None if unknown."""
    kind = jax.devices()[0].device_kind.lower()
    for key, device in DEVICES.items():
        if key in kind:
            return device
    return None


def median_seconds(fn, *args, warmup: int = 1, repeats: int = 10) -> float:
    """Median wall time of blocking calls `fn(*args)` after `warmup` calls (compile, caches)."""
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def measure_ceilings(size: int = 8192, copy_bytes: int = 2 << 30, repeats: int = 10) -> Device:
    """Measured ceilings on jax's default device: a bf16 `size`³ matmul (random data) and an
    elementwise pass over `copy_bytes` (bytes read + written). Use where datasheets flatter."""
    median_time = functools.partial(median_seconds, repeats=repeats)

    key_a, key_b = jax.random.split(jax.random.key(0))
    a = jax.random.normal(key_a, (size, size), jnp.bfloat16)
    b = jax.random.normal(key_b, (size, size), jnp.bfloat16)
    matmul = median_time(jax.jit(jnp.dot), a, b)
    flops = 2.0 * size**3 / matmul
    x = jax.random.normal(key_a, (copy_bytes // 4,), jnp.float32)
    copy = median_time(jax.jit(lambda v: v * 1.5 + 1.0), x)
    name = f"{jax.devices()[0].device_kind} (measured)"
    return Device(
        name, {"bfloat16": flops, "float16": flops, "float32": flops / 2}, 2 * copy_bytes / copy
    )
