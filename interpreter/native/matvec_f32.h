/* mlxgraph's decode-sized float32 product (matvec_f32.c), called by the BLAS router. */
#ifndef MLXGRAPH_MATVEC_F32_H
#define MLXGRAPH_MATVEC_F32_H

#define MATVEC_ROWS_MAX 8

/* out(i, n) = alpha * sum_k X(i, k) W(n, k) + beta * out(i, n) for i < rows (1..8),
 * n < cols, k < depth, with the rows of W contiguous along k: W(n, k) = w[n * ldw + k] (a
 * Linear's weight as stored, x @ W.T). X(i, k) = x[i * x_row + k * x_col]; out(i, n) =
 * out[i * out_row + n * out_col]. beta == 0 never reads out. The rows of W are shared out
 * over `threads` threads (pool.h). Each output is summed in the same order whatever the
 * thread count. Returns 0, or -1 when memory for packing X could not be had (nothing was
 * written; the caller falls back). */
int matvec_f32(int rows, int cols, int depth, float alpha, const float *x, long x_row,
               long x_col, const float *w, long ldw, float beta, float *out, long out_row,
               long out_col, int threads);

#endif
