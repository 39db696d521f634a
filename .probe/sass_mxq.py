"""benchmarks.sass with gmm_quant.MX_QUARTERS on (--quarters)."""
import sys
from moe_pallas.kernels import gmm_quant as gq
from benchmarks import sass
if __name__ == "__main__":
    argv = sys.argv[1:]
    if "--quarters" in argv:
        argv.remove("--quarters"); gq.MX_QUARTERS = True
    sys.exit(sass.main(argv))
