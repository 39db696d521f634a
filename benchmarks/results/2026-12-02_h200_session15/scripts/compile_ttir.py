"""Session 15, CPU only: compile dump_ttir.py's IR with pip's triton 3.6.0 (not XLA's bundled Triton,
which is what runs on the GPU) for sm90, 8 warps, 4 stages; writes the TTGIR, LLVM IR and PTX."""
import sys, triton
from triton.backends.compiler import GPUTarget
for name in sys.argv[1:]:
    k = triton.compile(f"/tmp/ttir/{name}.ttir", target=GPUTarget("cuda", 90, 32), options={"num_warps": 8, "num_stages": 4})
    for ext in ("ttgir", "llir", "ptx"):
        if ext in k.asm:
            open(f"/tmp/ttir/{name}.{ext}", "w").write(k.asm[ext] if isinstance(k.asm[ext], str) else k.asm[ext].decode())
    print(name, "ok", list(k.asm.keys()), k.metadata.shared)
