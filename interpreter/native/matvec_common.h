// What mlxgraph's native matrix-vector kernels share (quantized_matvec.cpp, half_matvec.h):
// vector types, the run-time dispatch, the row bound, and the thread pool that splits the
// rows of W. One translation unit includes it.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "simd_name.h"

namespace mlxgraph_native {

constexpr int MAX_ROWS = 8;   // the small-batch bound: more rows go to MLX's own op
constexpr int LANES = 8;      // words per vector step (32-byte vectors of uint32)
typedef uint32_t v8u __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef float v8f __attribute__((vector_size(32)));

// A small pool: the caller runs one share, the workers the others; workers sleep between calls.
class Pool {
 public:
  explicit Pool(int threads) {
    for (int t = 1; t < threads; ++t) workers_.emplace_back([this, t] { loop(t); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& w : workers_) w.join();
  }
  int size() const { return (int)workers_.size() + 1; }
  // Run fn(share) for share in [0, shares), shares <= size().
  void run(int shares, const std::function<void(int)>& fn) {
    if (shares <= 1) {
      fn(0);
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      fn_ = &fn;
      shares_ = shares;
      pending_.store(shares - 1);
      ++generation_;
    }
    cv_.notify_all();
    fn(0);
    while (pending_.load(std::memory_order_acquire) > 0) std::this_thread::yield();
  }

 private:
  void loop(int id) {
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(int)>* fn;
      int shares;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        fn = fn_;
        shares = shares_;
      }
      if (id < shares) {
        (*fn)(id);
        pending_.fetch_sub(1, std::memory_order_release);
      }
    }
  }
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  const std::function<void(int)>* fn_ = nullptr;
  int shares_ = 0;
  uint64_t generation_ = 0;
  std::atomic<int> pending_{0};
  bool stop_ = false;
};

inline std::atomic<int> g_threads{1};
inline Pool* g_pool = nullptr;
inline std::mutex g_pool_mu;   // held for a whole product: the pool serves one caller at a time
                        // (two CPU streams may run products concurrently)

inline Pool& pool() {  // call with g_pool_mu held
  if (g_pool == nullptr || g_pool->size() != g_threads) {
    delete g_pool;
    g_pool = new Pool(g_threads);
  }
  return *g_pool;
}

// fn(lo, hi) over the rows [0, n) of a W of ``weights`` values, split over the pool.
inline void parallel_rows(int n, long weights, const std::function<void(int, int)>& fn) {
  std::lock_guard<std::mutex> lock(g_pool_mu);
  Pool& workers = pool();
  // Below ~1M weights a thread's wake-up costs more than its share of the work.
  const int shares = weights < (1L << 20) ? 1 : std::min(workers.size(), std::max(1, n / 8));
  workers.run(shares, [&](int share) {
    fn((int)((long)n * share / shares), (int)((long)n * (share + 1) / shares));
  });
}

}  // namespace mlxgraph_native
