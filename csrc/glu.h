// The GLU epilogue shared by the convolution kernels: one pass over the rows of the GEMM output.
#pragma once

#include <ATen/OpMathType.h>
#include <cmath>

#include "common.h"

namespace convs2s {

// out = (value * sigmoid(gate) + residual) * scale, per row of pre = [value | gate]; the rows x c
// outputs shared among the threads (parallel_row_spans: split by rows alone, a step's 1-16 rows
// ran on one thread, ~4% of an int8 step at 12 rows), each computed alike wherever its run starts.
template <typename scalar_t>
void glu_epilogue(const scalar_t* pre, const scalar_t* res, double scale, int64_t rows, int64_t c, scalar_t* out) {
  using acc_t = at::opmath_type<scalar_t>;
  const acc_t sc = static_cast<acc_t>(scale);
  parallel_row_spans(rows, c, [&](int64_t r, int64_t i0, int64_t i1) {
    const scalar_t* value = pre + r * 2 * c;
    const scalar_t* gate = value + c;
    const scalar_t* rr = res ? res + r * c : nullptr;
    scalar_t* dst = out + r * c;
    for (int64_t i = i0; i < i1; ++i) {
      acc_t v = static_cast<acc_t>(value[i]) / (acc_t(1) + std::exp(-static_cast<acc_t>(gate[i])));
      if (rr) v += static_cast<acc_t>(rr[i]);
      dst[i] = static_cast<scalar_t>(v * sc);
    }
  });
}

}  // namespace convs2s
