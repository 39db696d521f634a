"""Run-time validation of routing, for debugging: `with moe_pallas.debug_checks(): ...`.

Inside the context (at trace time: enable it before jit traces your step), `moe_experts` and
`ragged_dot` check their data on the device and raise, through `jax.debug.callback`, a ValueError
naming the argument when expert ids fall outside [0, E), routing weights or tokens are not finite,
group sizes are negative or do not sum to at most the row count, an mxfp4 weight claims
`small_scales` that its scales exceed, an fp8 weight's row padding up to the next multiple of
128 values (which Mosaic GPU's FP8-activation kernel reads, against zeros) is not finite, or a
dense weight that `fp8_training` quantises holds a NaN or an infinity.

Under `jit` JAX (0.11.2) does not re-raise an exception of a host callback: the step raises
`jax.errors.JaxRuntimeError` ("INTERNAL: CpuCallback error calling callback: ...", the
ValueError's traceback and message inside) after `jax.debug.callback` logs the traceback. When
that error leaves a `debug_checks()` block, the block raises the ValueError itself, chained to
it; a step traced inside the context and run outside it raises the JaxRuntimeError. (Only
`jax.experimental.checkify`, which needs the caller to wrap the step, raises a ValueError from
inside jit.) Outside it nothing is checked at
run time: out-of-range expert ids contribute zero, negative group sizes count as zero, a group-size
sum past the row count is cut there, NaN propagates (docs/reliability.md).
"""

import contextlib
import threading

import jax
import jax.numpy as jnp
import numpy as np

from moe_pallas.quant import MX_SMALL_CODE, non_finite_counts

_state = threading.local()
# The last check that failed, read by `debug_checks` when the step's JaxRuntimeError leaves it.
# Callbacks run on XLA's threads, so this is module-wide rather than thread-local.
_failed: list[ValueError] = []


def enabled() -> bool:
    return getattr(_state, "on", False)


@contextlib.contextmanager
def debug_checks(enable: bool = True):
    """Turn run-time routing checks on (or off) for code traced inside this context."""
    previous = enabled()
    _state.on = enable
    try:
        yield
    except jax.errors.JaxRuntimeError as wrapped:
        failed = next((e for e in _failed if str(e) in str(wrapped)), None)
        if failed is None:
            raise
        raise ValueError(str(failed)) from wrapped
    finally:
        _state.on = previous
        _failed.clear()


def _raise_if(bad: bool, message: str) -> None:
    if bad:
        error = ValueError(message)
        _failed[:] = [error]
        raise error


def check_routing(x, topk_idx, topk_weight, num_experts: int) -> None:
    """Device-side checks of one `moe_experts` call (no-op unless `debug_checks` is on)."""
    if not enabled():
        return

    def host_check(x, topk_idx, topk_weight):
        topk_idx = np.asarray(topk_idx)
        bad = (topk_idx < 0) | (topk_idx >= num_experts)
        _raise_if(
            bad.any(),
            f"topk_idx holds {int(bad.sum())} expert ids outside [0, {num_experts}), e.g. "
            f"{int(topk_idx[bad][0]) if bad.any() else 0}; fix the router or num_experts.",
        )
        _raise_if(
            not np.isfinite(np.asarray(topk_weight, np.float32)).all(),
            "topk_weight holds NaN or Inf; check the router logits.",
        )
        _raise_if(
            not np.isfinite(np.asarray(x, np.float32)).all(),
            "x holds NaN or Inf; check the layer input.",
        )

    jax.debug.callback(host_check, x, topk_idx, topk_weight)


def check_group_sizes(group_sizes, num_rows: int) -> None:
    """Device-side checks of `ragged_dot`/`tgmm` group sizes (no-op unless enabled)."""
    if not enabled():
        return

    def host_check(group_sizes):
        group_sizes = np.asarray(group_sizes)
        _raise_if(
            (group_sizes < 0).any(),
            f"group_sizes has negative entries: {group_sizes}; they must be row counts >= 0.",
        )
        total = int(group_sizes.astype(np.int64).sum())
        _raise_if(
            total > num_rows,
            f"group_sizes sums to {total} > {num_rows} rows of lhs; the sizes must count the "
            "rows of lhs, in order.",
        )

    jax.debug.callback(host_check, group_sizes)


def check_weight(name: str, w) -> None:
    """The device-side checks of a stored expert weight (`check_scale_bound`,
    `check_row_padding`; no-op unless enabled)."""
    check_scale_bound(name, w)
    check_row_padding(name, w)


def check_quantisable(name: str, w) -> None:
    """Device-side check that a dense weight quantised at each call (`fp8_training`) is finite: a
    NaN or an infinity sets its 128 x 128 block's scale and spoils the block (no-op unless
    enabled)."""
    if not enabled():
        return

    def host_check(per_expert):
        per_expert = np.asarray(per_expert)
        _raise_if(
            per_expert.any(),
            f"{name} holds {int(per_expert.sum())} NaN or infinite value(s), the first in expert "
            f"{int(np.flatnonzero(per_expert)[0]) if per_expert.any() else 0}; fp8_training "
            "would spread each over its 128 x 128 block. Fix those weights first.",
        )

    jax.debug.callback(host_check, non_finite_counts(w))


def check_scale_bound(name: str, w) -> None:
    """Device-side check that a `QuantizedWeight` claiming `small_scales` has no scale code above
    `quant.MX_SMALL_CODE` (no-op unless enabled, or for other weights)."""
    if not enabled() or not getattr(w, "small_scales", False):
        return

    def host_check(scales):
        top = int(np.max(scales)) if scales.size else 0
        _raise_if(
            top > MX_SMALL_CODE,
            f"{name} has small_scales=True but scale codes up to {top} > {MX_SMALL_CODE}; build "
            "it with small_scales=False, or through moe_pallas.quant.with_scale_bound.",
        )

    jax.debug.callback(host_check, w.scales)


def check_row_padding(name: str, w) -> None:
    """Device-side check that a padded fp8 `QuantizedWeight`'s row padding up to the next multiple
    of 128 values is finite: `kernels.gmm_fp8_mgpu` reads it on a K tail's last step, times x's
    zeros (`quant.with_row_pitch` writes zeros). No-op unless enabled, or for unpadded weights."""
    k = getattr(w, "k", None)
    if not enabled() or k is None:
        return
    end = min(-(-k // 128) * 128, w.values.shape[2])
    if end == k:
        return

    def host_check(finite):
        _raise_if(
            not bool(finite),
            f"{name}'s row padding (values [:, :, {k}:{end}]) holds NaN; pad the rows with "
            "zeros (moe_pallas.quant.with_row_pitch).",
        )

    jax.debug.callback(host_check, jnp.isfinite(w.values[:, :, k:end]).all())
