"""Which gmm / gmm_glu configs win at 96-128 rows per expert (T = 4096 both workloads, and
T = 3011 gpt-oss)? autotune_gmm.tune with the small class's token count replaced."""
import json, os, sys
import dataclasses
from benchmarks import autotune_gmm as at

C = at.C
extra = [
    C(128, 256, 64, 8, 8, 4, min_block_m=32),
    C(128, 256, 64, 8, 8, 3, min_block_m=64),
    C(128, 256, 64, 4, 8, 4, min_block_m=64),
    C(128, 256, 64, 16, 8, 4, min_block_m=64),
    C(256, 128, 64, 8, 8, 3, min_block_m=64),
    C(128, 128, 64, 8, 8, 4, min_block_m=64),
]
at.GMM_CANDIDATES["small"] = [c for c in at.GMM_CANDIDATES["small"] if c.block_m >= 128] + extra
at.GLU_CANDIDATES["small"] = [dataclasses.replace(c, block_n=c.block_n // 2) for c in at.GMM_CANDIDATES["small"]]
tokens = int(sys.argv[1])
at.TOKENS["small"] = tokens
table, log = at.tune(sys.argv[2].split(","), ["small"], sys.argv[3].split(","))
print("TABLE gmm", table[("gmm", "small")], "glu", table[("gmm_glu", "small")])
json.dump(log, open(os.path.join(os.environ.get("OUT", "."), f"medium_{tokens}.json"), "w"), indent=1)
