"""Which Mosaic GPU gmm configs run at gpt-oss/SwiGLU T = 1 shapes, each in its own process (a
misaligned address kills the process). "0,0,0,0" is gmm_mgpu.default_config (code 6c77a73).
The comparison after the kernel called gmm.gmm, which is the function here, so a run that got past
the kernel failed with AttributeError: that outcome means the kernel ran."""
import subprocess, sys

CHILD = r'''
import sys, jax, jax.numpy as jnp
from moe_pallas.kernels import gmm_mgpu, gmm
bm, bn, bk, st = (int(v) for v in sys.argv[1].split(","))
kind = sys.argv[2]
cfg = None if bm == 0 else gmm_mgpu.MosaicConfig(bm, bn, bk, num_stages=st)
E, M = 128, 4
key = jax.random.key(0)
K, N = (2880, 5760) if kind.startswith("gu") else (2880, 2880)
if kind == "swiglu_gu": E, M, K, N = 256, 8, 4096, 4096
lhs = jax.random.normal(key, (M, K), jnp.bfloat16)
rhs = jax.random.normal(key, (E, K, N), jnp.bfloat16) * 0.02
sizes = jnp.zeros((E,), jnp.int32).at[jnp.array([3, 50, 77, 120])].set(M // 4)
kw = {}
if kind == "gu_glu": kw["activation"] = "gptoss"
if kind == "swiglu_gu": kw["activation"] = "swiglu"
if kind == "down": kw.update(bias=jax.random.normal(key, (E, N), jnp.bfloat16), row_scale=jnp.ones((M,), jnp.float32))
if cfg is None: print("default", gmm_mgpu.default_config(M, E, N // 2 if "activation" in kw else N, kw.get("activation")))
out = jax.block_until_ready(gmm_mgpu.gmm(lhs, rhs, sizes, config=cfg, **kw))
ref = gmm.gmm(lhs, rhs, sizes, **kw)
err = float(jnp.max(jnp.abs(out.astype(jnp.float32) - ref.astype(jnp.float32))) / (jnp.max(jnp.abs(ref.astype(jnp.float32))) + 1e-9))
print("OK", err)
'''
for cfg in sys.argv[1:]:
    for kind in ("down", "gu_plain", "gu_glu", "swiglu_gu"):
        p = subprocess.run([sys.executable, "-c", CHILD, cfg, kind], capture_output=True, text=True, timeout=120)
        lines = [l for l in (p.stdout + p.stderr).splitlines() if l.startswith(("OK", "default")) or "Error" in l][:3]
        print(cfg, kind, p.returncode, lines, flush=True)
