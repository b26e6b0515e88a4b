// The GLU epilogue shared by the convolution kernels: one pass over the rows of the GEMM output.
#pragma once

#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>

namespace convs2s {

// out = (value * sigmoid(gate) + residual) * scale, per row of pre = [value | gate]. The rows x c
// outputs are shared among the threads in runs of at least kGluGrain (a decoding step has a few
// rows of 512-4096 channels: split by rows alone, up to 16 rows ran on one thread, ~4% of an int8
// step at 12 rows); every output is computed alike wherever its run starts.
constexpr int64_t kGluGrain = 4096;

template <typename scalar_t>
void glu_epilogue(const scalar_t* pre, const scalar_t* res, double scale, int64_t rows, int64_t c, scalar_t* out) {
  using acc_t = at::opmath_type<scalar_t>;
  const acc_t sc = static_cast<acc_t>(scale);
  at::parallel_for(0, rows * c, kGluGrain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin / c; r * c < end; ++r) {
      const scalar_t* value = pre + r * 2 * c;
      const scalar_t* gate = value + c;
      const scalar_t* rr = res ? res + r * c : nullptr;
      scalar_t* dst = out + r * c;
      const int64_t i0 = std::max<int64_t>(begin - r * c, 0), i1 = std::min<int64_t>(end - r * c, c);
      for (int64_t i = i0; i < i1; ++i) {
        acc_t v = static_cast<acc_t>(value[i]) / (acc_t(1) + std::exp(-static_cast<acc_t>(gate[i])));
        if (rr) v += static_cast<acc_t>(rr[i]);
        dst[i] = static_cast<scalar_t>(v * sc);
      }
    }
  });
}

}  // namespace convs2s
