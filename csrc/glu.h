// The GLU epilogue shared by the convolution kernels: one pass over the rows of the GEMM output.
#pragma once

#include <ATen/OpMathType.h>
#include <c10/util/BFloat16.h>
#include <cmath>
#include <type_traits>
#include <vector>

#include "common.h"

namespace convs2s {

// dst[i] = (value[i] * sigmoid(gate[i]) + res[i]) * scale for i < n (res may be null): the float32
// loop of glu_epilogue, vectorised with a polynomial exp (glu_cpu.cpp).
void glu_span_f32(const float* value, const float* gate, const float* res, float scale, int64_t n, float* dst);
// Its derivative for i < n, with d = dout[i] * scale and s = sigmoid(gate[i]): dv[i] = d * s,
// dg[i] = d * value[i] * s * (1 - s) and, unless dres is null, dres[i] = d (the residual's gradient).
void glu_backward_span_f32(const float* dout, const float* value, const float* gate, float scale, int64_t n, float* dv,
                           float* dg, float* dres);

// bfloat16 <-> float32 (vectorised; narrowing rounds to nearest even as c10::BFloat16 does): the
// bf16 rows of the GLU passes go through the float32 spans above in buffers of their own.
void bf16_to_f32(const c10::BFloat16* src, int64_t n, float* dst);
void f32_to_bf16(const float* src, int64_t n, c10::BFloat16* dst);

// The float32 scratch rows a thread widens bf16 spans into (resized, never shrunk).
inline float* bf16_scratch(int64_t n) {
  thread_local std::vector<float> buf;
  if (static_cast<int64_t>(buf.size()) < n) buf.resize(n);
  return buf.data();
}

// One span of glu_epilogue in bf16: widened, the float32 span, rounded back.
inline void glu_span_bf16(const c10::BFloat16* value, const c10::BFloat16* gate, const c10::BFloat16* res, float scale,
                          int64_t n, c10::BFloat16* dst) {
  float* v = bf16_scratch(4 * n);
  float *g = v + n, *r = res ? v + 2 * n : nullptr, *o = v + 3 * n;
  bf16_to_f32(value, n, v);
  bf16_to_f32(gate, n, g);
  if (r) bf16_to_f32(res, n, r);
  glu_span_f32(v, g, r, scale, n, o);
  f32_to_bf16(o, n, dst);
}

// out = (value * sigmoid(gate) + residual) * scale, per row of pre = [value | gate]; the rows x c
// outputs shared among the threads (parallel_row_spans: split by rows alone, a step's 1-16 rows
// ran on one thread: bench/results/kernel-decisions.md#glu-row-spans), each computed alike wherever its run starts.
// float32 through glu_span_f32; other types widened to their math type, one libm exp each.
template <typename scalar_t>
void glu_epilogue(const scalar_t* pre, const scalar_t* res, double scale, int64_t rows, int64_t c, scalar_t* out) {
  using acc_t = at::opmath_type<scalar_t>;
  const acc_t sc = static_cast<acc_t>(scale);
  parallel_row_spans(rows, c, [&](int64_t r, int64_t i0, int64_t i1) {
    const scalar_t* value = pre + r * 2 * c;
    const scalar_t* gate = value + c;
    const scalar_t* rr = res ? res + r * c : nullptr;
    scalar_t* dst = out + r * c;
    if constexpr (std::is_same_v<scalar_t, float>) {
      glu_span_f32(value + i0, gate + i0, rr ? rr + i0 : nullptr, sc, i1 - i0, dst + i0);
    } else if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
      glu_span_bf16(value + i0, gate + i0, rr ? rr + i0 : nullptr, sc, i1 - i0, dst + i0);
    } else {
      for (int64_t i = i0; i < i1; ++i) {
        acc_t v = static_cast<acc_t>(value[i]) / (acc_t(1) + std::exp(-static_cast<acc_t>(gate[i])));
        if (rr) v += static_cast<acc_t>(rr[i]);
        dst[i] = static_cast<scalar_t>(v * sc);
      }
    }
  });
}

}  // namespace convs2s
