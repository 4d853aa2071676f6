/* mlxgraph's work-sharing thread pool (pool.c), the one every native kernel uses: the BLAS
 * router's products (blas_router.c, small_gemm.c, tile_gemm.c), the matrix-vector
 * kernels (matvec_common.h) and the quantized prefill product (quantized_tile.h). Each extension that uses it builds it in and has a pool of
 * its own. */
#ifndef MLXGRAPH_POOL_H
#define MLXGRAPH_POOL_H

#ifdef __cplusplus
extern "C" {
#endif

#define POOL_MAX_THREADS 8   /* the caller's thread and up to 7 helpers */

/* How long helpers spin, yielding, after a job before they sleep on a condition variable
 * (waking a sleeping thread on a VM goes through the hypervisor), per job:
 * - the router's products sleep at once: spinning helpers measured no faster there
 *   (128x1024x2816 on 2 threads, 2.69-2.76 ms either way, gaps of 50 us-1 ms), and on a
 *   shared machine they compete with every other process;
 * - a decode step's ~60 matrix-vector products come tens of microseconds apart: helpers
 *   spin ~200 us, and the caller spins for the helpers' last chunks. */
#define POOL_SLEEP_AT_ONCE 0L
#define POOL_LINGER_DECODE_NS 200000L

/* Run fn(ctx, c) for every chunk c in 0..chunks-1 on up to `threads` threads (at most
 * POOL_MAX_THREADS): the caller's and threads - 1 persistent helpers, each claiming the next
 * unclaimed chunk. A helper that is not scheduled in time claims nothing and the caller does
 * the work, so a busy machine costs at most the chunk a helper holds (with more chunks than
 * threads, never a whole share). One job at a time (callers queue). linger_ns: how long the
 * helpers spin after this job (POOL_SLEEP_AT_ONCE, POOL_LINGER_DECODE_NS). */
void pool_run(void (*fn)(void *ctx, int chunk), void *ctx, int chunks, int threads,
              long linger_ns);

#ifdef __cplusplus
}
#endif

#endif
