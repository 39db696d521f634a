"""Row gather into a Mosaic GPU kernel's shared memory: tile[r, :] = src[row_index[r], k0:k0 + bk].

Why not TMA. Hopper's TMA copies boxes of consecutive rows (its gather mode, tile::gather4, is
Blackwell's). One [1, bk] TMA box per row does work (a (1, 64)-tiled view of the same swizzled
buffer), but on the H200 a matmul fed that way ran 8.7x slower than from an XLA-gathered copy:
each box is one 128-byte request and one barrier arrival per lane.

How. Each of the warpgroup's 128 threads copies 16-byte chunks with `cp.async` (Ampere's
per-thread asynchronous copy), eight consecutive threads per 128-byte row so a warp reads four
whole rows: chunk c of row r lands at byte 128·r + 16·(c XOR r mod 8) of the tile, the 128-byte
swizzle that wgmma reads (the tile is 128 bytes wide: bk = 64 16-bit values). A step's copies
form one cp.async commit group (`commit_group`); `wait_rows(n)` lets at most n younger groups
pend, then fences the generic-proxy writes for wgmma's async proxy and syncs the warpgroup.

Speed (H200, benchmarks/results/2026-12-02_h200_session16/). Exact (the same bits as the kernel
on a gathered copy) but slower: a 128 x 128 x 64 matmul at 257 TFLOP/s against 553 for an XLA
gather + TMA boxes (4 or 5 stages alike; 64-column tiles with 8 stages 137), and `gmm_mgpu` at
the layer's gate_up and dlhs shapes 1.1-2.1x the copy's time. So the layer keeps the copy
(`ops.gmm_on_backend`). In the probe's kernel, rows read in order instead of at random took
13-20% off, dropping the proxy fence 2-3%, and both together still left 1.7-1.8x the boxes' time;
a producer warpgroup issuing the copies (the wgmma warpgroup only waiting) ran as slow as one
warpgroup doing both. So the 16-byte cp.async path itself delivers rows at about half the rate of
TMA's bulk boxes.

Interpret mode (CPU) cannot run the inline Mosaic GPU code, so there `start_rows` copies each row
with a Pallas load and store, synchronously, and the group calls do nothing: the kernels' schedule
and ring logic are tested on CPU, the cp.async addressing by the `gpu` tests.
"""

import jax
from jax.experimental import pallas as pl
from jax.experimental.mosaic.gpu import utils as mgpu_utils
from jax.experimental.pallas import mosaic_gpu as plgpu
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import arith, llvm, memref, nvvm

from moe_pallas import _backend

ROW_BYTES = 128  # one row of the tile: the 128-byte swizzle's width
TRANSFORMS = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(ROW_BYTES))
_CHUNK = 16  # bytes per cp.async
_THREADS = 128  # one warpgroup


@plgpu.inline_mgpu(arg_types=(plgpu.RefType(), plgpu.RefType(), plgpu.RefType(TRANSFORMS)))
def _cp_async_rows(ctx, src_cols, row_index_smem, tile_smem):
    del ctx
    i8, i32, i64 = (ir.IntegerType.get_signless(w) for w in (8, 32, 64))
    c = mgpu_utils.c
    rows = ir.MemRefType(row_index_smem.type).shape[0]
    (row_stride, _), _ = ir.MemRefType(src_cols.type).get_strides_and_offset()
    itemsize = mgpu_utils.bitwidth(ir.MemRefType(src_cols.type).element_type) // 8
    src = llvm.addrspacecast(llvm.PointerType.get(address_space=1), mgpu_utils.memref_ptr(src_cols))
    dst = mgpu_utils.memref_ptr(tile_smem)
    thread = arith.remui(mgpu_utils.thread_idx(), c(_THREADS, i32))
    chunks_per_row = ROW_BYTES // _CHUNK
    for i in range(rows * chunks_per_row // _THREADS):
        chunk = arith.addi(thread, c(i * _THREADS, i32))
        row = arith.shrui(chunk, c(chunks_per_row.bit_length() - 1, i32))
        col = arith.andi(chunk, c(chunks_per_row - 1, i32))
        src_row = memref.load(row_index_smem, [arith.index_cast(ir.IndexType.get(), row)])
        src_off = arith.addi(
            arith.muli(arith.extui(i64, src_row), c(row_stride * itemsize, i64)),
            arith.extui(i64, arith.muli(col, c(_CHUNK, i32))),
        )
        swizzled = arith.xori(col, arith.andi(row, c(7, i32)))
        dst_off = arith.addi(
            arith.muli(row, c(ROW_BYTES, i32)), arith.muli(swizzled, c(_CHUNK, i32))
        )
        nvvm.cp_async_shared_global(
            mgpu_utils.getelementptr(dst, [dst_off], i8),
            mgpu_utils.getelementptr(src, [src_off], i8),
            _CHUNK,
            nvvm.LoadCacheModifierKind.CG,
        )


@plgpu.inline_mgpu()
def _commit_group(ctx):
    del ctx
    nvvm.cp_async_commit_group()


def start_rows(src_gmem, row_index_smem, tile_smem, k0):
    """Start copying rows row_index_smem[r] of src_gmem's columns [k0, k0 + bk) into tile_smem
    ([rows, bk], TRANSFORMS); `commit_group` closes the step's group."""
    rows, bk = tile_smem.shape
    if _backend.interpret_mode():

        def copy_row(r, carry):
            tile_smem[pl.ds(r, 1), :] = src_gmem[pl.ds(row_index_smem[r], 1), pl.ds(k0, bk)]
            return carry

        jax.lax.fori_loop(0, rows, copy_row, None)
        return
    _cp_async_rows(src_gmem.at[:, pl.ds(k0, bk)], row_index_smem, tile_smem)


def commit_group():
    """Close the copies started since the last group into one; a pipeline commits one per step,
    empty where it started none, so that `wait_rows` counts steps."""
    if not _backend.interpret_mode():
        _commit_group()


def wait_rows(pending: int):
    """Wait until at most `pending` younger commit groups are in flight, then make the landed rows
    visible to wgmma (proxy fence, warpgroup barrier)."""
    if not _backend.interpret_mode():

        @plgpu.inline_mgpu()
        def wait(ctx):
            del ctx
            nvvm.cp_async_wait_group(pending)

        wait()
    plgpu.commit_smem()


def fits(rows: int, bk: int, itemsize: int) -> bool:
    """Whether a [rows, bk] tile can be gathered: `ROW_BYTES`-wide rows, whole warpgroup passes."""
    return bk * itemsize == ROW_BYTES and (rows * ROW_BYTES // _CHUNK) % _THREADS == 0
