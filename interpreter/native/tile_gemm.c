/* mlxgraph's blocked matrix product for many rows: C = alpha * X W^T + beta * C.
 *
 * Why: OpenBLAS 0.3.x's SkylakeX sgemm runs the products of a 128-token prefill (MLX's
 * x @ W.T, 128 x 1024 x 1024 and the like) at ~90 GFLOP/s a core on this machine's Xeon,
 * where torch's MKL reaches ~140: prefill was ~1.2-1.5x slower than torch's for that alone.
 *
 * How: X (the tokens: few rows, used by every column) is packed into panels of 32 rows
 * laid out k-major ([k][32], so one k step of a panel is two vectors); W (the weight: large,
 * read once per 128 rows) is read where it lies, one broadcast per element, so it is never
 * copied. A 32 x 12 block of C lives in 24 vector registers over a block of up to 1024 k:
 * each k step is 2 loads and 12 broadcasts feeding 24 fused multiply-adds. The block is held
 * transposed (a vector is a column of C over 16 rows) and written to C when its last k block
 * is done; between k blocks it waits in a scratch buffer. Cache blocking: 128 rows of X per
 * pass (their packed k block, 512 KB at k = 1024, stays in L2); the 12 weight rows of a
 * tile (48 KB at k = 1024) serve the pass's 4 panels back to back, prefetched ahead on the
 * first. The last panel of a pass with 16 rows or fewer runs one vector wide.
 * Columns are split into chunks over threads (pool.c); X is packed by all of them first.
 * The blocking, packing, micro-kernel and tile write are tile_kernel.h's, shared with the
 * quantized weight's product (quantized_tile.h). x86-64 with AVX-512F only (checked at run time); elsewhere the router keeps the BLAS. */
#include "tile_gemm.h"

#include "pool.h"
#include "tile_kernel.h"

#include <stdlib.h>
#include <string.h>

int tile_gemm_available(void) { return tile_kernel_available(); }

#if TILE_HAVE_KERNEL

struct job {
    struct tile_pass x;   /* X, its blocking and the current pass (tile_kernel.h) */
    int N, layout, chunk_cols;
    float alpha, beta;
    const float *w;
    long w_n, w_k, out_row, out_col;
    float *out;
    float *scratch;   /* tiles between k blocks: [tile column][panel][TILE_NR][TILE_MR], or NULL */
};

/* Columns [c * chunk_cols, ...) of C for the current pass, every k block. */
static void compute_chunk(void *ctx, int c) {
    const struct job *j = ctx;
    const struct tile_pass *x = &j->x;
    float local[TILE_NR * TILE_MR] __attribute__((aligned(64)));
    int n_lo = c * j->chunk_cols, n_hi = tile_min(j->N, n_lo + j->chunk_cols);
    for (int kb = 0; kb < x->kblocks; kb++) {
        int kc = tile_block_depth(x, kb), last = kb == x->kblocks - 1;
        for (int n0 = n_lo; n0 < n_hi; n0 += TILE_NR) {
            int nr = tile_min(n_hi - n0, TILE_NR);
            const float *w = j->w + (long)n0 * j->w_n + (long)kb * x->kc * j->w_k;
            for (int p = 0; p < x->panels; p++) {
                float *tile = j->scratch ? j->scratch + ((long)(n0 / TILE_NR) * x->panels + p) * TILE_NR * TILE_MR
                                         : local;
                int vecs = tile_panel_rows(x, p) > 16 ? 2 : 1;
                tile_kernels[j->layout][vecs - 1](kc, nr, tile_packed(x, kb, p), w, j->w_n,
                                                  j->w_k, tile, kb > 0, p == 0);
                if (last)
                    tile_write(tile_panel_rows(x, p), nr, tile,
                               j->out + (long)(x->m0 + p * TILE_MR) * j->out_row + n0 * j->out_col,
                               j->out_row, j->out_col, j->alpha, j->beta);
            }
        }
    }
}

int tile_gemm(int rows, int cols, int depth, float alpha, const float *x, long x_row,
              long x_col, const float *w, long w_n, long w_k, float beta, float *out,
              long out_row, long out_col, int threads) {
    if (!tile_gemm_available() || rows <= 0 || cols <= 0 || depth <= 0 ||
        (w_k != 1 && w_n != 1))
        return -1;
    struct job j;
    memset(&j, 0, sizeof j);
    tile_blocking(&j.x, rows, depth, x, x_row, x_col);
    j.N = cols, j.alpha = alpha, j.beta = beta;
    j.w = w, j.w_n = w_n, j.w_k = w_k;
    j.out = out, j.out_row = out_row, j.out_col = out_col;
    j.layout = w_k == 1 ? W_ALONG_K : W_ALONG_N;
    int tile_cols = (cols + TILE_NR - 1) / TILE_NR;
    /* Chunks of whole tiles: one per thread would leave a late thread's share to the
     * caller whole; four each keep the caller's wait to about a quarter of a share. */
    int chunks = threads > 1 ? 4 * threads : 1;
    j.chunk_cols = (tile_cols + chunks - 1) / chunks * TILE_NR;
    j.x.xp = aligned_alloc(64, sizeof(float) * (size_t)tile_xp_floats(&j.x));
    if (j.x.kblocks > 1)
        j.scratch = aligned_alloc(64, sizeof(float) * (size_t)tile_cols * TILE_NR *
                                          tile_max_panels(&j.x) * TILE_MR);
    if (!j.x.xp || (j.x.kblocks > 1 && !j.scratch)) {
        free(j.x.xp);
        free(j.scratch);
        return -1;
    }
    for (int m0 = 0; m0 < rows; m0 += TILE_MC) {
        tile_begin_pass(&j.x, m0);
        pool_run(tile_pack_chunk, &j.x, j.x.panels * j.x.kblocks, threads, POOL_SLEEP_AT_ONCE);
        pool_run(compute_chunk, &j, (cols + j.chunk_cols - 1) / j.chunk_cols, threads,
                 POOL_SLEEP_AT_ONCE);
    }
    free(j.x.xp);
    free(j.scratch);
    return 0;
}

#else   /* no kernel on this architecture: the router keeps the BLAS */

int tile_gemm(int rows, int cols, int depth, float alpha, const float *x, long x_row,
              long x_col, const float *w, long w_n, long w_k, float beta, float *out,
              long out_row, long out_col, int threads) {
    (void)rows, (void)cols, (void)depth, (void)alpha, (void)x, (void)x_row, (void)x_col;
    (void)w, (void)w_n, (void)w_k, (void)beta, (void)out, (void)out_row, (void)out_col;
    (void)threads;
    return -1;
}

#endif
