/* mlxgraph's work-sharing thread pool for the BLAS router (pool.c). */
#ifndef MLXGRAPH_POOL_H
#define MLXGRAPH_POOL_H

/* Run fn(ctx, c) for every chunk c in 0..chunks-1 on up to `threads` threads: the caller's
 * and threads - 1 persistent helpers, each claiming the next unclaimed chunk. A helper that
 * is not scheduled in time claims nothing and the caller does the work, so a busy machine
 * costs at most the chunk a helper holds (with more chunks than threads, never a whole
 * share). One job at a time (callers queue). */
void pool_run(void (*fn)(void *ctx, int chunk), void *ctx, int chunks, int threads);

#endif
