/* mlxgraph's few-row matrix product: C = alpha * X W^T + beta * C for 2..8 rows of X.
 *
 * An optimised sgemm packs both operands into blocks before multiplying; with 2-8 rows the
 * packing of the large operand (the weight) costs more than the product, and running the
 * rows as separate matrix-vector products reads the weight once per row. This kernel reads
 * each weight element once for all rows, straight from where it lies: when the weight's rows
 * run along k ("dot": MLX's x @ W.T) each weight row meets every X row in vector
 * registers; when they run along n ("axpy") a block of 32 columns accumulates over k.
 * X is small and stays in cache. Runtime dispatch: GCC target clones (AVX-512, AVX2,
 * baseline) on x86-64. Columns are shared out in chunks over threads (pool.c). */
#include "small_gemm.h"

#include "pool.h"

#include <stdlib.h>
#include <string.h>

#define VL 16   /* floats per vector */
#define AXPY_COLS (2 * VL)
typedef float vf __attribute__((vector_size(4 * VL)));
typedef float vf8 __attribute__((vector_size(32)));

#if defined(__x86_64__)
#define CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CLONES
#endif
#define INLINE static inline __attribute__((always_inline))

struct problem {
    int rows, cols, depth, w_dot;
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

/* Weight rows along k, X rows contiguous along k: two weight rows per step. */
INLINE void dot_part(const struct problem *p, const int S, int n0, int n1) {
    const int K = p->depth;
    const long ldx = p->x_row, ldw = p->ldw;
    const float *x = p->x;
    int n = n0;
    for (; n + 2 <= n1; n += 2) {
        const float *w0 = p->w + n * ldw, *w1 = w0 + ldw;
        vf s0[SMALL_ROWS_MAX] = {0}, s1[SMALL_ROWS_MAX] = {0};
        int k = 0;
        for (; k + VL <= K; k += VL) {
            vf a = load(w0 + k), b = load(w1 + k);
#pragma GCC unroll 8   /* S is a constant here: the accumulators stay in registers */
            for (int i = 0; i < S; i++) {
                vf xi = load(x + i * ldx + k);
                s0[i] += xi * a;
                s1[i] += xi * b;
            }
        }
        for (int i = 0; i < S; i++) {
            float t0 = hsum(s0[i]), t1 = hsum(s1[i]);
            for (int r = k; r < K; r++) {
                t0 += x[i * ldx + r] * w0[r];
                t1 += x[i * ldx + r] * w1[r];
            }
            put(p, i, n, t0);
            put(p, i, n + 1, t1);
        }
    }
    if (n < n1) {
        const float *w0 = p->w + n * ldw;
        for (int i = 0; i < S; i++) {
            float t = 0.0f;
            for (int r = 0; r < K; r++) t += x[i * ldx + r] * w0[r];
            put(p, i, n, t);
        }
    }
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
        if (p->w_dot)                               \
            dot_part(p, S, n0, n1);                 \
        else                                        \
            axpy_part(p, S, n0, n1);                \
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
    struct problem p = {rows, cols, depth, w_dot, alpha, beta, x, w,
                        x_row, x_col, ldw, out_row, out_col, out};
    float *packed = NULL;
    if (w_dot && x_col != 1) {   /* the dot kernel reads X rows as vectors: pack them */
        packed = malloc(sizeof(float) * (size_t)rows * (size_t)depth);
        if (!packed) return -1;
        for (int i = 0; i < rows; i++)
            for (int k = 0; k < depth; k++) packed[(long)i * depth + k] = x[i * x_row + k * x_col];
        p.x = packed;
        p.x_row = depth;
        p.x_col = 1;
    }
    int parts = threads > 1 ? 4 * threads : 1;
    int per = (cols + parts - 1) / parts;
    per = (per + AXPY_COLS - 1) / AXPY_COLS * AXPY_COLS;
    struct split sp = {&p, per};
    pool_run(run_chunk, &sp, (cols + per - 1) / per, threads, POOL_SLEEP_AT_ONCE);
    free(packed);
    return 0;
}
