/* mlxgraph's decode-sized float32 product: out = alpha * X W^T + beta * out for 1..8 rows of
 * X against a weight whose rows run along k (a Linear's weight as stored: x @ W.T, the LM
 * head included). A decode step streams every weight once, so this product is bound by
 * memory: it is written to keep up with it, in the style of the quantized kernel
 * (quantized_kernel.h):
 * - one row of X reads W a row at a time, one stream: on an EPYC thread ~19 GB/s against
 *   ~15 for 4 interleaved rows sharing each load of X (the arithmetic, one FMA per 16
 *   weights, hides behind the loads either way); 2 to 8 rows of X go in tiles of 2 rows of
 *   W, so the accumulators stay in registers (one 16-float vector per output);
 * - each row prefetches the same place of the row a tile below: a 1024-float row is one
 *   4 KiB page, where the hardware prefetcher stops, so without it every row begins with
 *   a miss;
 * - the rows of W go in chunks of whole tiles (~128K weights) to the pool's threads
 *   (pool.c), claimed one at a time, so a helper descheduled on a busy machine delays the
 *   product by one chunk at most.
 * Each output is one vector accumulator over k in blocks of 16 (an FMA each where the CPU
 * has them), a fixed horizontal sum, then the k % 16 tail: the same order for every tile,
 * chunk and thread count, and the order of the router's earlier few-row kernel. Runtime
 * dispatch: GCC target clones (AVX-512, AVX2, baseline) on x86-64. */
#include "matvec_f32.h"

#include "pool.h"

#include <stdlib.h>
#include <string.h>

#define VL 16            /* floats per vector */
#define TILE_MAX 2       /* rows of W per tile */
#define CHUNK_WEIGHTS (1L << 17)
typedef float vf __attribute__((vector_size(4 * VL)));
typedef float vf8 __attribute__((vector_size(32)));

#if defined(__x86_64__)
#define CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CLONES
#endif
#define INLINE static inline __attribute__((always_inline))

struct problem {
    int rows, cols, depth;
    float alpha, beta;
    const float *x, *w;
    long x_row, ldw, out_row, out_col;
    float *out;
    int per;   /* rows of W per chunk, a multiple of TILE_MAX */
};

INLINE vf load(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

INLINE float hsum(vf v) {
    vf8 lo, hi;
    memcpy(&lo, &v, sizeof lo);
    memcpy(&hi, (const char *)&v + sizeof lo, sizeof hi);
    lo += hi;
    return ((lo[0] + lo[4]) + (lo[1] + lo[5])) + ((lo[2] + lo[6]) + (lo[3] + lo[7]));
}

INLINE void put(const struct problem *p, int i, int n, float v) {
    float *o = p->out + i * p->out_row + n * p->out_col;
    *o = p->beta == 0.0f ? p->alpha * v : p->alpha * v + p->beta * *o;
}

/* Rows n..n+R-1 of W against the S rows of X (R and S constants once inlined, so the R x S
 * accumulators are registers). */
INLINE void tile(const struct problem *p, const int S, const int R, int n) {
    const int K = p->depth;
    const long ldx = p->x_row, ldw = p->ldw;
    const float *x = p->x, *w = p->w + n * ldw;
    vf s[TILE_MAX][MATVEC_ROWS_MAX];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int i = 0; i < S; i++) s[r][i] = (vf){0};
    int k = 0;
    for (; k + VL <= K; k += VL) {
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) __builtin_prefetch(w + (r + R) * ldw + k);
        vf a[TILE_MAX];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) a[r] = load(w + r * ldw + k);
#pragma GCC unroll 8
        for (int i = 0; i < S; i++) {
            vf xi = load(x + i * ldx + k);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) s[r][i] += xi * a[r];
        }
    }
    for (int r = 0; r < R; r++)
        for (int i = 0; i < S; i++) {
            float t = hsum(s[r][i]);
            for (int j = k; j < K; j++) t += x[i * ldx + j] * w[r * ldw + j];
            put(p, i, n + r, t);
        }
}

/* Rows n0..n1-1 of W: whole tiles, then the rows left one at a time (same sums). One row
 * of X (a decode step) reads W a row at a time: one stream reads faster than a tile's
 * interleaved rows (the small Llama's products per step 32 -> 26 ms on one EPYC thread). */
INLINE void part(const struct problem *p, const int S, int n0, int n1) {
    const int R = S == 1 ? 1 : 2;
    int n = n0;
    for (; n + R <= n1; n += R) tile(p, S, R, n);
    for (; n < n1; n++) tile(p, S, 1, n);
}

CLONES static void run_part(const struct problem *p, int n0, int n1) {
    switch (p->rows) {
        case 1: part(p, 1, n0, n1); break;
        case 2: part(p, 2, n0, n1); break;
        case 3: part(p, 3, n0, n1); break;
        case 4: part(p, 4, n0, n1); break;
        case 5: part(p, 5, n0, n1); break;
        case 6: part(p, 6, n0, n1); break;
        case 7: part(p, 7, n0, n1); break;
        case 8: part(p, 8, n0, n1); break;
    }
}

static void run_chunk(void *ctx, int c) {
    const struct problem *p = ctx;
    int n0 = c * p->per, n1 = n0 + p->per < p->cols ? n0 + p->per : p->cols;
    run_part(p, n0, n1);
}

int matvec_f32(int rows, int cols, int depth, float alpha, const float *x, long x_row,
               long x_col, const float *w, long ldw, float beta, float *out, long out_row,
               long out_col, int threads) {
    if (rows < 1 || rows > MATVEC_ROWS_MAX || cols < 1 || depth < 1) return -1;
    float *packed = NULL;
    if (x_col != 1) {   /* X's rows are read as vectors: pack them (a few KiB) */
        packed = malloc(sizeof(float) * (size_t)rows * (size_t)depth);
        if (!packed) return -1;
        for (int i = 0; i < rows; i++)
            for (int k = 0; k < depth; k++) packed[(long)i * depth + k] = x[i * x_row + k * x_col];
        x = packed;
        x_row = depth;
    }
    long per = CHUNK_WEIGHTS / depth;
    per = per < 16 ? 16 : (per + TILE_MAX - 1) / TILE_MAX * TILE_MAX;
    if (per > cols) per = cols;
    struct problem p = {rows, cols, depth, alpha, beta, x, w, x_row, ldw, out_row, out_col,
                        out, (int)per};
    pool_run(run_chunk, &p, (int)((cols + per - 1) / per), threads, POOL_SLEEP_AT_ONCE);
    free(packed);
    return 0;
}
