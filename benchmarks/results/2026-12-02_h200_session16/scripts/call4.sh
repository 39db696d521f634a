# Session 16, call 4 (938f7a8): the Mosaic GPU layer (XLA-gathered copy again) and the remaining
# gather-vs-copy tests.
set -x
git log --oneline -1; git status --short | head
timeout 400 python3 -m pytest -m gpu -q tests/test_fused.py tests/test_kernels_gpu.py -k "mosaic_gpu_full or (row_gather and 256)" 2>&1 | tail -15 | tee $OUT/call4_tests.txt
