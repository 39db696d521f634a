import sys
from moe_pallas.kernels import gmm_quant
if "--fold" in sys.argv:
    sys.argv.remove("--fold"); gmm_quant.MX_FOLD_MIN = 16
from benchmarks import sass
sys.exit(sass.main())
