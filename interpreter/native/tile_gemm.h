/* mlxgraph's blocked matrix product for many rows (tile_gemm.c), called by the BLAS router. */
#ifndef MLXGRAPH_TILE_GEMM_H
#define MLXGRAPH_TILE_GEMM_H

/* 1 when this CPU runs tile_gemm (x86-64 with AVX-512F), else 0 (tile_gemm then refuses). */
int tile_gemm_available(void);

/* out(i, n) = alpha * sum_k X(i, k) W(n, k) + beta * out(i, n) for i < rows, n < cols,
 * k < depth, with X(i, k) = x[i * x_row + k * x_col], W(n, k) = w[n * w_n + k * w_k] and
 * out(i, n) = out[i * out_row + n * out_col]: any strides for X and out, and W with w_k == 1
 * (MLX's x @ W.T) or w_n == 1 (x @ W). beta == 0 never reads out. Runs on `threads` threads
 * (pool.h). Returns 0, or -1 when the CPU lacks AVX-512, W has neither unit stride, or
 * memory for packing X could not be had (nothing was written; the caller falls back). */
int tile_gemm(int rows, int cols, int depth, float alpha, const float *x, long x_row,
              long x_col, const float *w, long w_n, long w_k, float beta, float *out,
              long out_row, long out_col, int threads);

#endif
