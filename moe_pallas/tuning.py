"""Tuning as data: the measured kernel configs and backend choices, read from `tuning.json`.

The table holds, per device name (`jax.Device.device_kind`, e.g. "NVIDIA H200"), entries keyed by
(backend, kernel, dtype, K, N, rows class):

    {"backend": "pallas_triton", "kernel": "gmm", "dtype": "*", "k": "*", "n": "*",
     "rows": "small", "config": {"block_m": 128, ...}}

- backend: "pallas_triton" (a `kernels.config.BlockConfig`), "mosaic_gpu" (a
  `kernels.gmm_mgpu.MosaicConfig`; its presence makes "auto" run that shape on Mosaic GPU) or
  "cublas_slab" (config {}; its presence makes "auto" compute that weight gradient as a batched
  cuBLAS matmul over capacity slabs).
- kernel: "gmm" (plain, or with the row gather, bias, row scale), "gmm_glu" (with a GLU epilogue:
  N counts output columns), "gmm_t" (rhs transposed), "tgmm"; "gmm_a8", "gmm_glu_a8": the
  forward's two with FP8 activations (`quant.QuantizedWeight.fp8_activations`: e4m3 x e4m3 on the
  FP8 tensor cores, whose tiles hold other registers than the decoding ones), a call without
  such an entry taking its format's "gmm" / "gmm_glu" one; "gmm_a8_f32": "gmm_a8" with a float32
  output (FP8 training's g), "mosaic_gpu" entries only.
- dtype: the operands' dtype name (a quantised weight's stored element type: "float8_e4m3fn",
  "float4_e2m1fn"), a list of names, or "*"; k, n: an int or "*".
- rows: the rows-per-group class of `rows_class`.

The most specific matching entry wins (exact dtype, K and N before "*"). The other backends'
entries are measured choices, so they apply only on the device they were measured on; a
"pallas_triton" problem the device's own entries do not cover (every problem, on a device the
table does not name) takes the `default_device`'s entry, so a device's table holds only what was
measured on it. The
`benchmarks/autotune_gmm.py` tuner writes entries with `write_entries`; nothing is tuned inside a
user's `jit`.
"""

import functools
import json
import pathlib
from typing import Any

import jax.numpy as jnp

from moe_pallas.kernels import _common

TABLE_PATH = pathlib.Path(__file__).with_name("tuning.json")
ROWS_CLASSES = ("tiny", "small", "large")
KERNELS = ("gmm", "gmm_glu", "gmm_t", "tgmm")
A8_KERNELS = ("gmm_a8", "gmm_glu_a8", "gmm_a8_f32")  # (module docstring) FP8-activation tiles


def rows_class(num_rows: int, num_groups: int) -> str:
    """ "tiny" (at most 16 rows per group: decode, weight-bandwidth bound), "small" (up to 128),
    "large" (compute bound)."""
    rows_per_group = num_rows / max(num_groups, 1)
    if rows_per_group <= 16:
        return "tiny"
    if rows_per_group <= 128:
        return "small"
    return "large"


@functools.cache
def _load(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def table(path: pathlib.Path | str | None = None) -> dict:
    """The parsed table (default `TABLE_PATH`; cached, `write_entries` clears the cache)."""
    return _load(str(path or TABLE_PATH))


def device_name() -> str | None:
    """The target GPU's device kind, or None off GPU (interpret mode)."""
    device = _common.target_device()
    return device.device_kind if device.platform == "gpu" else None


def _device_table(device: str | None, path=None) -> tuple[dict, bool]:
    """(the device's table, whether it is the device's own rather than the default's)."""
    devices = table(path)["devices"]
    if device in devices:
        return devices[device], True
    return devices[table(path)["default_device"]], False


def policy_sms(path=None) -> int:
    """SMs the policy spreads work over: the target GPU's, or off GPU the default device's, so
    that interpret mode picks the configs the default device would run."""
    if device_name() is not None:
        return _common.num_sms()
    return _device_table(None, path)[0]["num_sms"]


def _matches(entry: dict, dtype: str, k: int, n: int) -> tuple[int, int, int] | None:
    """Specificity (dtype, K, N exact: 1, wildcard: 0) of an entry that matches, else None."""
    want = entry["dtype"]
    names = [want] if isinstance(want, str) else list(want)
    if want != "*" and dtype not in names:
        return None
    for key, value in (("k", k), ("n", n)):
        if entry[key] != "*" and entry[key] != value:
            return None
    return (int(want != "*"), int(entry["k"] != "*"), int(entry["n"] != "*"))


def lookup(
    backend: str,
    kernel: str,
    *,
    dtype: Any,
    k: int,
    n: int,
    rows: str,
    device: str | None | type(...) = ...,
    path=None,
) -> dict | None:
    """The config of the most specific entry for this problem on `device` (default: the target
    GPU), or None if the table has none."""
    device = device_name() if device is ... else device
    device_table, own = _device_table(device, path)
    tables = [device_table] if own else []
    if backend == "pallas_triton":
        tables.append(_device_table(None, path)[0])
    for candidates in tables:
        best, best_rank = None, None
        for entry in candidates["entries"]:
            if (entry["backend"], entry["kernel"], entry["rows"]) != (backend, kernel, rows):
                continue
            rank = _matches(entry, jnp.dtype(dtype).name, k, n)
            if rank is not None and (best_rank is None or rank > best_rank):
                best, best_rank = entry, rank
        if best is not None:
            return dict(best["config"])
    return None


def _key(entry: dict) -> tuple:
    dtype = entry["dtype"] if isinstance(entry["dtype"], str) else tuple(entry["dtype"])
    return (entry["backend"], entry["kernel"], dtype, entry["k"], entry["n"], entry["rows"])


def write_entries(
    entries: list[dict], device: str, *, num_sms: int | None = None, path=None
) -> None:
    """Add `entries` to `device`'s table in the JSON file, replacing any with the same key
    (backend, kernel, dtype, k, n, rows); a new device needs `num_sms`."""
    path = pathlib.Path(path or TABLE_PATH)
    data = json.loads(path.read_text())
    devices = data["devices"]
    if device not in devices:
        if num_sms is None:
            raise ValueError(f"device {device!r} is new to {path}: pass num_sms.")
        devices[device] = {"num_sms": num_sms, "entries": []}
    for entry in entries:
        missing = {"backend", "kernel", "dtype", "k", "n", "rows", "config"} - set(entry)
        kernels = (*KERNELS, *A8_KERNELS)
        if missing or entry["kernel"] not in kernels or entry["rows"] not in ROWS_CLASSES:
            raise ValueError(f"tuning entry {entry} is malformed (missing {sorted(missing)}).")
    new_keys = {_key(e) for e in entries}
    kept = [e for e in devices[device]["entries"] if _key(e) not in new_keys]
    devices[device]["entries"] = kept + list(entries)
    path.write_text(dumps(data))
    _load.cache_clear()


def dumps(data: dict) -> str:
    """The table as JSON with one entry per line (diffs stay readable)."""
    lines = ["{", f'  "default_device": {json.dumps(data["default_device"])},', '  "devices": {']
    names = list(data["devices"])
    for i, name in enumerate(names):
        device = data["devices"][name]
        lines += [f"    {json.dumps(name)}: {{", f'      "num_sms": {device["num_sms"]},']
        lines.append('      "entries": [')
        body = [f"        {json.dumps(e)}" for e in device["entries"]]
        lines.append(",\n".join(body))
        lines += ["      ]", "    }" + ("," if i < len(names) - 1 else "")]
    lines += ["  }", "}"]
    return "\n".join(lines) + "\n"
