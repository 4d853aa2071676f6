/* mlxgraph's few-row matrix product (small_gemm.c), called by the BLAS router. */
#ifndef MLXGRAPH_SMALL_GEMM_H
#define MLXGRAPH_SMALL_GEMM_H

#define SMALL_ROWS_MIN 2
#define SMALL_ROWS_MAX 8

/* out(i, n) = alpha * sum_k X(i, k) W(n, k) + beta * out(i, n) for i < rows (2..8),
 * n < cols, k < depth. X(i, k) = x[i * x_row + k * x_col]; W(n, k) = w[n * ldw + k] when
 * w_dot (rows of W are contiguous along k), else w[k * ldw + n]; out(i, n) =
 * out[i * out_row + n * out_col]. beta == 0 never reads out. The columns are shared out
 * over `threads` threads (pool.h). Returns 0, or -1 when memory
 * for packing X could not be had (nothing was written; the caller falls back). */
int small_gemm(int rows, int cols, int depth, float alpha, const float *x, long x_row,
               long x_col, const float *w, long ldw, int w_dot, float beta, float *out,
               long out_row, long out_col, int threads);

#endif
