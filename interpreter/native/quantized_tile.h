// mlxgraph's product of a prefill-sized float32 x and a packed quantized weight on the CPU:
// out = x @ W.T, with W dequantized a tile at a time and never whole.
//
// Why: dequantizing the whole weight (dequantize.h) and then multiplying writes W as
// float32 (4 or 8 times its packed size) and reads it back, per product: for a 128-token
// prefill of a small model that traffic was a third of the product's time.
//
// How: the router's blocked product (tile_kernel.h: k blocks of at most 1024, passes of 128
// rows of X packed into 32-row panels, the 32 x 12 micro-kernel), with one change: before a
// tile of 12 rows of W meets the pass's panels over a k block, its weights over that block
// are dequantized (dequantize.h's segments, the same fused multiply-add per weight) into a
// buffer of the thread's, ~48 KB, which stays in L2 while the panels read it. The k blocking
// and the micro-kernel are tile_gemm's, so every output is the same chain of fused
// multiply-adds over the same values: bit for bit what the router's tile_gemm gives on the
// dequantized weight (tests/test_quantized_tile.py). Columns go in chunks of whole tiles to
// the pool (matvec_common.h's, g_threads threads), whose helpers sleep at once after it, as
// the router's do after its products. x86-64 with AVX-512F (quantized_tile_available);
// included by quantized_matvec.cpp.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <new>
#include <stdexcept>
#include <vector>

#include "dequantize.h"
#include "matvec_common.h"
#include "tile_kernel.h"

namespace mlxgraph_native {

struct QuantizedTileProblem {
  const float* x;   // [m][w.k], rows contiguous
  PackedWeight w;
  float* out;       // [m][w.n]
  int m;
};

inline bool quantized_tile_available() { return tile_kernel_available() != 0; }

#if TILE_HAVE_KERNEL

struct QuantizedTileJob {
  tile_pass x;   // X, its blocking and the current pass (tile_kernel.h)
  const QuantizedTileProblem* p;
  SegmentFn segment;
  int chunk_cols;
  float* scratch;   // tiles between k blocks: [tile column][panel][TILE_NR][TILE_MR], or null
};

// Columns [c * chunk_cols, ...) of out for the current pass, every k block: the k block of
// each tile of TILE_NR rows of W dequantized, then every panel through the micro-kernel.
inline void quantized_tile_chunk(void* ctx, int c) {
  const auto& j = *static_cast<const QuantizedTileJob*>(ctx);
  const tile_pass& x = j.x;
  const PackedWeight& w = j.p->w;
  thread_local std::vector<float> wbuf, sbuf, bbuf;
  alignas(64) float local[TILE_NR * TILE_MR];
  const int n_lo = c * j.chunk_cols, n_hi = std::min(w.n, n_lo + j.chunk_cols);
  for (int kb = 0; kb < x.kblocks; ++kb) {
    const int kc = tile_block_depth(&x, kb), k0 = kb * x.kc, last = kb == x.kblocks - 1;
    // Segments start and end on SEGMENT boundaries, the block's kc (939 at k = 2816) need
    // not: the block's weights are those from k0 - lo on in each row of the buffer.
    const int lo = k0 / SEGMENT * SEGMENT;
    const int hi = std::min(w.k, (k0 + kc + SEGMENT - 1) / SEGMENT * SEGMENT);
    // One cache line more than a row: rows 4 KB apart would share L1 sets.
    const long stride = hi - lo + 16;
    wbuf.resize((size_t)TILE_NR * stride);
    for (int n0 = n_lo; n0 < n_hi; n0 += TILE_NR) {
      const int nr = std::min(n_hi - n0, TILE_NR);
      for (int r = 0; r < nr; ++r) {
        const float *s, *b;
        row_scales(w, n0 + r, sbuf, bbuf, &s, &b);
        j.segment(w, s, b, n0 + r, lo, hi, wbuf.data() + r * stride);
      }
      for (int p = 0; p < x.panels; ++p) {
        float* tile =
            j.scratch ? j.scratch + ((long)(n0 / TILE_NR) * x.panels + p) * TILE_NR * TILE_MR : local;
        const int vecs = tile_panel_rows(&x, p) > 16 ? 2 : 1;
        tile_kernels[W_ALONG_K][vecs - 1](kc, nr, tile_packed(&x, kb, p),
                                          wbuf.data() + (k0 - lo), stride, 1, tile, kb > 0,
                                          p == 0);
        if (last)
          tile_write(tile_panel_rows(&x, p), nr, tile,
                     j.p->out + (long)(x.m0 + p * TILE_MR) * w.n + n0, w.n, 1, 1.0f, 0.0f);
      }
    }
  }
}

// 64-byte aligned floats (the micro-kernel's loads of X and of tiles are aligned).
inline float* aligned_floats(long count) {
  const size_t bytes = (sizeof(float) * (size_t)count + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, bytes);
  if (!p) throw std::bad_alloc();
  return static_cast<float*>(p);
}

// out = x @ W.T. The caller checked quantized_tile_available() and the packed weight
// (check_packed: bits 4 or 8, whole 16-byte blocks per group) and k > 0.
inline void quantized_tile_product(const QuantizedTileProblem& p) {
  if (p.m == 0 || p.w.n == 0) return;
  QuantizedTileJob j{};
  tile_blocking(&j.x, p.m, p.w.k, p.x, p.w.k, 1);
  j.p = &p;
  j.segment = dequantize_segment();
  // Below ~1M multiply-adds a second thread does not pay for itself (the router's rule).
  const int threads = (long)p.m * p.w.n * p.w.k < (1L << 20) ? 1 : g_threads.load();
  const int tile_cols = (p.w.n + TILE_NR - 1) / TILE_NR;
  // Chunks of whole tiles, four per thread: a late helper holds a quarter of a share.
  const int chunks = threads > 1 ? 4 * threads : 1;
  j.chunk_cols = (tile_cols + chunks - 1) / chunks * TILE_NR;
  j.x.xp = aligned_floats(tile_xp_floats(&j.x));
  if (j.x.kblocks > 1) {
    try {
      j.scratch = aligned_floats((long)tile_cols * TILE_NR * tile_max_panels(&j.x) * TILE_MR);
    } catch (...) {
      std::free(j.x.xp);
      throw;
    }
  }
  for (int m0 = 0; m0 < p.m; m0 += TILE_MC) {
    tile_begin_pass(&j.x, m0);
    pool_run(tile_pack_chunk, &j.x, j.x.panels * j.x.kblocks, threads, POOL_SLEEP_AT_ONCE);
    pool_run(quantized_tile_chunk, &j, (p.w.n + j.chunk_cols - 1) / j.chunk_cols, threads,
             POOL_SLEEP_AT_ONCE);
  }
  std::free(j.x.xp);
  std::free(j.scratch);
}

#else  // no micro-kernel on this architecture: quantized_tile_available() is false

inline void quantized_tile_product(const QuantizedTileProblem&) {
  throw std::runtime_error("quantized_tile: needs x86-64 with AVX-512F");
}

#endif

}  // namespace mlxgraph_native
