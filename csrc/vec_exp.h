// exp on whole float vectors (Cephes' expf as a polynomial: exp(x) = 2^n exp(r), |r| <= ln2 / 2,
// degree 6; within 2.4 ulp of float64's over [-87, 88]), for the kernels compiled per instruction
// set (glu_cpu.cpp, output_loss_cpu.cpp): inline into their target-attributed functions.
#pragma once

#include <cstring>

#include "vec.h"

#pragma GCC diagnostic ignored "-Wpsabi"

namespace convs2s {

// exp(x) on every lane: the polynomial for x in [-87, 88], where 2^n is a normal float; past
// them infinity and zero (libm's denormals below exp(-87.3) flushed, which sigmoid's 1 + exp
// cannot tell apart). NaN lanes stay NaN: every comparison with NaN is false.
template <typename V>
CONVS2S_INLINE V exp_v(V xin) {
  using I = typename Vec<V>::i32;
  V x = xin > 88.f ? V{} + 88.f : xin;
  x = x < -87.f ? V{} - 87.f : x;
  // n = round(x / ln2): adding 1.5 * 2^23 rounds to an integer in any vector width
  const V shifter = V{} + 12582912.f;
  const V n = (x * 1.44269504088896341f + shifter) - shifter;
  const V r = (x - n * 0.693359375f) - n * -2.12194440e-4f;  // ln2 in two parts: r exact to float
  V p = V{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const V er = p * (r * r) + r + 1.f;
  const I bits = (__builtin_convertvector(n, I) + 127) << 23;  // 2^n, n in [-126, 127]
  V scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  const V e = er * scale;
  const V big = xin > 88.f ? V{} + __builtin_inff() : e;
  return xin < -87.f ? V{} : big;
}

}  // namespace convs2s
