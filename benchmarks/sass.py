"""The instruction mix of a Triton gmm's K loop, on a machine without a GPU.

    python -m benchmarks.sass [--weights bf16|fp8|fp8_block|mxfp4] [--rows 16] [--block-n 64]
                              [--block-k 128] [--warps 4] [--stages 3] [--k 2880] [--n 2880]
                              [--activation swiglu|gptoss] [--experts 128] [--large-scales]
                              [--weights-first] [--fp8-activations] [--transposed] [--keep DIR]

The gmm (row scale, plain or with a GLU epilogue; `kernels.gmm` for bf16 weights,
`kernels.gmm_quant` for the stored formats; with --transposed the backward's product with wᵀ,
`kernels.gmm_quant_t` for the stored formats) at one tile config is lowered for an abstract H200
(`jax.sharding.use_abstract_mesh`, as `tests/test_lowering.py`), its Triton module captured from
Pallas's lowering, compiled by
upstream Triton (`pip install triton==3.6.0`, the GPU image's) for sm_90, and disassembled by the
nvdisasm Triton ships. The loop printed is the one with the most instructions (a backward
branch): the K loop. Per opcode (with its first modifier) its count, and the loop's total;
instructions of the quarter-rate conversion and special-function pipes (F2F, F2FP, I2F, F2I,
MUFU) are counted apart: an in-kernel weight decode is bound by them long before the memory; so
are local loads and stores (LDL, STL), the registers spilled. Then the program's registers and
shared memory, and how many programs an SM holds at once: a decode-sized grid of more programs
than the SMs hold runs in waves.

It shows where a kernel's issue slots go without a device (the fp8 decode's conversions in
docs/decisions.md); it is not a timing, and jaxlib's Triton (what runs on the GPU) can schedule
differently from upstream's.
"""

import argparse
import collections
import dataclasses
import re
import subprocess
import sys
import tempfile
from pathlib import Path

SM90_SHARED = 228 * 1024  # shared memory of one SM, bytes
SM90_RESERVED_SHARED = 1024  # the driver's reserve per resident program
SLOW_PIPE = ("F2F", "F2FP", "I2F", "F2I", "MUFU")
_LABEL = re.compile(r"^(\.L_x_\d+):")
_BRANCH = re.compile(r"BRA\s+`?\(?(\.L_x_\d+)")
_OPCODE = re.compile(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)(\.[A-Z0-9_]+)?")


def loop_mix(sass: str) -> collections.Counter:
    """Opcode counts (`OP.FIRST_MODIFIER`) of the longest loop in nvdisasm output: the lines
    from a label to the last backward branch to it."""
    lines = sass.splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := _LABEL.match(line))}
    best = None
    for i, line in enumerate(lines):
        m = _BRANCH.search(line)
        if m and labels.get(m.group(1), i) < i:
            start = labels[m.group(1)]
            if best is None or i - start > best[1] - best[0]:
                best = (start, i)
    if best is None:
        raise ValueError("no backward branch in the SASS: the kernel has no loop")
    counts = collections.Counter()
    for line in lines[best[0] : best[1] + 1]:
        if m := _OPCODE.search(line):
            counts[m.group(1) + (m.group(2) or "")] += 1
    return counts


@dataclasses.dataclass(frozen=True)
class Resources:
    """What one program of the kernel holds on an SM: registers a thread, shared memory bytes
    (Triton's dynamic allocation, its pipeline ring, plus the cubin's static), warps."""

    registers: int
    shared: int
    warps: int

    @property
    def programs_per_sm(self) -> int:
        """Programs resident on one sm_90 SM at once: the least of what its 64 Ki registers (a
        warp's allocated in units of 256), 228 KiB of shared memory (1 KiB of it reserved per
        program by the driver), 64 warps and 32 programs allow."""
        warp_registers = -(-self.registers * 32 // 256) * 256
        return min(
            65536 // (warp_registers * self.warps),
            SM90_SHARED // (self.shared + SM90_RESERVED_SHARED),
            64 // self.warps,
            32,
        )


def slow_pipe(counts: collections.Counter) -> int:
    return sum(n for op, n in counts.items() if op.split(".")[0] in SLOW_PIPE)


def spills(counts: collections.Counter) -> int:
    """Local-memory loads and stores (LDL, STL): registers spilled to the stack."""
    return sum(n for op, n in counts.items() if op.split(".")[0] in ("LDL", "STL"))


def triton_module(args) -> str:
    """The Triton IR (text) of the gmm call `args` describes, lowered for an abstract H200."""
    import jax
    import jax.numpy as jnp
    from jax._src.pallas.triton import pallas_call_registration
    from jax.sharding import AbstractDevice, AbstractMesh

    from moe_pallas import quant
    from moe_pallas.kernels.config import BlockConfig
    from moe_pallas.kernels.gmm import gmm
    from moe_pallas.kernels.gmm_quant import gmm_quant
    from moe_pallas.kernels.gmm_quant_t import gmm_quant_t

    sds = jax.ShapeDtypeStruct
    cfg = BlockConfig(
        block_m=args.rows,
        block_n=args.block_n,
        block_k=args.block_k,
        num_warps=args.warps,
        num_stages=args.stages,
        weights_first=args.weights_first,
    )
    e, k, n, m = args.experts, args.k, args.n, args.experts * 2 * args.rows
    lhs, sizes, scale = sds((m, k), jnp.bfloat16), sds((e,), jnp.int32), sds((m,), jnp.float32)
    act = args.activation
    if args.weights == "bf16":
        w = sds((e, k, n), jnp.bfloat16)
    else:  # the stored arrays' shapes, for E experts
        stored = quant.quantize_weight(jnp.zeros((1, k, n), jnp.bfloat16), args.weights)
        stored = dataclasses.replace(stored, small_scales=not args.large_scales)
        w = jax.tree.map(lambda a: sds((e, *a.shape[1:]), a.dtype), stored)
    if args.transposed:  # the backward's lhs [M, N] @ wᵀ, w [E, K, N]: a K loop over N
        lhs = sds((m, n), jnp.bfloat16)
        if args.weights == "bf16":
            fn = lambda lhs, sizes, w, scale: gmm(
                lhs, w, sizes, transpose_rhs=True, row_scale=scale, config=cfg
            )
        else:
            fn = lambda lhs, sizes, w, scale: gmm_quant_t(lhs, w, sizes, config=cfg)
    elif args.weights == "bf16":
        fn = lambda lhs, sizes, w, scale: gmm(
            lhs, w, sizes, row_scale=scale, activation=act, config=cfg
        )
    else:

        def fn(lhs, sizes, w, scale):
            lhs_scales = None
            if args.fp8_activations:  # as the pallas_triton backend calls it
                lhs, lhs_scales = quant.quantize_rows(lhs)
            return gmm_quant(
                lhs,
                w,
                sizes,
                row_scale=scale,
                activation=act,
                out_dtype=jnp.bfloat16,
                lhs_scales=lhs_scales,
                config=cfg,
            )

    modules = []
    lower = pallas_call_registration.lowering.lower_jaxpr_to_triton_module

    def capture(*a, **kw):
        result = lower(*a, **kw)
        modules.append(result.module.operation.get_asm(enable_debug_info=False))
        return result

    pallas_call_registration.lowering.lower_jaxpr_to_triton_module = capture
    h200 = AbstractMesh((1,), ("x",), abstract_device=AbstractDevice("NVIDIA H200", 132, "gpu"))
    try:
        with jax.sharding.use_abstract_mesh(h200):
            jax.jit(fn).trace(lhs, sizes, w, scale).lower(lowering_platforms=("cuda",))
    finally:
        pallas_call_registration.lowering.lower_jaxpr_to_triton_module = lower
    return modules[-1]


def compile_sass(ttir: str, warps: int, stages: int, keep: Path) -> tuple[str, Resources]:
    """Upstream Triton's sm_90 compile of `ttir`, disassembled, and what a program holds."""
    try:
        import triton
        from triton._C.libtriton import ir
        from triton.backends.compiler import GPUTarget
        from triton.compiler.compiler import make_backend
    except ImportError:
        sys.exit("benchmarks.sass needs upstream Triton: pip install triton==3.6.0")
    keep.mkdir(parents=True, exist_ok=True)
    (keep / "pallas.ttir").write_text(ttir)
    # Triton compiles an IR file from the stage after its own, so the TTIR passes (canonicalise,
    # combine dot + add into an accumulating dot, CSE, hoisting), which XLA runs on Pallas's
    # module, are run here first.
    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    options = backend.parse_options({"num_warps": warps, "num_stages": stages})
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    module = ir.parse_mlir_module(str(keep / "pallas.ttir"), context)
    module.context = context
    backend.make_ttir(module, {}, options, 90)
    (keep / "kernel.ttir").write_text(str(module))
    kernel = triton.compile(str(keep / "kernel.ttir"), target=target, options=options.__dict__)
    for name in ("ttgir", "ptx"):
        (keep / f"kernel.{name}").write_text(kernel.asm[name])
    (keep / "kernel.cubin").write_bytes(kernel.asm["cubin"])
    nvdisasm = Path(triton.__file__).parent / "backends/nvidia/bin/nvdisasm"
    sass = subprocess.run(
        [str(nvdisasm), "-c", str(keep / "kernel.cubin")],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    (keep / "kernel.sass").write_text(sass)
    usage = subprocess.run(
        [str(nvdisasm.parent / "cuobjdump"), "-res-usage", str(keep / "kernel.cubin")],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    registers = int(re.search(r"REG:(\d+)", usage).group(1))
    static_shared = int(re.search(r"SHARED:(\d+)", usage).group(1))
    return sass, Resources(registers, kernel.metadata.shared + static_shared, warps)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--weights", default="bf16", choices=["bf16", "fp8", "fp8_block", "mxfp4"])
    parser.add_argument("--rows", type=int, default=16, help="block_m: the tile's rows")
    parser.add_argument("--block-n", type=int, default=64, help="output columns of the tile")
    parser.add_argument(
        "--activation",
        choices=["swiglu", "gptoss"],
        help="the GLU epilogue (the tile then reads 2 x block-n weight columns)",
    )
    parser.add_argument("--block-k", type=int, default=128)
    parser.add_argument("--warps", type=int, default=4)
    parser.add_argument("--stages", type=int, default=3)
    parser.add_argument("--k", type=int, default=2880)
    parser.add_argument("--n", type=int, default=2880)
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument(
        "--weights-first",
        action="store_true",
        help="quantised weights: BlockConfig.weights_first (acc^T = w x^T on 64+-row tiles)",
    )
    parser.add_argument(
        "--fp8-activations",
        action="store_true",
        help="fp8/fp8_block weights: activations in e4m3 too, products on the FP8 tensor cores",
    )
    parser.add_argument(
        "--large-scales",
        action="store_true",
        help="mxfp4: the decode of scale codes above 128 (two multiplies a pair, not one)",
    )
    parser.add_argument(
        "--transposed",
        action="store_true",
        help="the backward's product with wᵀ (gmm_t; stored formats: kernels.gmm_quant_t): rows "
        "of N, output columns of K, block-n tiling K and block-k the N contraction",
    )
    parser.add_argument("--keep", type=Path, help="write the IR, PTX, cubin and SASS here")
    args = parser.parse_args(argv)
    if args.transposed and (args.activation or args.fp8_activations or args.weights_first):
        parser.error("--transposed takes no GLU, --fp8-activations or --weights-first")
    keep = args.keep or Path(tempfile.mkdtemp(prefix="moe_pallas_sass_"))
    sass, resources = compile_sass(triton_module(args), args.warps, args.stages, keep)
    counts = loop_mix(sass)
    columns = args.block_n * (2 if args.activation else 1)
    values = args.block_k * columns // (32 * args.warps)  # weight values a thread decodes
    kind = f"{args.activation} GLU gmm" if args.activation else "gmm"
    kind = "transposed gmm (gmm_t)" if args.transposed else kind
    print(
        f"K loop of the {args.weights} {kind}, {args.rows} x {columns} x {args.block_k} tile, "
        f"{args.warps} warps: {sum(counts.values())} instructions a thread, "
        f"{slow_pipe(counts)} on the conversion/SFU pipes, {spills(counts)} local loads/stores "
        f"(register spills), for {values} weight values"
    )
    print(
        f"{resources.registers} registers a thread, {resources.shared / 1024:.1f} KiB of shared "
        f"memory: {resources.programs_per_sm} programs an SM"
    )
    for op, count in counts.most_common():
        print(f"  {count:5d}  {op}")
    print(f"(IR, PTX and SASS in {keep})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
