"""Backends: what computes each op, and the one `"auto"` policy every caller consults.

A backend (`Backend`, one module each, one `REGISTRY` entry) provides the ops of the expert block,
each with the contract of the Triton kernel of the same name (`moe_pallas.kernels`):

    gmm(lhs, rhs, group_sizes, *, lhs_row_index, transpose_rhs, bias, activation, row_scale,
        out_dtype)                                   out[m] = epilogue(lhs[src(m)] @ rhs[g(m)])
    tgmm(lhs, rhs, group_sizes, *, lhs_row_index, rhs_row_index, rhs_row_scale, out_dtype,
         rhs_sums)                                   out[g] = Σ_{m in g} lhs[src(m)]ᵀ r(m)
    combine(rows, pair_row, *, out_dtype)            out[t] = Σ_j rows[pair_row[t, j]]
    glu_backward(h, g, row_weight, activation)       (dh, a, dw) of the GLU

or, like "xla", a whole `experts` block of its own. `supports(problem)` says which calls it takes
(dtypes, shapes), `auto_supports(problem)` which of those "auto" may give it, `available()` whether
the target device runs it compiled; each backend picks its own config for a call
(`moe_pallas.tuning`).

The policy. `implementation=` names a policy, resolved once per call by `resolve`:
- "pallas_triton", "xla": every op on that backend.
- "mosaic_gpu": every gmm and tgmm that wgmma takes (one 16-bit dtype) on Mosaic GPU, the others
  and the block's combine and GLU backward on Triton.
- "auto": off GPU "xla". On a GPU each op runs on the first backend of `AUTO_CANDIDATES[op]` that
  is available on the device, supports the call and has an entry for its (kernel, dtype, K, N,
  rows class) in the tuning table; else on "pallas_triton". On the H200 that is Mosaic GPU for
  the listed plain gmm shapes and gpt-oss's dx (gmm_t, K = 5760, N = 2880) at large batches,
  and "cublas_slab" (one batched cuBLAS matmul over capacity slabs) for 16-bit weight gradients
  at more than 16 rows per group.
Quantised weights (`moe_pallas.quant`): a gmm whose rhs is a `QuantizedWeight` carries its
`weight_format` (and `fp8_activations`) in the Problem; "pallas_triton" runs it
(`kernels.gmm_quant`, the weights converted on chip); "mosaic_gpu" takes the FP8-activation
products its FP8 x FP8 kernel tiles (`kernels.gmm_fp8_mgpu`: K, N and the stored rows multiples
of 64, plain or either GLU; fp8_block's GLU halves whole scale blocks), "auto" gives them to it
where the device's table has an entry for "mosaic_gpu" (`a8_kernel_name`) and, with its
default config, where Triton would multiply them in float16 (`fp8_past_triton_offsets`); every
other quantised call runs on "pallas_triton" on a GPU; "xla" (and so "auto" off GPU)
materialises the dense weight per call.
Products with a transposed quantised weight (the backward's dx and the GLU's input gradient) run
`kernels.gmm_quant_t` on "pallas_triton" where it takes them (every format, but fp8_block's
per-column scales and float32 lhs), and are dequantised per call otherwise (and every call on
"xla").
`ragged_dot`, `tgmm`, the fused expert block and the expert-parallel path all call `gmm`, `tgmm`
and `block_ops` below, so one policy decides for all of them.

Adding a backend: a module here defining `BACKEND = Backend(...)`, and its name in `REGISTRY` (and
in `AUTO_CANDIDATES` if "auto" may choose it, with tuning-table entries saying where).
"""

import dataclasses
import functools
from collections.abc import Callable
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp

from moe_pallas import quant, tuning
from moe_pallas.kernels import _common, gmm_quant, gmm_quant_t

Implementation = Literal["auto", "pallas_triton", "mosaic_gpu", "xla"]
IMPLEMENTATIONS: tuple[str, ...] = ("auto", "pallas_triton", "mosaic_gpu", "xla")


class Problem(NamedTuple):
    """One grouped-matmul call as the policy sees it (static facts only)."""

    kernel: str  # a `tuning.KERNELS` name: "gmm", "gmm_glu", "gmm_t" or "tgmm"
    dtypes: tuple  # operand dtypes (lhs, rhs)
    out_dtype: jnp.dtype
    k: int  # contraction size
    n: int  # output columns (a GLU's: half the weight columns)
    num_rows: int
    num_groups: int
    gather: bool  # lhs read through a row index
    fused_epilogue: bool  # bias or row scale in the epilogue
    weight_format: str | None = None  # a `quant.QuantizedWeight`'s fmt (gmm's rhs), else None
    fp8_activations: bool = False  # that weight's `fp8_activations` (e4m3 x e4m3 products)
    activation: str | None = None  # a GLU's activation ("gmm_glu")
    weight_elements: int = 0  # a QuantizedWeight's stored values (rhs), else 0

    @property
    def rows(self) -> str:
        return tuning.rows_class(self.num_rows, self.num_groups)

    @property
    def dtype(self):
        """The operands' dtype when they share one, else None."""
        first = jnp.dtype(self.dtypes[0])
        return first if all(jnp.dtype(d) == first for d in self.dtypes) else None


@dataclasses.dataclass(frozen=True)
class Backend:
    name: str
    gmm: Callable | None
    tgmm: Callable | None
    combine: Callable | None = None
    glu_backward: Callable | None = None
    experts: Callable | None = None  # a whole expert block (x, topk_idx, topk_weight, params, act)
    supports: Callable[[Problem], bool] = lambda problem: True
    # The calls "auto" may give it (default: those it supports): the tuning table's entries were
    # measured on these.
    auto_supports: Callable[[Problem], bool] | None = None
    available: Callable[[], bool] = lambda: True


def _registry() -> dict[str, Backend]:
    from moe_pallas.backends import cublas_slab, mosaic_gpu, pallas_triton, xla

    return {b.BACKEND.name: b.BACKEND for b in (pallas_triton, mosaic_gpu, cublas_slab, xla)}


REGISTRY: dict[str, Backend] = {}
# Backends "auto" may pick per op on a GPU, in order, before falling back to pallas_triton.
AUTO_CANDIDATES: dict[str, tuple[str, ...]] = {
    "gmm": ("mosaic_gpu",),
    "gmm_glu": ("mosaic_gpu",),
    "gmm_t": ("mosaic_gpu",),
    "tgmm": ("cublas_slab",),
}


def get(name: str) -> Backend:
    if not REGISTRY:
        REGISTRY.update(_registry())
    return REGISTRY[name]


def resolve(implementation: str) -> str:
    """Validate `implementation`; "auto" off GPU becomes "xla" (the Pallas kernels would run in
    interpret mode there), an explicit Pallas backend off GPU runs in interpret mode (tests)."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(
            f"implementation={implementation!r} is not one of {IMPLEMENTATIONS}; "
            'use "auto" to let the platform decide.'
        )
    if implementation == "auto" and jax.default_backend() != "gpu":
        return "xla"
    return implementation


def gmm_kernel_name(activation, transpose_rhs) -> str:
    return "gmm_glu" if activation else "gmm_t" if transpose_rhs else "gmm"


def select(policy: str, problem: Problem) -> Backend:
    """The backend that runs `problem` under a resolved policy (see the module docstring)."""
    if policy in ("pallas_triton", "xla"):
        return get(policy)
    if policy == "mosaic_gpu":
        mosaic = get("mosaic_gpu")
        return mosaic if mosaic.supports(problem) else get("pallas_triton")
    if policy != "auto":
        raise ValueError(f"select: {policy!r} is not a resolved policy (see resolve).")
    for name in AUTO_CANDIDATES[problem.kernel]:
        backend = get(name)
        takes = backend.auto_supports or backend.supports
        if backend.available() and takes(problem):
            kernel, dtype = table_key(problem)
            entry = tuning.lookup(
                name, kernel, dtype=dtype, k=problem.k, n=problem.n, rows=problem.rows
            )
            if entry is not None:  # (an entry's config may be empty)
                return backend
    if fp8_past_triton_offsets(problem):
        mosaic = get("mosaic_gpu")
        if mosaic.available() and mosaic.auto_supports(problem):
            return mosaic
    return get("pallas_triton")


def fp8_past_triton_offsets(problem: Problem) -> bool:
    """An FP8-activation product above decode sizes whose stored values pass int32 offsets: Triton
    reads those as byte pairs and multiplies in float16 (`kernels.gmm_quant`, Offsets), where
    Mosaic GPU's FP8 kernel addresses them by TMA and multiplies e4m3 on the FP8 tensor cores
    (FP8 training's dx on SwiGLU-256's wᵀ, [256, 4096, 4096]). A 16-bit output: a float32 one
    (FP8 training's g) goes to Mosaic GPU only where the table has its "gmm_a8_f32" entry."""
    return (
        problem.fp8_activations
        and problem.weight_elements >= gmm_quant.PAIRED_MIN_ELEMENTS
        and problem.rows != "tiny"
        and jnp.dtype(problem.out_dtype).itemsize == 2
    )


def table_key(problem: Problem) -> tuple[str, jnp.dtype]:
    """(kernel, dtype) of the problem's tuning-table entries: an FP8-activation product's are its
    own (`a8_kernel_name`, keyed by the stored float8_e4m3fn)."""
    if problem.fp8_activations:
        return a8_kernel_name(problem.kernel, problem.out_dtype), jnp.dtype(problem.dtypes[1])
    return problem.kernel, jnp.dtype(problem.dtype or problem.dtypes[0])


def a8_kernel_name(kernel: str, out_dtype) -> str:
    """An FP8-activation product's table name: "gmm_a8" / "gmm_glu_a8", and "gmm_a8_f32" for a
    float32 output (FP8 training's g, `moe_pallas.fused`), whose Mosaic GPU store buffer is twice
    a 16-bit output's, so that backend's configs for it are measured apart (Triton's configs for
    FP8-activation calls stay "gmm_a8" / "gmm_glu_a8": `backends.pallas_triton`)."""
    return f"{kernel}_a8" + ("_f32" if jnp.dtype(out_dtype).itemsize == 4 else "")


def gmm(
    policy: str,
    lhs: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    *,
    lhs_row_index: jax.Array | None = None,
    transpose_rhs: bool = False,
    bias: jax.Array | None = None,
    activation: str | None = None,
    row_scale: jax.Array | None = None,
    out_dtype=None,
) -> jax.Array:
    """`kernels.gmm.gmm`'s contract on the backend the policy selects for this call; rhs may be a
    `quant.QuantizedWeight` (transposed and not `gmm_quant_t.supports`: dequantised here, per
    call)."""
    out_dtype = jnp.dtype(out_dtype or lhs.dtype)
    weight_format = None
    if quant.is_quantized(rhs):
        # the backward's products with wᵀ (no epilogue) on the kernel that takes them, others on
        # a dense copy per call
        plain = bias is None and row_scale is None and activation is None
        if transpose_rhs and not (plain and gmm_quant_t.supports(rhs, lhs.dtype)):
            rhs = rhs.dequantize(lhs.dtype)
        else:
            weight_format = rhs.fmt
    n_dim = rhs.shape[1] if transpose_rhs else rhs.shape[2]
    problem = Problem(
        kernel=gmm_kernel_name(activation, transpose_rhs),
        dtypes=(lhs.dtype, rhs.values.dtype if weight_format else rhs.dtype),
        out_dtype=out_dtype,
        k=lhs.shape[1],
        n=n_dim // 2 if activation else n_dim,
        num_rows=lhs.shape[0] if lhs_row_index is None else lhs_row_index.shape[0],
        num_groups=rhs.shape[0],
        gather=lhs_row_index is not None,
        fused_epilogue=bias is not None or row_scale is not None,
        weight_format=weight_format,
        fp8_activations=weight_format is not None and rhs.fp8_activations and not transpose_rhs,
        activation=activation,
        weight_elements=rhs.values.size if weight_format else 0,
    )
    return select(policy, problem).gmm(
        lhs,
        rhs,
        group_sizes,
        lhs_row_index=lhs_row_index,
        transpose_rhs=transpose_rhs,
        bias=bias,
        activation=activation,
        row_scale=row_scale,
        out_dtype=out_dtype,
    )


def tgmm(
    policy: str,
    lhs: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    *,
    lhs_row_index: jax.Array | None = None,
    rhs_row_index: jax.Array | None = None,
    rhs_row_scale: jax.Array | None = None,
    out_dtype=None,
    rhs_sums: bool = False,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """`kernels.tgmm.tgmm`'s contract (rhs's rows r(m) gathered and scaled when rhs_row_index and
    rhs_row_scale are given; with rhs_sums also the `[G, N]` float32 per-group sums of r) on the
    backend the policy selects for this call."""
    out_dtype = jnp.dtype(out_dtype or jnp.promote_types(lhs.dtype, rhs.dtype))
    problem = Problem(
        kernel="tgmm",
        dtypes=(lhs.dtype, rhs.dtype),
        out_dtype=out_dtype,
        k=lhs.shape[1],
        n=rhs.shape[1],
        num_rows=rhs.shape[0] if rhs_row_index is None else rhs_row_index.shape[0],
        num_groups=group_sizes.shape[0],
        gather=lhs_row_index is not None,
        fused_epilogue=rhs_sums,
    )
    return select(policy, problem).tgmm(
        lhs,
        rhs,
        group_sizes,
        lhs_row_index=lhs_row_index,
        rhs_row_index=rhs_row_index,
        rhs_row_scale=rhs_row_scale,
        out_dtype=out_dtype,
        rhs_sums=rhs_sums,
    )


def scaled_rows(
    rows: jax.Array, row_index: jax.Array | None, row_scale: jax.Array | None
) -> jax.Array:
    """r(m) = row_scale[m] · rows[row_index[m]] in rows' dtype (`kernels._common.scale_rows`, as
    the kernels that gather and scale on chip round it): tgmm's rhs for a backend that reads its
    rhs as stored."""
    if row_index is not None:
        rows = rows[row_index]
    return rows if row_scale is None else _common.scale_rows(rows, row_scale)


def rhs_as_stored(tgmm: Callable) -> Callable:
    """A backend's tgmm that reads rhs as stored, given the contract's rhs_row_index and
    rhs_row_scale: the rows r(m) are materialised first (`scaled_rows`)."""

    @functools.wraps(tgmm)
    def wrapped(lhs, rhs, group_sizes, *, rhs_row_index=None, rhs_row_scale=None, **kwargs):
        rhs = scaled_rows(rhs, rhs_row_index, rhs_row_scale)
        return tgmm(lhs, rhs, group_sizes, **kwargs)

    return wrapped


def block_ops(policy: str) -> Backend:
    """The backend whose combine and GLU backward the fused block uses under `policy` (the
    kernels other than the matmuls have one implementation per kind: Triton, or xla's own)."""
    return get("xla" if policy == "xla" else "pallas_triton")
