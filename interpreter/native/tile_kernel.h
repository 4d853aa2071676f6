/* The parts of mlxgraph's blocked matrix product that its two users share: the router's
 * float32 product (tile_gemm.c) and the product of a packed quantized weight dequantized a
 * tile at a time (quantized_tile.h). They are the k blocking, the passes of rows of X and
 * their packing into panels, the 32 x 12 micro-kernel, and the write of a finished tile.
 * Both products cut k the same way and run every k block through the same micro-kernel, so
 * each output is the same chain of fused multiply-adds in the same order: the quantized
 * product equals tile_gemm on the dequantized weight bit for bit (tests/test_quantized_tile.py).
 *
 * Valid C and C++ (each user is a different extension, the router's C library and the
 * quantized kernels' C++ module, so each builds its own copy); every function is static.
 * x86-64 with AVX-512F only, checked at run time: callers ask tile_kernel_available(). */
#ifndef MLXGRAPH_TILE_KERNEL_H
#define MLXGRAPH_TILE_KERNEL_H

#if defined(__x86_64__)
#include <immintrin.h>
#define TILE_HAVE_KERNEL 1
#define TILE_AVX512 __attribute__((target("avx512f")))
#else
#define TILE_HAVE_KERNEL 0
#endif

#define TILE_MR 32        /* rows of X per panel (two vectors) */
#define TILE_NR 12        /* columns of C (rows of W) per tile */
#define TILE_KC_MAX 1024  /* depth of a k block: 2048 and 4096 measured 10-30% slower */
#define TILE_MC 128       /* rows of X per pass (96 and 256 measured no faster) */
#define TILE_INLINE static inline __attribute__((always_inline))

static inline int tile_kernel_available(void) {
#if TILE_HAVE_KERNEL
    return __builtin_cpu_supports("avx512f");
#else
    return 0;
#endif
}

#if TILE_HAVE_KERNEL

/* How W(n, k) lies: rows along k (x @ W.T: w_k == 1) or along n (x @ W: w_n == 1). */
enum { W_ALONG_K, W_ALONG_N };

/* One tile: acc[j] (+)= sum over kc of X panel (vecs vectors of 16 rows) times W(n0 + j, k).
 * vecs and layout are constants at every call (the kernel is specialised per pair). */
TILE_AVX512 TILE_INLINE void tile_kernel(const int vecs, const int layout, int kc, int nr,
                                         const float *xp, const float *w, long w_n, long w_k,
                                         float *tile, int accumulate, int prefetch) {
    __m512 c0[TILE_NR], c1[TILE_NR];
    for (int j = 0; j < TILE_NR; j++) {
        c0[j] = accumulate ? _mm512_load_ps(tile + TILE_MR * j) : _mm512_setzero_ps();
        c1[j] = accumulate && vecs == 2 ? _mm512_load_ps(tile + TILE_MR * j + 16)
                                        : _mm512_setzero_ps();
    }
#define FMA2(j, value)                                                   \
    do {                                                                 \
        __m512 b_ = _mm512_set1_ps(value);                               \
        c0[j] = _mm512_fmadd_ps(a0, b_, c0[j]);                          \
        if (vecs == 2) c1[j] = _mm512_fmadd_ps(a1, b_, c1[j]);           \
    } while (0)
#define ALL12(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) M(10) M(11)
    if (nr == TILE_NR && layout == W_ALONG_K) {
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
            __m512 a0 = _mm512_load_ps(xp + TILE_MR * k);
            __m512 a1 = vecs == 2 ? _mm512_load_ps(xp + TILE_MR * k + 16) : a0;
#define STEP(j) FMA2(j, w##j[k]);
            ALL12(STEP)
#undef STEP
        }
    } else if (nr == TILE_NR && layout == W_ALONG_N) {
        for (int k = 0; k < kc; k++) {
            const float *wk = w + k * w_k;
            __m512 a0 = _mm512_load_ps(xp + TILE_MR * k);
            __m512 a1 = vecs == 2 ? _mm512_load_ps(xp + TILE_MR * k + 16) : a0;
#define STEP(j) FMA2(j, wk[j]);
            ALL12(STEP)
#undef STEP
        }
    } else {   /* the last few columns of C: rare, so plainly */
        for (int k = 0; k < kc; k++) {
            __m512 a0 = _mm512_load_ps(xp + TILE_MR * k);
            __m512 a1 = vecs == 2 ? _mm512_load_ps(xp + TILE_MR * k + 16) : a0;
            for (int j = 0; j < nr; j++) FMA2(j, w[j * w_n + k * w_k]);
        }
    }
#undef FMA2
#undef ALL12
    for (int j = 0; j < TILE_NR; j++) {
        _mm512_store_ps(tile + TILE_MR * j, c0[j]);
        if (vecs == 2) _mm512_store_ps(tile + TILE_MR * j + 16, c1[j]);
    }
}

#define TILE_KERNEL_FOR(vecs, layout)                                                         \
    TILE_AVX512 static void tile_kernel_##vecs##_##layout(                                    \
        int kc, int nr, const float *xp, const float *w, long w_n, long w_k, float *tile,     \
        int accumulate, int prefetch) {                                                       \
        tile_kernel(vecs, layout, kc, nr, xp, w, w_n, w_k, tile, accumulate, prefetch);       \
    }
TILE_KERNEL_FOR(1, W_ALONG_K)
TILE_KERNEL_FOR(2, W_ALONG_K)
TILE_KERNEL_FOR(1, W_ALONG_N)
TILE_KERNEL_FOR(2, W_ALONG_N)
#undef TILE_KERNEL_FOR

typedef void (*tile_kernel_fn)(int, int, const float *, const float *, long, long, float *,
                               int, int);
/* [layout][vecs - 1]: a panel of 16 rows or fewer runs one vector wide. */
static const tile_kernel_fn tile_kernels[2][2] = {
    {tile_kernel_1_W_ALONG_K, tile_kernel_2_W_ALONG_K},
    {tile_kernel_1_W_ALONG_N, tile_kernel_2_W_ALONG_N},
};

static inline int tile_min(int a, int b) { return a < b ? a : b; }

/* X of a product and how it is blocked: k blocks of kc (the last may be shorter), passes of
 * up to TILE_MC rows of X, each packed into panels of TILE_MR rows, [k block][panel][k][TILE_MR], in xp. */
struct tile_pass {
    int M, K, kblocks, kc;
    const float *x;
    long x_row, x_col;
    float *xp;
    int m0, mrows, panels;   /* the current pass */
};

/* X(i, k) = x[i * x_row + k * x_col], rows x depth, cut into equal k blocks of at most
 * TILE_KC_MAX (2816 -> 3 x 939, not 1024 + 1024 + 768). xp is the caller's, tile_xp_floats big. */
static inline void tile_blocking(struct tile_pass *j, int rows, int depth, const float *x,
                                 long x_row, long x_col) {
    j->M = rows, j->K = depth, j->x = x, j->x_row = x_row, j->x_col = x_col;
    j->kblocks = (depth + TILE_KC_MAX - 1) / TILE_KC_MAX;
    j->kc = (depth + j->kblocks - 1) / j->kblocks;
    j->xp = 0;
}

/* Panels of the largest pass. */
static inline int tile_max_panels(const struct tile_pass *j) {
    return (tile_min(j->M, TILE_MC) + TILE_MR - 1) / TILE_MR;
}

/* Floats of the packed X of a pass (64-byte aligned: the micro-kernel's loads are). */
static inline long tile_xp_floats(const struct tile_pass *j) {
    return (long)tile_max_panels(j) * TILE_MR * j->K;
}

/* Rows m0.. of X (up to TILE_MC) as the current pass. */
static inline void tile_begin_pass(struct tile_pass *j, int m0) {
    j->m0 = m0;
    j->mrows = tile_min(j->M - m0, TILE_MC);
    j->panels = (j->mrows + TILE_MR - 1) / TILE_MR;
}

static inline int tile_panel_rows(const struct tile_pass *j, int p) {
    return tile_min(j->mrows - p * TILE_MR, TILE_MR);
}

static inline int tile_block_depth(const struct tile_pass *j, int kb) {
    return tile_min(j->K - kb * j->kc, j->kc);
}

/* The packed panel p of k block kb of the current pass. */
static inline float *tile_packed(const struct tile_pass *j, int kb, int p) {
    return j->xp + (long)kb * j->kc * j->panels * TILE_MR + (long)p * TILE_MR * tile_block_depth(j, kb);
}

/* Rows [0, rows) of X over kc steps of k into xp[k * TILE_MR + r]; rows rows..TILE_MR-1 are zeros.
 * Sixteen k at a time, so the TILE_MR rows written stay in L1. */
static inline void tile_pack_panel(int rows, int kc, const float *x, long x_row, long x_col,
                                   float *xp) {
    for (int k0 = 0; k0 < kc; k0 += 16) {
        int k1 = tile_min(k0 + 16, kc);
        for (int r = 0; r < TILE_MR; r++) {
            if (r < rows) {
                const float *s = x + r * x_row;
                for (int k = k0; k < k1; k++) xp[k * TILE_MR + r] = s[k * x_col];
            } else {
                for (int k = k0; k < k1; k++) xp[k * TILE_MR + r] = 0.0f;
            }
        }
    }
}

/* Chunk c of packing the current pass (a pool.h job over panels * kblocks chunks; ctx is
 * the struct tile_pass). */
static inline void tile_pack_chunk(void *ctx, int c) {
    const struct tile_pass *j = (const struct tile_pass *)ctx;
    int p = c % j->panels, kb = c / j->panels;
    tile_pack_panel(tile_panel_rows(j, p), tile_block_depth(j, kb),
                    j->x + (long)(j->m0 + p * TILE_MR) * j->x_row + (long)kb * j->kc * j->x_col,
                    j->x_row, j->x_col, tile_packed(j, kb, p));
}

/* out(r, c) = alpha * tile[c * TILE_MR + r] (+ beta * out(r, c)) for r < rows, c < nr, with
 * out(r, c) = out[r * out_row + c * out_col]. beta == 0 never reads out. A row of out is a
 * column of the tile: one masked gather per row, not 12 scalar steps (those cost ~9% of
 * the product at k = 1024 and ~35% at k = 256). */
TILE_AVX512 static inline void tile_write(int rows, int nr, const float *tile, float *out,
                                          long out_row, long out_col, float alpha,
                                          float beta) {
    if (out_col == 1) {
        const __m512i across = _mm512_mullo_epi32(
            _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
            _mm512_set1_epi32(TILE_MR));
        const __mmask16 cols = (__mmask16)((1u << nr) - 1);
        const __m512 a = _mm512_set1_ps(alpha), b = _mm512_set1_ps(beta);
        for (int r = 0; r < rows; r++) {
            float *o = out + r * out_row;
            __m512 v = _mm512_mul_ps(
                a, _mm512_mask_i32gather_ps(_mm512_setzero_ps(), cols, across, tile + r, 4));
            if (beta != 0.0f) v = _mm512_fmadd_ps(b, _mm512_maskz_loadu_ps(cols, o), v);
            _mm512_mask_storeu_ps(o, cols, v);
        }
        return;
    }
    for (int r = 0; r < rows; r++) {
        float *o = out + r * out_row;
        for (int c = 0; c < nr; c++) {
            float v = alpha * tile[c * TILE_MR + r];
            float *d = o + c * out_col;
            *d = beta == 0.0f ? v : v + beta * *d;
        }
    }
}

#endif /* TILE_HAVE_KERNEL */

#endif
