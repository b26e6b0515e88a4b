// Few-row float32 matrix products for decoding (see small_gemm.cpp).
#pragma once

#include <torch/extension.h>

namespace convs2s {

constexpr int64_t kSmallGemmMaxRows = 8;

// y[m, n] = sum_k x[m, k] w[n, k] + b[n]: w is (N, K) row-major, as nn.Linear stores it.
void small_gemm_nk(int64_t rows, const float* x, int64_t ldx, const float* w, int64_t N, int64_t K,
                   const float* b, float* y, int64_t ldy);
// y[m, n] = sum_k x[m, k] w[k, n] + b[n]: w is (K, N) row-major, as the linearised conv weight.
void small_gemm_kn(int64_t rows, const float* x, int64_t ldx, const float* w, int64_t K, int64_t N,
                   const float* b, float* y, int64_t ldy);
// The instruction set the kernels were dispatched to on this CPU.
const char* small_gemm_isa();

}  // namespace convs2s
