// Linear combinations of rows, the passes of the Winograd transforms (conv_glu_cpu.cpp).
#pragma once

#include <cstdint>

namespace convs2s {

constexpr int kLincombMaxTerms = 36;  // F(4, 3)'s input gradient gathers at most alpha^2 terms

// dst[c] = (init ? init[c] : 0) + sum_j coef[j] * src[j][c] for c < n, terms <= kLincombMaxTerms:
// one write of dst, the sum in the order of the terms. Compiled for AVX-512, AVX2+FMA and the
// baseline, chosen at run time (the Winograd transforms were the baseline's SSE2 loops, a pass
// over dst per term).
void lincomb_f32(int terms, const float* coef, const float* const* src, const float* init, int64_t n, float* dst);

}  // namespace convs2s
