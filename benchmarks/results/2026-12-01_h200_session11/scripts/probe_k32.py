"""Deeper, thinner rings for the weight-bandwidth-bound class (T = 2048, 64 rows per expert):
block_k 32 with 6-8 stages (half the shared memory per stage: two CTAs per SM, or more bytes in
flight), block_k 128 with 2-3 stages, against the table's entries. autotune_gmm.tune."""
import json, os, sys
from benchmarks import autotune_gmm as at
from moe_pallas.kernels import config as _config

C = at.C
T = _config._TABLE
gmm = [
    T[("gmm", "small")],
    C(128, 256, 32, 8, 8, 6, min_block_m=16),
    C(128, 256, 32, 8, 8, 8, min_block_m=16),
    C(128, 128, 32, 8, 4, 6, min_block_m=16),
    C(128, 128, 64, 8, 4, 4, min_block_m=16),
    C(128, 256, 128, 8, 8, 2, min_block_m=16),
    C(64, 256, 32, 8, 4, 6, min_block_m=16),
]
glu = [
    T[("gmm_glu", "small")],
    C(128, 128, 32, 8, 8, 6, min_block_m=64),
    C(128, 128, 32, 8, 8, 8, min_block_m=64),
    C(128, 64, 32, 8, 4, 6, min_block_m=64),
    C(128, 64, 64, 8, 4, 4, min_block_m=64),
    C(128, 128, 128, 8, 8, 2, min_block_m=64),
    C(128, 128, 32, 8, 8, 6, min_block_m=32),
]
gmm_t = [
    T[("gmm_t", "small")],
    C(128, 256, 32, 8, 8, 6),
    C(128, 256, 32, 8, 8, 8),
    C(128, 128, 32, 8, 4, 6),
    C(128, 256, 128, 8, 8, 2),
]
at.GMM_CANDIDATES["small"] = gmm
at.GLU_CANDIDATES["small"] = glu
orig = at._candidates
at._candidates = lambda kernel, cls, around=False: gmm_t if kernel == "gmm_t" else orig(kernel, cls, around)
table, log = at.tune(sys.argv[1].split(","), ["small"], ["gptoss", "swiglu256"])
for k in sys.argv[1].split(","):
    print("BEST", k, table[(k, "small")], flush=True)
json.dump(log, open(os.path.join(os.environ.get("OUT", "."), "k32.json"), "w"), indent=1)
