"""Random test inputs shared by the test files."""

import jax
import numpy as np
import pytest

from moe_pallas import dispatch

# The GPU tests at full workload shapes hold tens of GiB each and jax keeps a process's peak
# memory in its pool: under `pytest -n N --dist loadgroup` they share one worker, so one of them
# runs at a time while the other workers take the small tests.
FULL_SHAPES = pytest.mark.xdist_group("gpu_full_shapes")

# `dispatch.tile_schedule` jitted, as the kernels' wrappers trace it: eagerly, each call with new
# shapes compiled every op of it on its own (1.3 s a call on CPU, 0.2 s jitted).
tile_schedule = jax.jit(
    dispatch.tile_schedule, static_argnums=(1, 2), static_argnames=("tail", "align")
)


def make_params(rng, num_experts, hidden, inter, *, biases, scale=1.0, dtype=np.float32):
    """Expert params with O(1) activations (weights ~ N(0, scale^2 / fan_in))."""
    params = {
        "w_gate_up": scale
        * rng.standard_normal((num_experts, hidden, 2 * inter))
        / np.sqrt(hidden),
        "w_down": scale * rng.standard_normal((num_experts, inter, hidden)) / np.sqrt(inter),
    }
    if biases:
        params["b_gate_up"] = rng.standard_normal((num_experts, 2 * inter))
        params["b_down"] = rng.standard_normal((num_experts, hidden))
    return {k: v.astype(dtype) for k, v in params.items()}


def random_routing(rng, num_tokens, num_experts, top_k, *, skew=None):
    """Distinct expert ids per token and positive weights; `skew` draws ids Zipf-like."""
    p = None
    if skew is not None:
        p = 1.0 / np.arange(1, num_experts + 1) ** skew
        p /= p.sum()
    idx = np.stack([rng.choice(num_experts, top_k, replace=False, p=p) for _ in range(num_tokens)])
    w = rng.random((num_tokens, top_k)) + 0.1
    return idx.astype(np.int32), (w / w.sum(1, keepdims=True)).astype(np.float32)


def device_normal(rng, shape, dtype, scale=1.0):
    """N(0, scale^2) drawn on the default device (full-size expert weights in GPU tests would take
    a minute to draw in numpy float64 on the host), seeded from the numpy generator `rng`."""
    import jax
    import jax.numpy as jnp

    key = jax.random.key(int(rng.integers(2**31)))
    return (scale * jax.random.normal(key, shape, jnp.float32)).astype(dtype)


def device_expert_params(rng, experts, hidden, inter, dtype, bias_scales=None):
    """Expert weights drawn on the device (`device_normal`), N(0, 1 / fan_in); with bias_scales
    (gate_up's, down's) biases N(0, scale^2)."""
    params = {
        "w_gate_up": device_normal(rng, (experts, hidden, 2 * inter), dtype, hidden**-0.5),
        "w_down": device_normal(rng, (experts, inter, hidden), dtype, inter**-0.5),
    }
    if bias_scales is not None:
        params["b_gate_up"] = device_normal(rng, (experts, 2 * inter), dtype, bias_scales[0])
        params["b_down"] = device_normal(rng, (experts, hidden), dtype, bias_scales[1])
    return params


def random_bytes(key, shape) -> "jax.Array":
    """uint8 random bytes of `shape`, drawn one leading index at a time: jax.random.bits draws a
    32-bit word per uint8 element, 16 GiB of temporaries for a 4 GiB weight in one call, past an
    80 GB GPU beside the test's other buffers."""
    import jax
    import jax.numpy as jnp

    keys = jax.random.split(key, shape[0])
    draw = lambda k: jax.random.bits(k, shape[1:], jnp.uint8)
    return jax.jit(lambda keys: jax.lax.map(draw, keys))(keys)


def as_if_h200(monkeypatch, spy=None, device="NVIDIA H200"):
    """Make the "auto" policy decide as on an H200 (or `device`) while the kernels run in
    interpret mode: the tuning table read for that device and its backends available.
    `spy(name, op)` is called for every gmm/tgmm a Mosaic GPU or cuBLAS-slab backend then runs."""
    import dataclasses

    from moe_pallas import backends, tuning

    monkeypatch.setattr(tuning, "device_name", lambda: device)
    for name in ("mosaic_gpu", "cublas_slab"):
        backend = backends.get(name)
        ops = {}
        for op in ("gmm", "tgmm"):
            fn = getattr(backend, op)
            if spy is not None and fn is not None:
                ops[op] = lambda *a, _fn=fn, _op=op, _name=name, **kw: (
                    spy(_name, _op) or _fn(*a, **kw)
                )
        replaced = dataclasses.replace(backend, available=lambda: True, **ops)
        monkeypatch.setitem(backends.REGISTRY, name, replaced)


def merge_gate_up(gate, up, activation):
    """Inverse of `activations.split_gate_up`: (gate, up) as `[..., 2I]` in the layout of
    `activation`."""
    import jax.numpy as jnp

    if activation == "gptoss":
        return jnp.stack([gate, up], axis=-1).reshape(*gate.shape[:-1], 2 * gate.shape[-1])
    return jnp.concatenate([gate, up], axis=-1)
