// mlxgraph's quantized matrix-vector product on the CPU, as an MLX primitive
// (docs/architecture.md#quantized-weights). Built at install by setup.py (optional);
// interpreter/native_quantized.py loads it and falls back to mx.quantized_matmul without it.
//
// y[m, n] = sum_g scales[n, g] * dot(codes[n, g, :], x[m, g, :]) + biases[n, g] * xsum[m, g]
// for M <= MAX_ROWS float32 rows x [M, K] and a weight in MLX's packed layout: uint32 words
// of 32 / bits codes, the first in the lowest bits; float32 or float16 scales and biases.
// x is first split into planes, plane j holding the values that meet code j of each word,
// so one vector of consecutive words meets one vector of consecutive x values per plane:
// no gathers, and every code is unpacked once per block of 4 rows of x (a row of W is read
// from memory once for all M). Runtime dispatch: GCC target clones (AVX-512, AVX2,
// baseline) on x86-64; NEON is the aarch64 baseline. Rows of W are split over threads.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "mlx/allocator.h"
#include "mlx/array.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "simd_name.h"

namespace mx = mlx::core;
namespace nb = nanobind;

namespace {

constexpr int MAX_ROWS = 8;   // the small-batch bound: more rows go to MLX's own op
constexpr int LANES = 8;      // words per vector step (32-byte vectors of uint32)
typedef uint32_t v8u __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef float v8f __attribute__((vector_size(32)));

#if defined(__x86_64__)
// x86-64-v4: AVX-512 (F, BW, DQ, VL); v3: AVX2 with FMA; default: SSE2.
#define MLXG_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define MLXG_CLONES
#endif

struct Problem {
  const float* planes;   // [M][codes per word][K / codes per word]
  const float* xsum;     // [M][groups]
  const uint32_t* w;     // [N][K * bits / 32]
  const void* scales;    // [N][groups], float32 or float16 (half_scales)
  const void* biases;
  float* y;              // [M][N]
  int m, n, k, bits, group_size;
  bool half_scales;
};

// Rows [m0, m0 + M) of x against row r of W. Words per group is a multiple of LANES.
// M is a template parameter so the accumulators stay in registers.
template <int BITS, int M, typename S>
__attribute__((always_inline)) inline void row_dot(const Problem& p, int r, int m0) {
  constexpr int PER_WORD = 32 / BITS;
  constexpr uint32_t MASK = (1u << BITS) - 1;
  const int words = p.k / PER_WORD, groups = p.k / p.group_size;
  const int wpg = words / groups;
  const uint32_t* wr = p.w + (size_t)r * words;
  const S* scales = static_cast<const S*>(p.scales) + (size_t)r * groups;
  const S* biases = static_cast<const S*>(p.biases) + (size_t)r * groups;
  const float* planes = p.planes + (size_t)m0 * PER_WORD * words;
  v8f acc[M] = {};
  for (int g = 0; g < groups; ++g) {
    v8f part[M] = {};
    for (int i = g * wpg; i < (g + 1) * wpg; i += LANES) {
      v8u word;
      std::memcpy(&word, wr + i, sizeof(word));
#pragma GCC unroll 8
      for (int j = 0; j < PER_WORD; ++j) {
        // Codes fit in 8 bits: a signed conversion (one instruction on every level).
        v8i code = (v8i)((word >> (uint32_t)(BITS * j)) & MASK);
        v8f c = __builtin_convertvector(code, v8f);
        for (int m = 0; m < M; ++m) {
          v8f xv;
          std::memcpy(&xv, planes + ((size_t)m * PER_WORD + j) * words + i, sizeof(xv));
          part[m] += c * xv;
        }
      }
    }
    const float s = static_cast<float>(scales[g]);
    for (int m = 0; m < M; ++m) acc[m] += s * part[m];
  }
  for (int m = 0; m < M; ++m) {
    float total = 0;
    for (int l = 0; l < LANES; ++l) total += acc[m][l];
    const float* xs = p.xsum + (size_t)(m0 + m) * groups;
    for (int g = 0; g < groups; ++g) total += static_cast<float>(biases[g]) * xs[g];
    p.y[(size_t)(m0 + m) * p.n + r] = total;
  }
}

// Rows [lo, hi) of W against every row of x, in blocks of up to 4 rows of x: a row of W
// (at most a few KB) is read from memory once and stays in L1 for the later blocks.
template <int BITS, typename S>
MLXG_CLONES void rows_kernel(const Problem& p, int lo, int hi) {
  for (int r = lo; r < hi; ++r) {
    int m0 = 0;
    for (; m0 + 4 <= p.m; m0 += 4) row_dot<BITS, 4, S>(p, r, m0);
    switch (p.m - m0) {
      case 1: row_dot<BITS, 1, S>(p, r, m0); break;
      case 2: row_dot<BITS, 2, S>(p, r, m0); break;
      case 3: row_dot<BITS, 3, S>(p, r, m0); break;
      default: break;
    }
  }
}

template <typename S>
void rows_for_scales(const Problem& p, int lo, int hi) {
  if (p.bits == 4) rows_kernel<4, S>(p, lo, hi);
  else rows_kernel<8, S>(p, lo, hi);
}

void dispatch_rows(const Problem& p, int lo, int hi) {
  if (p.half_scales) rows_for_scales<mx::float16_t>(p, lo, hi);
  else rows_for_scales<float>(p, lo, hi);
}

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

std::atomic<int> g_threads{1};
Pool* g_pool = nullptr;
std::mutex g_pool_mu;   // held for a whole product: the pool serves one caller at a time
                        // (two CPU streams may run products concurrently)

Pool& pool() {  // call with g_pool_mu held
  if (g_pool == nullptr || g_pool->size() != g_threads) {
    delete g_pool;
    g_pool = new Pool(g_threads);
  }
  return *g_pool;
}

void matvec(Problem& p) {
  if (p.m == 0 || p.n == 0) return;
  const int per_word = 32 / p.bits, words = p.k / per_word, groups = p.k / p.group_size;
  const int gsz = p.group_size;
  std::vector<float> planes((size_t)p.m * p.k), xsum((size_t)p.m * groups);
  const float* x = p.planes;  // the caller passes x here; replaced by the planes below
  for (int m = 0; m < p.m; ++m) {
    const float* xm = x + (size_t)m * p.k;
    for (int i = 0; i < words; ++i)
      for (int j = 0; j < per_word; ++j)
        planes[((size_t)m * per_word + j) * words + i] = xm[i * per_word + j];
    for (int g = 0; g < groups; ++g) {
      float s = 0;
      for (int t = 0; t < gsz; ++t) s += xm[g * gsz + t];
      xsum[(size_t)m * groups + g] = s;
    }
  }
  p.planes = planes.data();
  p.xsum = xsum.data();
  std::lock_guard<std::mutex> lock(g_pool_mu);
  Pool& workers = pool();
  // Below ~1M weights a thread's wake-up costs more than its share of the work.
  const long weights = (long)p.n * p.k;
  const int shares =
      weights < (1L << 20) ? 1 : std::min(workers.size(), std::max(1, p.n / 8));
  auto run = [&](int share) {
    const int lo = (int)((long)p.n * share / shares), hi = (int)((long)p.n * (share + 1) / shares);
    dispatch_rows(p, lo, hi);
  };
  workers.run(shares, run);
}

class QuantizedMatvec : public mx::Primitive {
 public:
  QuantizedMatvec(mx::Stream stream, int group_size, int bits)
      : mx::Primitive(stream), group_size_(group_size), bits_(bits) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const auto& x = inputs[0];
    const auto& w = inputs[1];
    const auto& scales = inputs[2];
    const auto& biases = inputs[3];
    auto& out = outputs[0];
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& encoder = mx::cpu::get_command_encoder(stream());
    encoder.set_input_array(x);
    encoder.set_input_array(w);
    encoder.set_input_array(scales);
    encoder.set_input_array(biases);
    encoder.set_output_array(out);
    Problem p{x.data<float>(), nullptr, w.data<uint32_t>(), scales.data<void>(),
              biases.data<void>(), out.data<float>(), (int)(x.size() / x.shape(-1)),
              (int)w.shape(0), (int)x.shape(-1), bits_, group_size_,
              scales.dtype() == mx::float16};
    encoder.dispatch([p]() mutable { matvec(p); });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("mlxgraph QuantizedMatvec runs on the CPU only");
  }

  const char* name() const override { return "MlxgraphQuantizedMatvec"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto& o = static_cast<const QuantizedMatvec&>(other);
    return group_size_ == o.group_size_ && bits_ == o.bits_;
  }

 private:
  int group_size_, bits_;
};

// The checks the kernel relies on; the Python side only calls it for eligible shapes.
mx::array quantized_matvec(const mx::array& x_in, const mx::array& w, const mx::array& scales,
                           const mx::array& biases, int group_size, int bits) {
  if ((bits != 4 && bits != 8) || group_size * bits / 32 % LANES != 0)
    throw std::invalid_argument("quantized_matvec: unsupported bits or group size");
  if (x_in.dtype() != mx::float32 || w.dtype() != mx::uint32 || w.ndim() != 2 ||
      (scales.dtype() != mx::float32 && scales.dtype() != mx::float16) ||
      biases.dtype() != scales.dtype())
    throw std::invalid_argument(
        "quantized_matvec: float32 x, uint32 w, float32 or float16 scales and biases");
  const int k = x_in.shape(-1);
  if ((long)w.shape(1) * 32 / bits != k || k % group_size != 0 ||
      x_in.size() / k > MAX_ROWS || scales.shape(0) != w.shape(0) ||
      scales.shape(1) != k / group_size || biases.shape() != scales.shape())
    throw std::invalid_argument("quantized_matvec: shapes do not match");
  auto s = mx::default_stream(mx::Device::cpu);
  auto x = mx::contiguous(x_in, false, s);
  auto shape = x.shape();
  shape.back() = w.shape(0);
  return mx::array(shape, mx::float32, std::make_shared<QuantizedMatvec>(s, group_size, bits),
                   {x, mx::contiguous(w, false, s), mx::contiguous(scales, false, s),
                    mx::contiguous(biases, false, s)});
}

}  // namespace

NB_MODULE(_quantized_matvec, m) {
  nb::module_::import_("mlx.core");  // registers mlx.core.array with nanobind first
  m.def("quantized_matvec", &quantized_matvec, nb::arg("x"), nb::arg("w"), nb::arg("scales"),
        nb::arg("biases"), nb::arg("group_size"), nb::arg("bits"),
        "x @ dequantize(w).T for float32 x of at most 8 rows (lazy MLX array).");
  m.def("simd", &simd_name, "The instruction set the kernel's dispatch picks on this CPU.");
  m.def("set_threads", [](int n) { g_threads = n < 1 ? 1 : n; }, nb::arg("threads"));
  m.def("threads", [] { return g_threads.load(); });
  m.attr("MAX_ROWS") = MAX_ROWS;
}
