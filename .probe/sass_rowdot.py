"""benchmarks.sass with gmm_quant.ROW_DOT set (--row-dot R) and the byte-pair view forced (--paired)."""
import sys
from moe_pallas.kernels import gmm_quant as gq
from benchmarks import sass
if __name__ == "__main__":
    argv = sys.argv[1:]
    if "--paired" in argv:
        argv.remove("--paired"); gq.PAIRED_MIN_ELEMENTS = 0
    if "--row-dot" in argv:
        i = argv.index("--row-dot"); gq.ROW_DOT = int(argv[i + 1]); del argv[i:i + 2]
    sys.exit(sass.main(argv))
