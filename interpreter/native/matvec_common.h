// What mlxgraph's native matrix-vector kernels share (quantized_kernel.h, half_matvec.h):
// vector types, the row bound, and the split of W's rows over the thread pool. One
// translation unit includes it.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>

#include "simd_name.h"

// The thread pool of every native kernel (pool.c), built into this extension's one
// translation unit: setup.py compiles an extension's sources with one set of flags, the
// C++ ones here. Its helpers linger ~200 us after a product (POOL_LINGER_DECODE_NS).
#include "pool.c"

namespace mlxgraph_native {

constexpr int MAX_ROWS = 8;   // the small-batch bound: more rows go to MLX's own op
constexpr int LANES = 8;      // lanes of the 32-byte vectors below
typedef uint32_t v8u __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef float v8f __attribute__((vector_size(32)));

inline std::atomic<int> g_threads{1};   // threads of a product (set_threads; <= POOL_MAX_THREADS)

// fn(lo, hi) over the rows [0, n) of a W of ``weights`` values, in chunks of a multiple of
// ``align`` rows claimed by the pool's threads.
inline void parallel_rows(int n, long weights, const std::function<void(int, int)>& fn,
                          int align = 1) {
  // Below ~256K weights (~20 us of work) a second thread does not pay for itself.
  const int threads = weights < (1L << 18) ? 1 : g_threads.load();
  if (threads == 1) {
    fn(0, n);
    return;
  }
  // Chunks of ~128K weights (tens of microseconds): a thread descheduled while it holds
  // one delays the product by that chunk at most, plus its wait to be scheduled again.
  const long rows = std::max<long>(16, (1L << 17) / std::max<long>(1, weights / n));
  const int per = (int)std::min<long>(n, (rows + align - 1) / align * align);
  struct Rows {
    const std::function<void(int, int)>* fn;
    int n, per;
  } job{&fn, n, per};
  auto chunk = [](void* ctx, int c) {
    const Rows& j = *static_cast<const Rows*>(ctx);
    (*j.fn)(c * j.per, std::min(j.n, (c + 1) * j.per));
  };
  pool_run(chunk, &job, (n + per - 1) / per, threads, POOL_LINGER_DECODE_NS);
}

}  // namespace mlxgraph_native
