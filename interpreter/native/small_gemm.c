/* mlxgraph's few-row matrix product: C = alpha * X W^T + beta * C for 2..8 rows of X.
 *
 * An optimised sgemm packs both operands into blocks before multiplying; with 2-8 rows the
 * packing of the large operand (the weight) costs more than the product, and running the
 * rows as separate matrix-vector products reads the weight once per row. Both kernels read
 * each weight element once for all rows, straight from where it lies: when the weight's rows
 * run along k ("dot": MLX's x @ W.T) matvec_f32.c takes it (the decode kernel, row tiles
 * sharing each load of X); when they run along n ("axpy") a block of 32 columns accumulates
 * over k here, X read as scalars. Runtime dispatch: GCC target clones (AVX-512, AVX2,
 * baseline) on x86-64. Columns are shared out in chunks over threads (pool.c). */
#include "small_gemm.h"

#include "matvec_f32.h"
#include "pool.h"

#include <string.h>

#define VL 16   /* floats per vector */
#define AXPY_COLS (2 * VL)
typedef float vf __attribute__((vector_size(4 * VL)));

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
    long x_row, x_col, ldw, out_row, out_col;
    float *out;
};

INLINE vf load(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

INLINE void put(const struct problem *p, int i, int n, float v) {
    float *o = p->out + i * p->out_row + n * p->out_col;
    *o = p->beta == 0.0f ? p->alpha * v : p->alpha * v + p->beta * *o;
}

/* Weight rows along n: blocks of AXPY_COLS columns accumulate over k; X read as scalars. */
INLINE void axpy_part(const struct problem *p, const int S, int n0, int n1) {
    const int K = p->depth;
    const long ldw = p->ldw, xr = p->x_row, xc = p->x_col;
    int n = n0;
    for (; n + AXPY_COLS <= n1; n += AXPY_COLS) {
        vf s[SMALL_ROWS_MAX][2];
        memset(s, 0, sizeof s);
        for (int k = 0; k < K; k++) {
            vf a = load(p->w + k * ldw + n), b = load(p->w + k * ldw + n + VL);
#pragma GCC unroll 8
            for (int i = 0; i < S; i++) {
                float xv = p->x[i * xr + k * xc];
                s[i][0] += xv * a;
                s[i][1] += xv * b;
            }
        }
        for (int i = 0; i < S; i++)
            for (int j = 0; j < AXPY_COLS; j++) put(p, i, n + j, s[i][j / VL][j % VL]);
    }
    for (; n < n1; n++)
        for (int i = 0; i < S; i++) {
            float t = 0.0f;
            for (int k = 0; k < K; k++) t += p->x[i * xr + k * xc] * p->w[k * ldw + n];
            put(p, i, n, t);
        }
}

#define CASE(S)                                     \
    case S:                                         \
        axpy_part(p, S, n0, n1);                    \
        break;

CLONES static void run_part(const struct problem *p, int n0, int n1) {
    switch (p->rows) {
        CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)
    }
}

/* Columns in chunks of whole 32-column blocks, about four per thread (pool.c). */
struct split {
    const struct problem *p;
    int cols;   /* per chunk */
};

static void run_chunk(void *ctx, int c) {
    const struct split *s = ctx;
    int n0 = c * s->cols, n1 = n0 + s->cols < s->p->cols ? n0 + s->cols : s->p->cols;
    run_part(s->p, n0, n1);
}

int small_gemm(int rows, int cols, int depth, float alpha, const float *x, long x_row,
               long x_col, const float *w, long ldw, int w_dot, float beta, float *out,
               long out_row, long out_col, int threads) {
    if (w_dot)
        return matvec_f32(rows, cols, depth, alpha, x, x_row, x_col, w, ldw, beta, out,
                          out_row, out_col, threads);
    struct problem p = {rows, cols, depth, alpha, beta, x, w,
                        x_row, x_col, ldw, out_row, out_col, out};
    int parts = threads > 1 ? 4 * threads : 1;
    int per = (cols + parts - 1) / parts;
    per = (per + AXPY_COLS - 1) / AXPY_COLS * AXPY_COLS;
    struct split sp = {&p, per};
    pool_run(run_chunk, &sp, (cols + per - 1) / per, threads, POOL_SLEEP_AT_ONCE);
    return 0;
}
