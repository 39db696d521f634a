"""Benchmark workloads, suites and their inputs.

Workloads: A = gpt-oss experts (H = I = 2880, E = 128, k = 4, interleaved gate/up,
biases, clamped GLU); B = SwiGLU experts (H = 4096, I = 2048, E = 256, k = 8, no biases).
Routing of every case: random router logits (normal, fixed seed per case) → softmax top-k, so the
load is uniform-ish; the SOL counts the experts this routing actually hits.
`small=True` shrinks every workload and token count so the whole runner works on CPU in seconds.
"""

import dataclasses
import functools
from typing import Literal

import jax
import jax.numpy as jnp

from moe_pallas import route

Mode = Literal["fwd", "train", "gmm", "tgmm"]


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str
    hidden: int
    inter: int
    experts: int
    top_k: int
    activation: str
    bias: bool
    router: str  # moe_pallas.route method


WORKLOADS = {
    "gptoss": Workload("gptoss", 2880, 2880, 128, 4, "gptoss", True, "topk_softmax"),
    "swiglu256": Workload("swiglu256", 4096, 2048, 256, 8, "swiglu", False, "softmax_topk"),
}
SMALL_WORKLOADS = {
    "gptoss": Workload("gptoss", 64, 64, 8, 2, "gptoss", True, "topk_softmax"),
    "swiglu256": Workload("swiglu256", 64, 32, 16, 4, "swiglu", False, "softmax_topk"),
}


@dataclasses.dataclass(frozen=True)
class Case:
    suite: str
    workload: Workload
    tokens: int
    mode: Mode = "fwd"
    projection: Literal["gate_up", "down"] = "gate_up"  # gmm/tgmm cases: which matmul

    @property
    def name(self) -> str:
        extra = f"/{self.projection}" if self.mode in ("gmm", "tgmm") else ""
        return f"{self.workload.name}/{self.mode}{extra}/T={self.tokens}"

    @property
    def seed(self) -> int:
        return self.tokens * 7919 + len(self.workload.name)

    def gmm_shape(self) -> tuple[int, int, int]:
        """(M, K, N) of the grouped matmul of a gmm/tgmm case."""
        w = self.workload
        m = self.tokens * w.top_k
        return (
            (m, w.hidden, 2 * w.inter) if self.projection == "gate_up" else (m, w.inter, w.hidden)
        )


SUITE_TOKENS = {
    "gptoss": [*range(2048, 2401, 32), 2293, 3011, 4096, 16384],
    "swiglu256": [*range(2048, 2337, 32), 2447, 2767, 3072, 3803, 4096, 8192],
}
DECODE_TOKENS = [1, 4, 16, 64, 256]
SUITES = ("gptoss", "swiglu256", "decode", "train", "gmm")


def case_order(rows: list[dict]) -> list[str]:
    """The distinct cases of result rows by their name up to "T=" (workload, mode, projection),
    then by tokens T, so that tables and plots read in T order however the run's steps split the
    suite."""
    tokens = {r["case"]: r["tokens"] for r in rows}
    return sorted(tokens, key=lambda c: (c.rsplit("T=", 1)[0], tokens[c]))


def suite_cases(suite: str, *, small: bool = False) -> list[Case]:
    """The cases of one suite ("all" = every suite). Small: a few cases, tokens scaled down."""
    if suite == "all":
        return [c for s in SUITES for c in suite_cases(s, small=small)]
    if suite not in SUITES:
        raise ValueError(f"suite={suite!r} is unknown; use one of {SUITES} or 'all'.")
    wl = SMALL_WORKLOADS if small else WORKLOADS
    scale = (lambda t: max(1, t // 128)) if small else (lambda t: t)
    if suite in SUITE_TOKENS:
        tokens = SUITE_TOKENS[suite]
        if small:
            tokens = [tokens[0], tokens[-2], tokens[-1]]
        return [Case(suite, wl[suite], scale(t)) for t in tokens]
    if suite == "decode":
        tokens = DECODE_TOKENS[:3:2] if small else DECODE_TOKENS
        return [Case(suite, wl[w], t) for w in wl for t in tokens]
    if suite == "train":
        # The fwd+bwd sizes (T = 2048; 16384 gpt-oss, 8192 SwiGLU) and gpt-oss at 4096.
        pairs = [
            ("gptoss", 2048),
            ("gptoss", 4096),
            ("swiglu256", 2048),
            ("gptoss", 16384),
            ("swiglu256", 8192),
        ]
        return [Case(suite, wl[w], scale(t), "train") for w, t in (pairs[::2] if small else pairs)]
    # gmm: one grouped matmul of each projection at T = 2048 and at 65536 rows (T·k = 65536:
    # the compute-bound micro-benchmark), gate_up at T = 1, the weight gradient at T = 2048.
    big = {w: 65536 // wl[w].top_k for w in wl}
    cases = [
        Case(suite, wl[w], scale(t), mode, proj)
        for w in wl
        for t, mode, proj in [
            (2048, "gmm", "gate_up"),
            (2048, "gmm", "down"),
            (big[w], "gmm", "gate_up"),
            (big[w], "gmm", "down"),
            (1, "gmm", "gate_up"),
            (2048, "tgmm", "gate_up"),
        ]
    ]
    return [cases[i] for i in (0, 5, 6, 11)] if small else cases


def make_params(workload: Workload, dtype=jnp.bfloat16, seed: int = 0) -> dict[str, jax.Array]:
    """Random expert weights (scaled so activations stay O(1)), created on the default device."""
    w = workload
    k1, k2, k3, k4 = jax.random.split(jax.random.key(seed), 4)
    params = {
        "w_gate_up": jax.random.normal(k1, (w.experts, w.hidden, 2 * w.inter), dtype)
        * (w.hidden**-0.5),
        "w_down": jax.random.normal(k2, (w.experts, w.inter, w.hidden), dtype) * (w.inter**-0.5),
    }
    if w.bias:
        params["b_gate_up"] = 0.1 * jax.random.normal(k3, (w.experts, 2 * w.inter), dtype)
        params["b_down"] = 0.1 * jax.random.normal(k4, (w.experts, w.hidden), dtype)
    return params


def make_tokens(case: Case, dtype=jnp.bfloat16):
    """(x [T, H], topk_idx [T, k] int32, topk_weight [T, k] float32) of a case, from its seed."""
    return _tokens(jax.random.key(case.seed), case.tokens, case.workload, jnp.dtype(dtype))


@functools.partial(jax.jit, static_argnums=(1, 2, 3))  # one compile per case, not one per op
def _tokens(key, tokens: int, w: Workload, dtype):
    kx, kl = jax.random.split(key)
    x = jax.random.normal(kx, (tokens, w.hidden), dtype)
    logits = jax.random.normal(kl, (tokens, w.experts), jnp.float32)
    topk_idx, topk_weight, _ = route(
        logits, w.top_k, method=w.router, renormalize=w.router == "softmax_topk"
    )
    return x, topk_idx, topk_weight


def hit_experts(topk_idx: jax.Array, num_experts: int) -> int:
    return int(jnp.sum(jnp.zeros((num_experts,), bool).at[topk_idx.reshape(-1)].set(True)))
