"""Gated activations of the expert layer, shared by kernels, the XLA path and the reference.

Both take the gate_up projection `h[..., 2I]` split into `gate` and `up` halves of width I:
  - "swiglu": gate = h[..., :I], up = h[..., I:],   a = silu(gate) * up
  - "gptoss": gate = h[..., 0::2], up = h[..., 1::2] (interleaved columns),
              gate = min(gate, 7), up = clip(up, -7, 7), a = (up + 1) * gate * sigmoid(1.702 * gate)
"""

from typing import Literal

import jax
import jax.numpy as jnp

Activation = Literal["swiglu", "gptoss"]
ACTIVATIONS: tuple[str, ...] = ("swiglu", "gptoss")

GPTOSS_LIMIT = 7.0
GPTOSS_ALPHA = 1.702


def split_gate_up(h: jax.Array, activation: Activation) -> tuple[jax.Array, jax.Array]:
    """Split `h[..., 2I]` into (gate, up), each `[..., I]`, in the layout of `activation`."""
    if activation == "gptoss":
        return h[..., 0::2], h[..., 1::2]
    half = h.shape[-1] // 2
    return h[..., :half], h[..., half:]


def _clamp(x: jax.Array, low: float | None, high: float) -> jax.Array:
    """min(max(x, low), high) whose gradient is 1 on the closed interval [low, high], as
    torch.clamp's (gpt-oss's reference is PyTorch) and `glu_bwd`'s: jnp.minimum and jnp.clip
    split a tie's gradient, 0.5 at exactly ±7, which a bf16 h hits (hypothesis found one, T = 1)."""
    x = jnp.where(x > high, high, x)
    return x if low is None else jnp.where(x < low, low, x)


def glu(gate: jax.Array, up: jax.Array, activation: Activation) -> jax.Array:
    """The gated activation on already-split halves (works inside Pallas kernels too)."""
    if activation == "gptoss":
        gate = _clamp(gate, None, GPTOSS_LIMIT)
        up = _clamp(up, -GPTOSS_LIMIT, GPTOSS_LIMIT)
        return (up + 1) * gate * jax.nn.sigmoid(GPTOSS_ALPHA * gate)
    return jax.nn.silu(gate) * up


def glu_bwd(
    gate: jax.Array, up: jax.Array, d_out: jax.Array, activation: Activation
) -> tuple[jax.Array, jax.Array]:
    """(d_gate, d_up) of `glu` given the pre-activation halves and the output cotangent.

    The clamps pass no gradient where they bite, and all of it at exactly ±7 (matching jax.grad
    of `glu`, and torch.clamp).
    """
    if activation == "gptoss":
        gate_c = _clamp(gate, None, GPTOSS_LIMIT)
        up_c = _clamp(up, -GPTOSS_LIMIT, GPTOSS_LIMIT)
        sig = jax.nn.sigmoid(GPTOSS_ALPHA * gate_c)
        glu_gate = gate_c * sig
        d_glu_gate = sig + GPTOSS_ALPHA * gate_c * sig * (1 - sig)
        d_gate = jnp.where(gate <= GPTOSS_LIMIT, d_out * (up_c + 1) * d_glu_gate, 0)
        d_up = jnp.where(jnp.abs(up) <= GPTOSS_LIMIT, d_out * glu_gate, 0)
        return d_gate, d_up
    sig = jax.nn.sigmoid(gate)
    silu = gate * sig
    d_gate = d_out * up * (sig + silu * (1 - sig))
    d_up = d_out * silu
    return d_gate, d_up
