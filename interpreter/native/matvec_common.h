// What mlxgraph's native matrix-vector kernels share (quantized_kernel.h, half_matvec.h):
// vector types, the row bound, and the thread pool that splits the rows of W. One
// translation unit includes it.
#pragma once

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "simd_name.h"

namespace mlxgraph_native {

constexpr int MAX_ROWS = 8;   // the small-batch bound: more rows go to MLX's own op
constexpr int LANES = 8;      // lanes of the 32-byte vectors below
typedef uint32_t v8u __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef float v8f __attribute__((vector_size(32)));

inline void cpu_relax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// A small pool for back-to-back products: a decode step runs ~60 of them a few tens of
// microseconds apart, so a worker spins (yielding) for SPIN after its last job before it
// sleeps on a condition variable (on a VM, waking a halted virtual CPU goes through the
// hypervisor).
// Work is claimed in chunks with an atomic counter: a worker that is not scheduled in time
// claims nothing and the caller does the work, so a busy machine never waits on a thread.
class Pool {
 public:
  static constexpr auto SPIN = std::chrono::microseconds(200);

  explicit Pool(int threads) {
    for (int t = 1; t < threads; ++t) workers_.emplace_back([this] { loop(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_.store(true);
    }
    cv_.notify_all();
    for (auto& w : workers_) w.join();
  }
  int size() const { return (int)workers_.size() + 1; }

  // fn(c) for every chunk c in [0, chunks), on the caller's thread and the workers.
  void run(int chunks, const std::function<void(int)>& fn) {
    if (chunks <= 1 || workers_.empty()) {
      for (int c = 0; c < chunks; ++c) fn(c);
      return;
    }
    fn_ = &fn;
    chunks_ = chunks;
    next_.store(0, std::memory_order_relaxed);
    open_.store(true);            // seq_cst: pairs with the workers' joined_ / open_ accesses
    generation_.fetch_add(1);
    if (sleepers_.load() > 0) {   // seq_cst: a worker going to sleep either sees the new
      std::lock_guard<std::mutex> lock(mu_);  // generation or is counted here
      cv_.notify_all();
    }
    claim();
    open_.store(false);           // late workers stay out; those inside finish their chunk
    while (joined_.load() > 0) cpu_relax();
  }

 private:
  void claim() {
    for (int c; (c = next_.fetch_add(1, std::memory_order_relaxed)) < chunks_;) (*fn_)(c);
  }

  void loop() {
    uint64_t seen = generation_.load();
    while (!stop_.load()) {
      const auto until = std::chrono::steady_clock::now() + SPIN;
      while (generation_.load() == seen && !stop_.load()) {
        for (int i = 0; i < 16; ++i) cpu_relax();
        // Yield, not only spin: a runnable thread of this core (the Python thread building
        // the next step) runs first, and an idle core comes straight back here.
        std::this_thread::yield();
        if (std::chrono::steady_clock::now() > until) {
          std::unique_lock<std::mutex> lock(mu_);
          sleepers_.fetch_add(1);
          cv_.wait(lock, [&] { return stop_.load() || generation_.load() != seen; });
          sleepers_.fetch_sub(1);
          break;
        }
      }
      seen = generation_.load();
      joined_.fetch_add(1);       // before reading open_: the caller waits for it
      if (open_.load()) claim();
      joined_.fetch_sub(1);
    }
  }

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  const std::function<void(int)>* fn_ = nullptr;
  int chunks_ = 0;
  std::atomic<int> next_{0}, joined_{0}, sleepers_{0};
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> open_{false}, stop_{false};
};

inline std::atomic<int> g_threads{1};
inline Pool* g_pool = nullptr;
inline std::mutex g_pool_mu;   // held for a whole product: the pool serves one caller at a time
                               // (two CPU streams may run products concurrently)

// A forked child has none of the parent's workers (and a lock may have been held): it
// starts a pool of its own; the parent's is left unused, not destroyed.
inline void forget_pool_in_child() {
  new (&g_pool_mu) std::mutex();
  g_pool = nullptr;
}

inline Pool& pool() {  // call with g_pool_mu held
  static const bool registered = pthread_atfork(nullptr, nullptr, forget_pool_in_child) == 0;
  (void)registered;
  if (g_pool == nullptr || g_pool->size() != g_threads) {
    delete g_pool;
    g_pool = new Pool(g_threads);
  }
  return *g_pool;
}

// fn(lo, hi) over the rows [0, n) of a W of ``weights`` values, in chunks of a multiple of
// ``align`` rows claimed by the pool's threads.
inline void parallel_rows(int n, long weights, const std::function<void(int, int)>& fn,
                          int align = 1) {
  std::lock_guard<std::mutex> lock(g_pool_mu);
  Pool& workers = pool();
  // Below ~256K weights (~20 us of work) a second thread does not pay for itself.
  const int threads = weights < (1L << 18) ? 1 : workers.size();
  if (threads == 1) {
    fn(0, n);
    return;
  }
  // Chunks of ~128K weights (tens of microseconds): a thread descheduled while it holds
  // one delays the product by that chunk at most, plus its wait to be scheduled again.
  const long rows = std::max<long>(16, (1L << 17) / std::max<long>(1, weights / n));
  const int per = (int)std::min<long>(n, (rows + align - 1) / align * align);
  const int chunks = (n + per - 1) / per;
  workers.run(chunks, [&](int c) { fn(c * per, std::min(n, (c + 1) * per)); });
}

}  // namespace mlxgraph_native
