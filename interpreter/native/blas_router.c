/* mlxgraph's CBLAS router: MLX's CPU matmul always calls cblas_sgemm, also for one row or
 * one column, and an optimised sgemm packs its operands first, which for a matrix-vector
 * or few-row product costs more than the product. This library exports the cblas_* names
 * libmlx binds (cblas_sgemm, cblas_dgemm, cblas_cgemm): sgemm calls with M == 1 or N == 1
 * go to matvec_f32.c (the decode kernel) when the weight is read along k (x @ W.T), else to
 * the target BLAS's sgemv, those with 2..8 rows (or columns) to small_gemm.c, which
 * reads the weight once for all rows, everything else to the BLAS's own *gemm. Each call
 * runs on a number of threads chosen by its size (mlxgraph_router_threads). The target is bound at run time
 * by mlxgraph_router_bind() with a dlopen handle and a symbol prefix ("" for a system
 * OpenBLAS, "scipy_" for scipy-openblas32), so one build serves any CBLAS.
 *
 * Loaded by interpreter/native/blas.py (RTLD_GLOBAL, before mlx). No headers beyond libc: the
 * CBLAS enum values are the standard ones. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "matvec_f32.h"
#include "pool.h"
#include "small_gemm.h"
#include "tile_gemm.h"

enum { ROW_MAJOR = 101, COL_MAJOR = 102, NO_TRANS = 111, TRANS = 112 };  /* ConjTrans = Trans */

typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int,
                         const float *, int, float, float *, int);
typedef void (*sgemv_fn)(int, int, int, int, float, const float *, int, const float *, int,
                         float, float *, int);
typedef void (*dgemm_fn)(int, int, int, int, int, int, double, const double *, int,
                         const double *, int, double, double *, int);
typedef void (*cgemm_fn)(int, int, int, int, int, int, const void *, const void *, int,
                         const void *, int, const void *, void *, int);

static sgemm_fn real_sgemm;
static sgemv_fn real_sgemv;
static dgemm_fn real_dgemm;
static cgemm_fn real_cgemm;
typedef void (*threads_fn)(int);
static threads_fn set_threads;   /* the target's openblas_set_num_threads, if it has one */
static int routing = 1;
/* Products of many rows go to tile_gemm.c (mlxgraph_router_tile): never, where it is
 * faster (wants_tile), or always (tests: every kernel path on small shapes). */
enum { TILE_NEVER, TILE_WHERE_FASTER, TILE_ALWAYS };
static int tiling;
/* Matrix-vector products against a weight read along k (a decode step's x @ W.T) go to
 * matvec_f32.c (1) or to the BLAS's sgemv (0: mlxgraph_router_matvec). */
static int native_matvec = 1;
/* Threads per call: products of fewer than min_work multiply-adds run on few_threads, the
 * others on many_threads (0 = leave the BLAS's own threading alone). The router threads
 * a product itself (pool.c: chunks of columns, each a one-thread BLAS call): OpenBLAS's
 * own workers spin between calls and split a product in fixed shares, so on a shared
 * machine one descheduled worker stalls the whole product; the pool's helpers sleep and
 * claim chunks, and the caller does the chunks a late helper did not claim. */
static int few_threads, many_threads;
static int blas_threads;   /* the count last given to the BLAS (0: never set) */
static long min_work;
/* calls taken by each path, and calls run on more than one thread (tests, stats) */
enum { N_GEMV, N_SMALL, N_GEMM, N_THREADED, N_TILE, N_MATVEC, N_COUNTS };
static long counts[N_COUNTS];

static void *lookup(void *handle, const char *prefix, const char *name) {
    char full[128];
    snprintf(full, sizeof full, "%s%s", prefix, name);
    return dlsym(handle, full);
}

/* Bind the target BLAS. Returns 0, or 1 + the index of the first missing symbol
 * (sgemm, sgemv, dgemm, cgemm), in which case nothing is bound. */
int mlxgraph_router_bind(void *handle, const char *prefix, int route_matvec) {
    static const char *names[] = {"cblas_sgemm", "cblas_sgemv", "cblas_dgemm", "cblas_cgemm"};
    void *found[4];
    for (int i = 0; i < 4; i++) {
        found[i] = lookup(handle, prefix, names[i]);
        if (!found[i]) return 1 + i;
    }
    real_sgemm = (sgemm_fn)found[0];
    real_sgemv = (sgemv_fn)found[1];
    real_dgemm = (dgemm_fn)found[2];
    real_cgemm = (cgemm_fn)found[3];
    routing = route_matvec;
    set_threads = (threads_fn)lookup(handle, prefix, "openblas_set_num_threads");
    return 0;
}

/* The thread policy (see few_threads). Returns -1 when the target BLAS cannot set its
 * thread count (the policy is then not applied). */
int mlxgraph_router_threads(int few, int many, long min_work_) {
    if (!set_threads) return -1;
    few_threads = few;
    many_threads = many;
    min_work = min_work_;
    blas_threads = 0;
    return 0;
}

/* Send products of many rows to tile_gemm.c where it is faster (mode 1), for every
 * product that is neither matrix-vector nor few-row (2, for tests), or never (0). Returns
 * the mode now in force: 0 on a CPU the kernel cannot run on. */
int mlxgraph_router_tile(int mode) {
    tiling = tile_gemm_available() && mode >= TILE_NEVER && mode <= TILE_ALWAYS ? mode
                                                                                 : TILE_NEVER;
    return tiling;
}

/* Send matrix-vector products whose weight is read along k to matvec_f32.c (1) or to the
 * BLAS's sgemv (0). Returns the mode now in force. */
int mlxgraph_router_matvec(int on) {
    native_matvec = on != 0;
    return native_matvec;
}

void mlxgraph_router_counts(long *out, int n) {
    for (int i = 0; i < n && i < N_COUNTS; i++)
        out[i] = __atomic_load_n(&counts[i], __ATOMIC_RELAXED);
}

static void count(int what) { __atomic_fetch_add(&counts[what], 1, __ATOMIC_RELAXED); }

/* Threads for a product of M*N*K multiply-adds (0 = the BLAS's own setting). */
static int threads_for(long M, long N, long K) {
    int n = M * N * K < min_work ? few_threads : many_threads;
    if (n > 1) count(N_THREADED);
    return n;
}

static void use_blas_threads(int n) {
    if (n > 0 && n != blas_threads) {
        set_threads(n);
        blas_threads = n;
    }
}

static void unbound(const char *name) {
    fprintf(stderr, "mlxgraph blas router: %s called before mlxgraph_router_bind\n", name);
    __builtin_trap();
}

/* Row-major C (M x N) = alpha * op(A) * op(B) + beta * C with M == 1 or N == 1, as sgemv.
 * beta == 0 must not read C (MLX hands over uninitialised memory, and some sgemv scale y
 * by beta, 0 * NaN = NaN), so y is zeroed first. */
static void row_major_matvec(int ta, int tb, int M, int N, int K, float alpha, const float *A,
                             int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    int len = M == 1 ? N : M, incy = M == 1 ? 1 : ldc;
    if (beta == 0.0f)
        for (int i = 0; i < len; i++) C[(long)i * incy] = 0.0f;
    if (M == 1) {
        /* c (1 x N) = a^T op(B): a is row 0 of op(A); op(B)^T a as a gemv on B. */
        int incx = ta == NO_TRANS ? 1 : lda;
        if (tb == NO_TRANS)   /* B is K x N */
            real_sgemv(ROW_MAJOR, TRANS, K, N, alpha, B, ldb, A, incx, beta, C, incy);
        else                  /* B is N x K */
            real_sgemv(ROW_MAJOR, NO_TRANS, N, K, alpha, B, ldb, A, incx, beta, C, incy);
    } else {
        /* c (M x 1) = op(A) b: b is column 0 of op(B). */
        int incx = tb == NO_TRANS ? ldb : 1;
        if (ta == NO_TRANS)   /* A is M x K */
            real_sgemv(ROW_MAJOR, NO_TRANS, M, K, alpha, A, lda, B, incx, beta, C, incy);
        else                  /* A is K x M */
            real_sgemv(ROW_MAJOR, TRANS, K, M, alpha, A, lda, B, incx, beta, C, incy);
    }
}

/* Row-major C (M x N) = alpha * op(A) * op(B) + beta * C with M == 1 or N == 1 as
 * matvec_f32 (one row of X) when the weight operand's rows run along k: for M == 1 the
 * weight is op(B) (B stored N x K), for N == 1 it is op(A) (A stored M x K). Returns 0, or
 * -1 when the layout is the other one (sgemv's) or matvec_f32 could not run. */
static int row_major_native_matvec(int ta, int tb, int M, int N, int K, float alpha,
                                   const float *A, int lda, const float *B, int ldb,
                                   float beta, float *C, int ldc, int threads) {
    if (M == 1 && tb != NO_TRANS)   /* x = row 0 of op(A), W = B */
        return matvec_f32(1, N, K, alpha, A, 0, ta == NO_TRANS ? 1 : lda, B, ldb, beta, C, 0,
                          1, threads);
    if (N == 1 && ta == NO_TRANS)   /* x = column 0 of op(B), W = A; out(0, m) = C[m * ldc] */
        return matvec_f32(1, M, K, alpha, B, 0, tb == NO_TRANS ? ldb : 1, A, lda, beta, C, 0,
                          ldc, threads);
    return -1;
}

/* Row-major C (M x N) = alpha * op(A) * op(B) + beta * C with 2..8 rows (or columns) as
 * small_gemm: X is the few-row operand, W the other (its rows of K are contiguous when W
 * is read along k, "dot"). Returns 0, or -1 when small_gemm could not run. */
static int row_major_small(int ta, int tb, int M, int N, int K, float alpha, const float *A,
                           int lda, const float *B, int ldb, float beta, float *C, int ldc,
                           int threads) {
    if (M <= SMALL_ROWS_MAX)   /* X = op(A) (M x K), W(n, k) = op(B)(k, n) */
        return small_gemm(M, N, K, alpha, A, ta == NO_TRANS ? lda : 1,
                          ta == NO_TRANS ? 1 : lda, B, ldb, tb != NO_TRANS, beta, C, ldc, 1,
                          threads);
    /* X(j, k) = op(B)(k, j) (N x K), W(m, k) = op(A)(m, k); out(j, m) = C[m * ldc + j] */
    return small_gemm(N, M, K, alpha, B, tb == NO_TRANS ? 1 : ldb, tb == NO_TRANS ? ldb : 1,
                      A, lda, ta == NO_TRANS, beta, C, 1, ldc, threads);
}

/* Whether tile_gemm.c beats the BLAS's sgemm on a product: where the rows are few (9..160:
 * batched decode rows, short prompts, a 128-token prefill) and the weight large enough.
 * Measured against scipy-openblas32 0.3.34 on this repository's AVX-512 Xeon, calls
 * interleaved in one process (benchmarks/tile_bench.py), x @ W.T (W's rows along k, a
 * Linear's weight), one and two threads:
 * 9-32 rows 1.2-1.5x at 256x256 .. 1024x1024; 64 rows 1.0-1.15x at 256-wide weights,
 * 1.33-1.38x at 1024x1024; 128 rows 1.1-1.2x at 1024x1024 and 1024x2816 but 0.92-1.04x
 * with N or K under 1024 (packing X and writing C weigh more); 192-512 rows 0.94-1.02x;
 * attention's 64-wide products 0.6-0.8x; x @ W with W's rows along n (attention's P @ V:
 * each k step reads a part of a line of another row) 0.77-0.95x even at 64 x 4096 x 256.
 * Everything else stays with the BLAS. */
static int wants_tile(int M, int N, int K, int w_along_k) {
    if (tiling == TILE_ALWAYS) return 1;
    if (M < 9 || M > 160 || !w_along_k) return 0;
    return M <= 64 ? N >= 256 && K >= 256 : N >= 1024 && K >= 512;
}

/* Row-major C (M x N) = alpha * op(A) * op(B) + beta * C as tile_gemm: X = op(A) (its rows
 * are C's), W(n, k) = op(B)(k, n). Returns 0, or -1 when tile_gemm could not run. */
static int row_major_tile(int ta, int tb, int M, int N, int K, float alpha, const float *A,
                          int lda, const float *B, int ldb, float beta, float *C, int ldc,
                          int threads) {
    return tile_gemm(M, N, K, alpha, A, ta == NO_TRANS ? lda : 1, ta == NO_TRANS ? 1 : lda, B,
                     tb == NO_TRANS ? 1 : ldb, tb == NO_TRANS ? ldb : 1, beta, C, ldc, 1,
                     threads);
}

/* The fewest rows or columns a chunk of a threaded BLAS call gets. */
#define MIN_CHUNK 16

static int is_small(int rows) { return rows >= SMALL_ROWS_MIN && rows <= SMALL_ROWS_MAX; }

/* One product, row-major, split into chunks along its longer side (columns of C for a
 * wide C, rows for a tall one), each a one-thread BLAS call. */
struct chunked {
    int ta, tb, M, N, K, lda, ldb, ldc, by_rows, per, matvec;
    float alpha, beta;
    const float *A, *B;
    float *C;
};

static void run_chunk(void *ctx, int c) {
    const struct chunked *j = ctx;
    int lo = c * j->per, len = (j->by_rows ? j->M : j->N) - lo;
    len = len < j->per ? len : j->per;
    const float *A = j->A, *B = j->B;
    float *C = j->C;
    int M = j->M, N = j->N;
    if (j->by_rows) {   /* rows lo.. of op(A) and C */
        A += j->ta == NO_TRANS ? (long)lo * j->lda : lo;
        C += (long)lo * j->ldc;
        M = len;
    } else {            /* columns lo.. of op(B) and C */
        B += j->tb == NO_TRANS ? lo : (long)lo * j->ldb;
        C += lo;
        N = len;
    }
    if (j->matvec)
        row_major_matvec(j->ta, j->tb, M, N, j->K, j->alpha, A, j->lda, B, j->ldb, j->beta, C,
                         j->ldc);
    else
        real_sgemm(ROW_MAJOR, j->ta, j->tb, M, N, j->K, j->alpha, A, j->lda, B, j->ldb,
                   j->beta, C, j->ldc);
}

/* The product on `threads` threads: 0 = the BLAS's own threading, else chunks (pool.c).
 * A matrix-vector product gets 4 chunks per thread, so a helper that runs late holds
 * little of it. An sgemm gets one chunk per thread: each chunk is a BLAS call that packs
 * its share of one operand and all of the other again, which costs work (one thread,
 * OpenBLAS 0.3.34, 8 column chunks against 1: +10% at 128x1024x1024 and 128x2816x1024,
 * +22% at 128x1024x256, +50-80% at an attention's 128x64x128; 2 chunks: -3..+2%, 12%). */
static void run_blas(int matvec, int ta, int tb, int M, int N, int K, float alpha,
                     const float *A, int lda, const float *B, int ldb, float beta, float *C,
                     int ldc, int threads) {
    struct chunked j = {ta, tb, M, N, K, lda, ldb, ldc, N < M, 0, matvec, alpha, beta, A, B,
                        C};
    int side = j.by_rows ? M : N, parts = threads > 1 ? (matvec ? 4 : 1) * threads : 1;
    j.per = (side + parts - 1) / parts;
    if (j.per < MIN_CHUNK) j.per = MIN_CHUNK;
    pool_run(run_chunk, &j, (side + j.per - 1) / j.per, threads, POOL_SLEEP_AT_ONCE);
}

void cblas_sgemm(int order, int ta, int tb, int M, int N, int K, float alpha, const float *A,
                 int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    if (!real_sgemm) unbound("cblas_sgemm");
    /* Column-major C = row-major C^T = op(B)^T op(A)^T: swap the operands once here. */
    if (order == COL_MAJOR) {
        const float *T = A;
        int t = ta;
        A = B, B = T, ta = tb, tb = t, t = lda, lda = ldb, ldb = t, t = M, M = N, N = t;
    }
    /* K == 0 must still scale C by beta, which sgemv skips; empty products go to sgemm.
     * alpha == 0 must not read A or B (the BLAS contract: C = beta C even where they hold
     * Inf or NaN, which the router's kernels would turn into NaN): sgemm too. */
    int routable = routing && M > 0 && N > 0 && K > 0 && alpha != 0.0f;
    int threads = threads_for(M, N, K);
    /* The router threads every product itself (pool.c): the BLAS's own calls get one. */
    if (threads > 0) use_blas_threads(1);
    int matvec = routable && (M == 1 || N == 1);
    if (matvec && native_matvec &&
        row_major_native_matvec(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc,
                                threads > 0 ? threads : 1) == 0) {
        count(N_MATVEC);
        return;
    }
    if (routable && !matvec && (is_small(M) || is_small(N)) &&
        row_major_small(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc,
                        threads > 0 ? threads : 1) == 0) {
        count(N_SMALL);
        return;
    }
    if (routable && !matvec && tiling && wants_tile(M, N, K, tb != NO_TRANS) &&
        row_major_tile(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc,
                       threads > 0 ? threads : 1) == 0) {
        count(N_TILE);
        return;
    }
    count(matvec ? N_GEMV : N_GEMM);
    if (M <= 0 || N <= 0) {   /* nothing to split; the BLAS checks the arguments */
        real_sgemm(ROW_MAJOR, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    run_blas(matvec, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, threads);
}

void cblas_dgemm(int order, int ta, int tb, int M, int N, int K, double alpha, const double *A,
                 int lda, const double *B, int ldb, double beta, double *C, int ldc) {
    if (!real_dgemm) unbound("cblas_dgemm");
    real_dgemm(order, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void cblas_cgemm(int order, int ta, int tb, int M, int N, int K, const void *alpha,
                 const void *A, int lda, const void *B, int ldb, const void *beta, void *C,
                 int ldc) {
    if (!real_cgemm) unbound("cblas_cgemm");
    real_cgemm(order, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
