// The L2 norm of every element of a list of tensors (the global gradient norm that clipping scales
// by) in one parallel pass: the elements of all tensors one range shared among the threads, each
// thread's squares summed in float vectors over blocks of kBlock elements, the blocks in double.
// torch's CPU _foreach_norm runs one reduction per tensor (fifty-nine for fconv_iwslt_de_en).

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <ATen/ops/scalar_tensor.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common.h"
#include "isa.h"
#include "kernels.h"
#include "vec.h"

namespace convs2s {

namespace {

constexpr int64_t kBlock = 4096;  // float partial sums over this many elements, then double

template <typename V>
CONVS2S_INLINE double sum_squares_f32(const float* x, int64_t n) {
  constexpr int W = Vec<V>::lanes;
  double total = 0.0;
  for (int64_t b0 = 0; b0 < n; b0 += kBlock) {
    const int64_t b1 = std::min(n, b0 + kBlock);
    V a0{}, a1{}, a2{}, a3{};  // four chains: the adds' latency hidden
    int64_t i = b0;
    for (; i + 4 * W <= b1; i += 4 * W) {
      const V x0 = load_v<V>(x + i), x1 = load_v<V>(x + i + W), x2 = load_v<V>(x + i + 2 * W),
              x3 = load_v<V>(x + i + 3 * W);
      a0 += x0 * x0;
      a1 += x1 * x1;
      a2 += x2 * x2;
      a3 += x3 * x3;
    }
    const V a = (a0 + a1) + (a2 + a3);
    float block = 0.f;
    for (int l = 0; l < W; ++l) block += a[l];
    for (; i < b1; ++i) block += x[i] * x[i];
    total += block;
  }
  return total;
}

#if defined(__x86_64__)
__attribute__((target("avx512f"))) double sum_squares_avx512(const float* x, int64_t n) { return sum_squares_f32<v16>(x, n); }
__attribute__((target("avx2,fma"))) double sum_squares_avx2(const float* x, int64_t n) { return sum_squares_f32<v8>(x, n); }
#endif
double sum_squares_base(const float* x, int64_t n) { return sum_squares_f32<v4>(x, n); }

double sum_squares(const float* x, int64_t n) {
#if defined(__x86_64__)
  if (kernel_isa() == Isa::avx512) return sum_squares_avx512(x, n);
  if (kernel_isa() == Isa::avx2) return sum_squares_avx2(x, n);
#endif
  return sum_squares_base(x, n);
}

double sum_squares(const double* x, int64_t n) {
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) total += x[i] * x[i];
  return total;
}

}  // namespace

at::Tensor grad_norm(const std::vector<at::Tensor>& tensors) {
  RECORD_FUNCTION("convs2s::grad_norm", std::vector<c10::IValue>());
  TORCH_CHECK(!tensors.empty(), "grad_norm: no tensors");
  const auto dtype = tensors[0].scalar_type();
  std::vector<int64_t> starts{0};
  for (const at::Tensor& t : tensors) {
    CONVS2S_CHECK_CPU(t);
    TORCH_CHECK(t.scalar_type() == dtype && t.is_contiguous(), "grad_norm: tensors must be contiguous, of one dtype");
    starts.push_back(starts.back() + t.numel());
  }
  double total = 0.0;
  AT_DISPATCH_FLOATING_TYPES(dtype, "grad_norm", [&] {
    const int threads = at::get_num_threads();
    std::vector<double> partial(threads, 0.0);
    at::parallel_for(0, starts.back(), 1 << 15, [&](int64_t begin, int64_t end) {
      double sum = 0.0;
      size_t i = std::upper_bound(starts.begin(), starts.end(), begin) - starts.begin() - 1;
      for (; i < tensors.size() && starts[i] < end; ++i) {
        const int64_t lo = std::max(begin, starts[i]) - starts[i], hi = std::min(end, starts[i + 1]) - starts[i];
        if (hi > lo) sum += sum_squares(tensors[i].data_ptr<scalar_t>() + lo, hi - lo);
      }
      partial[at::get_thread_num()] += sum;
    });
    for (double p : partial) total += p;  // in thread order: the same sum for the same thread count
  });
  return at::scalar_tensor(std::sqrt(total), tensors[0].options().dtype(at::kDouble));
}

}  // namespace convs2s
