/* mlxgraph's CBLAS router: MLX's CPU matmul always calls cblas_sgemm, also for one row or
 * one column, and an optimised sgemm packs its operands first, which for a matrix-vector
 * product costs more than the product. This library exports the cblas_* names libmlx binds
 * (cblas_sgemm, cblas_dgemm, cblas_cgemm): sgemm calls with M == 1 or N == 1 go to the
 * target BLAS's sgemv, everything else to its own *gemm. The target is bound at run time
 * by mlxgraph_router_bind() with a dlopen handle and a symbol prefix ("" for a system
 * OpenBLAS, "scipy_" for scipy-openblas32), so one build serves any CBLAS.
 *
 * Loaded by interpreter/blas.py (RTLD_GLOBAL, before mlx). No headers beyond libc: the
 * CBLAS enum values are the standard ones. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

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
/* BLAS threads per shape class (0 = leave the BLAS's own setting). A matrix-vector product
 * is memory bound and one core nearly saturates memory; a second spinning BLAS thread then
 * mostly competes with MLX's own thread. MLX calls BLAS from one thread per stream, so
 * the last setting can be kept in a plain variable. */
static int matvec_threads, matmul_threads, current_threads;
static long n_gemv, n_gemm;   /* calls taken by each path (for tests and the stats) */

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

/* Threads for matrix-vector and for other products; 0 keeps the BLAS's setting.
 * Returns -1 when the target BLAS cannot set its thread count. */
int mlxgraph_router_threads(int matvec, int matmul) {
    if (!set_threads) return -1;
    matvec_threads = matvec;
    matmul_threads = matmul;
    current_threads = 0;
    return 0;
}

static void use_threads(int n) {
    if (n > 0 && n != current_threads) {
        set_threads(n);
        current_threads = n;
    }
}

void mlxgraph_router_counts(long *gemv, long *gemm) {
    *gemv = __atomic_load_n(&n_gemv, __ATOMIC_RELAXED);
    *gemm = __atomic_load_n(&n_gemm, __ATOMIC_RELAXED);
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

void cblas_sgemm(int order, int ta, int tb, int M, int N, int K, float alpha, const float *A,
                 int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    if (!real_sgemm) unbound("cblas_sgemm");
    /* K == 0 must still scale C by beta, which sgemv skips; empty products go to sgemm. */
    if (routing && (M == 1 || N == 1) && M > 0 && N > 0 && K > 0) {
        __atomic_fetch_add(&n_gemv, 1, __ATOMIC_RELAXED);
        use_threads(matvec_threads);
        if (order == COL_MAJOR)   /* column-major C = row-major C^T = op(B)^T op(A)^T */
            row_major_matvec(tb, ta, N, M, K, alpha, B, ldb, A, lda, beta, C, ldc);
        else
            row_major_matvec(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    __atomic_fetch_add(&n_gemm, 1, __ATOMIC_RELAXED);
    use_threads(matmul_threads);
    real_sgemm(order, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
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
