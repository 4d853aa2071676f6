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
 * x86-64 with AVX-512F only (checked at run time); elsewhere the router keeps the BLAS. */
#include "tile_gemm.h"

#include "pool.h"

#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#define HAVE_KERNEL 1
#define AVX512 __attribute__((target("avx512f")))
#else
#define HAVE_KERNEL 0
#endif

#define MR 32        /* rows of X per panel (two vectors) */
#define NR 12        /* columns of C (rows of W) per tile */
#define KC_MAX 1024  /* depth of a k block: 2048 and 4096 measured 10-30% slower */
#define MC 128       /* rows of X per pass (96 and 256 measured no faster) */
#define INLINE static inline __attribute__((always_inline))

int tile_gemm_available(void) {
#if HAVE_KERNEL
    return __builtin_cpu_supports("avx512f");
#else
    return 0;
#endif
}

#if HAVE_KERNEL

/* How W(n, k) lies: rows along k (x @ W.T: w_k == 1) or along n (x @ W: w_n == 1). */
enum { W_ALONG_K, W_ALONG_N };

struct job {
    int M, N, K, kblocks, kc, layout, chunk_cols;
    float alpha, beta;
    const float *x, *w;
    long x_row, x_col, w_n, w_k, out_row, out_col;
    float *out;
    float *xp;        /* packed X of the current pass: [k block][panel][k][MR] */
    float *scratch;   /* tiles between k blocks: [tile column][panel][NR][MR], or NULL */
    int m0, mrows, panels;   /* the current pass */
};

/* One tile: acc[j] (+)= sum over kc of X panel (vecs vectors of 16 rows) times W(n0 + j, k).
 * vecs and layout are constants at every call (the kernel is specialised per pair). */
AVX512 INLINE void kernel(const int vecs, const int layout, int kc, int nr, const float *xp,
                          const float *w, long w_n, long w_k, float *tile, int accumulate,
                          int prefetch) {
    __m512 c0[NR], c1[NR];
    for (int j = 0; j < NR; j++) {
        c0[j] = accumulate ? _mm512_load_ps(tile + MR * j) : _mm512_setzero_ps();
        c1[j] = accumulate && vecs == 2 ? _mm512_load_ps(tile + MR * j + 16)
                                        : _mm512_setzero_ps();
    }
#define FMA2(j, value)                                                   \
    do {                                                                 \
        __m512 b_ = _mm512_set1_ps(value);                               \
        c0[j] = _mm512_fmadd_ps(a0, b_, c0[j]);                          \
        if (vecs == 2) c1[j] = _mm512_fmadd_ps(a1, b_, c1[j]);           \
    } while (0)
#define ALL12(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) M(10) M(11)
    if (nr == NR && layout == W_ALONG_K) {
        /* Twelve row pointers: the compiler keeps each in a register. */
#define ROW(j) const float *w##j = w + (j) * w_n;
        ALL12(ROW)
#undef ROW
        for (int k = 0; k < kc; k++) {
            if (prefetch && (k & 15) == 0) {   /* one cache line of each row, 4 ahead */
#define PF(j) _mm_prefetch((const char *)(w##j + k + 64), _MM_HINT_T0);
                ALL12(PF)
#undef PF
            }
            __m512 a0 = _mm512_load_ps(xp + MR * k);
            __m512 a1 = vecs == 2 ? _mm512_load_ps(xp + MR * k + 16) : a0;
#define STEP(j) FMA2(j, w##j[k]);
            ALL12(STEP)
#undef STEP
        }
    } else if (nr == NR && layout == W_ALONG_N) {
        for (int k = 0; k < kc; k++) {
            const float *wk = w + k * w_k;
            __m512 a0 = _mm512_load_ps(xp + MR * k);
            __m512 a1 = vecs == 2 ? _mm512_load_ps(xp + MR * k + 16) : a0;
#define STEP(j) FMA2(j, wk[j]);
            ALL12(STEP)
#undef STEP
        }
    } else {   /* the last few columns of C: rare, so plainly */
        for (int k = 0; k < kc; k++) {
            __m512 a0 = _mm512_load_ps(xp + MR * k);
            __m512 a1 = vecs == 2 ? _mm512_load_ps(xp + MR * k + 16) : a0;
            for (int j = 0; j < nr; j++) FMA2(j, w[j * w_n + k * w_k]);
        }
    }
#undef FMA2
#undef ALL12
    for (int j = 0; j < NR; j++) {
        _mm512_store_ps(tile + MR * j, c0[j]);
        if (vecs == 2) _mm512_store_ps(tile + MR * j + 16, c1[j]);
    }
}

#define KERNEL_FOR(vecs, layout)                                                            \
    AVX512 static void kernel_##vecs##_##layout(int kc, int nr, const float *xp,             \
                                                const float *w, long w_n, long w_k,          \
                                                float *tile, int accumulate, int prefetch) { \
        kernel(vecs, layout, kc, nr, xp, w, w_n, w_k, tile, accumulate, prefetch);           \
    }
KERNEL_FOR(1, W_ALONG_K)
KERNEL_FOR(2, W_ALONG_K)
KERNEL_FOR(1, W_ALONG_N)
KERNEL_FOR(2, W_ALONG_N)
#undef KERNEL_FOR

typedef void (*kernel_fn)(int, int, const float *, const float *, long, long, float *, int,
                          int);
static const kernel_fn kernels[2][2] = {
    {kernel_1_W_ALONG_K, kernel_2_W_ALONG_K},
    {kernel_1_W_ALONG_N, kernel_2_W_ALONG_N},
};

static int min_int(int a, int b) { return a < b ? a : b; }

/* Rows [0, rows) of X over kc steps of k into xp[k * MR + r]; rows rows..MR-1 are zeros.
 * Sixteen k at a time, so the MR rows written stay in L1. */
static void pack_panel(int rows, int kc, const float *x, long x_row, long x_col, float *xp) {
    for (int k0 = 0; k0 < kc; k0 += 16) {
        int k1 = min_int(k0 + 16, kc);
        for (int r = 0; r < MR; r++) {
            if (r < rows) {
                const float *s = x + r * x_row;
                for (int k = k0; k < k1; k++) xp[k * MR + r] = s[k * x_col];
            } else {
                for (int k = k0; k < k1; k++) xp[k * MR + r] = 0.0f;
            }
        }
    }
}

static int panel_rows(const struct job *j, int p) { return min_int(j->mrows - p * MR, MR); }

static int block_depth(const struct job *j, int kb) { return min_int(j->K - kb * j->kc, j->kc); }

/* The packed panel p of k block kb of the current pass. */
static float *packed(const struct job *j, int kb, int p) {
    return j->xp + (long)kb * j->kc * j->panels * MR + (long)p * MR * block_depth(j, kb);
}

static void pack_chunk(void *ctx, int c) {
    const struct job *j = ctx;
    int p = c % j->panels, kb = c / j->panels;
    pack_panel(panel_rows(j, p), block_depth(j, kb),
               j->x + (long)(j->m0 + p * MR) * j->x_row + (long)kb * j->kc * j->x_col,
               j->x_row, j->x_col, packed(j, kb, p));
}

/* C(m0 + p*MR + r, n0 + c) from a finished tile. beta == 0 never reads C. A row of C is
 * a column of the tile: one masked gather per row, not 12 scalar steps (those cost ~9% of
 * the product at k = 1024 and ~35% at k = 256). */
AVX512 static void write_tile(const struct job *j, int p, int n0, int nr, const float *tile) {
    int rows = panel_rows(j, p);
    if (j->out_col == 1) {
        const __m512i across = _mm512_mullo_epi32(
            _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
            _mm512_set1_epi32(MR));
        const __mmask16 cols = (__mmask16)((1u << nr) - 1);
        const __m512 alpha = _mm512_set1_ps(j->alpha), beta = _mm512_set1_ps(j->beta);
        for (int r = 0; r < rows; r++) {
            float *o = j->out + (long)(j->m0 + p * MR + r) * j->out_row + n0;
            __m512 v = _mm512_mul_ps(
                alpha, _mm512_mask_i32gather_ps(_mm512_setzero_ps(), cols, across, tile + r, 4));
            if (j->beta != 0.0f) v = _mm512_fmadd_ps(beta, _mm512_maskz_loadu_ps(cols, o), v);
            _mm512_mask_storeu_ps(o, cols, v);
        }
        return;
    }
    for (int r = 0; r < rows; r++) {
        float *o = j->out + (long)(j->m0 + p * MR + r) * j->out_row + (long)n0 * j->out_col;
        for (int c = 0; c < nr; c++) {
            float v = j->alpha * tile[c * MR + r];
            float *d = o + c * j->out_col;
            *d = j->beta == 0.0f ? v : v + j->beta * *d;
        }
    }
}

/* Columns [c * chunk_cols, ...) of C for the current pass, every k block. */
static void compute_chunk(void *ctx, int c) {
    const struct job *j = ctx;
    float local[NR * MR] __attribute__((aligned(64)));
    int n_lo = c * j->chunk_cols, n_hi = min_int(j->N, n_lo + j->chunk_cols);
    for (int kb = 0; kb < j->kblocks; kb++) {
        int kc = block_depth(j, kb), last = kb == j->kblocks - 1;
        for (int n0 = n_lo; n0 < n_hi; n0 += NR) {
            int nr = min_int(n_hi - n0, NR);
            const float *w = j->w + (long)n0 * j->w_n + (long)kb * j->kc * j->w_k;
            for (int p = 0; p < j->panels; p++) {
                float *tile = j->scratch ? j->scratch + ((long)(n0 / NR) * j->panels + p) * NR * MR
                                         : local;
                int vecs = panel_rows(j, p) > 16 ? 2 : 1;
                kernels[j->layout][vecs - 1](kc, nr, packed(j, kb, p), w, j->w_n, j->w_k, tile,
                                             kb > 0, p == 0);
                if (last) write_tile(j, p, n0, nr, tile);
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
    j.M = rows, j.N = cols, j.K = depth, j.alpha = alpha, j.beta = beta;
    j.x = x, j.w = w, j.x_row = x_row, j.x_col = x_col, j.w_n = w_n, j.w_k = w_k;
    j.out = out, j.out_row = out_row, j.out_col = out_col;
    j.layout = w_k == 1 ? W_ALONG_K : W_ALONG_N;
    /* Equal k blocks of at most KC_MAX (2816 -> 3 x 939, not 1024 + 1024 + 768). */
    j.kblocks = (depth + KC_MAX - 1) / KC_MAX;
    j.kc = (depth + j.kblocks - 1) / j.kblocks;
    int max_panels = (min_int(rows, MC) + MR - 1) / MR;
    int tile_cols = (cols + NR - 1) / NR;
    /* Chunks of whole tiles: one per thread would leave a late thread's share to the
     * caller whole; four each keep the caller's wait to about a quarter of a share. */
    int chunks = threads > 1 ? 4 * threads : 1;
    j.chunk_cols = (tile_cols + chunks - 1) / chunks * NR;
    j.xp = aligned_alloc(64, sizeof(float) * (size_t)max_panels * MR * (size_t)depth);
    if (j.kblocks > 1)
        j.scratch = aligned_alloc(64, sizeof(float) * (size_t)tile_cols * NR * max_panels * MR);
    if (!j.xp || (j.kblocks > 1 && !j.scratch)) {
        free(j.xp);
        free(j.scratch);
        return -1;
    }
    for (j.m0 = 0; j.m0 < rows; j.m0 += MC) {
        j.mrows = min_int(rows - j.m0, MC);
        j.panels = (j.mrows + MR - 1) / MR;
        pool_run(pack_chunk, &j, j.panels * j.kblocks, threads, POOL_SLEEP_AT_ONCE);
        pool_run(compute_chunk, &j, (cols + j.chunk_cols - 1) / j.chunk_cols, threads,
                 POOL_SLEEP_AT_ONCE);
    }
    free(j.xp);
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
