"""One pallas_call running the programs of several Pallas-Triton kernels interleaved, so that a
DRAM-write-bound kernel (tgmm) and a DRAM-read-bound one (gmm_t) share the SMs at once.
Each part: (kernel_fn(*in_refs, *out_refs), operands, out_shapes, grid). The kernel bodies read
their program ids through `pl.program_id`; the module attribute `pl` of each part's module is
swapped for a proxy while tracing, returning the part's decoded ids."""
import functools, types
import jax, jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu


def _split(b, p_a, p_b):
    """Evenly merge p_a programs of kind a with p_b of kind b: (is_b, index_a, index_b)."""
    total = p_a + p_b
    c = jax.lax.div((b + 1) * p_b, total)
    is_b = c > jax.lax.div(b * p_b, total)
    return is_b, b - c, c - 1


def _decode(lin, grid):
    ids, rest = [], lin
    for i, n in enumerate(grid):
        ids.append(rest if i == len(grid) - 1 else jax.lax.rem(rest, n))
        rest = jax.lax.div(rest, n)
    return ids


def multi_call(parts, *, num_warps, num_stages, interpret=False):
    """parts: list of (module, kernel_fn, operands, out_shapes (list), grid tuple)."""
    counts = [int(functools.reduce(lambda a, b: a * b, p[4], 1)) for p in parts]
    n_in = [len(p[2]) for p in parts]
    n_out = [len(p[3]) for p in parts]

    def kernel(*refs):
        ins = list(refs[: sum(n_in)])
        outs = list(refs[sum(n_in):])
        in_refs, out_refs = [], []
        for a, o in zip(n_in, n_out):
            in_refs.append(ins[:a]); ins = ins[a:]
            out_refs.append(outs[:o]); outs = outs[o:]
        b = pl.program_id(0)
        # nested split: part 0 vs the rest, then part 1 vs the rest of the rest, ...
        def run(i, lin):
            if i == len(parts) - 1:
                body(i, lin)
                return
            rest = sum(counts[i + 1:])
            is_rest, idx_i, idx_rest = _split(lin, counts[i], rest)
            pl.when(~is_rest)(lambda: body(i, idx_i))
            pl.when(is_rest)(lambda: run(i + 1, idx_rest))

        def body(i, lin):
            module, fn, _, _, grid = parts[i]
            ids = _decode(lin, grid)
            saved = module.pl
            proxy = types.SimpleNamespace(**{k: getattr(pl, k) for k in dir(pl) if not k.startswith("__")})
            proxy.program_id = lambda axis: ids[axis]
            module.pl = proxy
            try:
                fn(*in_refs[i], *out_refs[i])
            finally:
                module.pl = saved

        run(0, b)

    out_shape = [s for p in parts for s in p[3]]
    operands = [x for p in parts for x in p[2]]
    return pl.pallas_call(
        kernel,
        out_shape=out_shape,
        grid=(sum(counts),),
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        interpret=interpret,
        name="multi",
    )(*operands)
