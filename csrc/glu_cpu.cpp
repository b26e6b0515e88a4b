// The GLU epilogue's float32 loop (glu.h), vectorised: out = (value * sigmoid(gate) + residual) * scale.
//
// The scalar loop called libm's expf once per output: a decoding step of fconv_wmt_en_fr at 15
// rows makes ~230,000 of them (every layer's GLU), and the encoder one per source position and
// channel. Here exp runs as a polynomial on whole vectors (Cephes' expf: exp(x) = 2^n exp(r),
// |r| <= ln2 / 2, degree 6): the sigmoid comes out within 2.4 ulp of float64's over gates in
// [-87, 88], as with libm's expf (tests/ops/test_conv_glu.py holds it to 3). Compiled for
// AVX-512, AVX2+FMA and the baseline, the best chosen at run time as for the other kernels.

#include "glu.h"
#include "isa.h"
#include "vec.h"

#include <cstring>

// The vector helpers below are always inlined into the per-ISA functions, so no vector crosses a
// call boundary; GCC warns about their would-be ABI all the same.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace convs2s {

namespace {

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

template <typename V>
CONVS2S_INLINE V glu_v(V value, V gate, const float* res, float scale) {
  V v = value / (1.f + exp_v<V>(-gate));
  if (res) {
    V r;
    std::memcpy(&r, res, sizeof(r));
    v += r;
  }
  return v * scale;
}

template <typename V>
CONVS2S_INLINE void glu_span(const float* value, const float* gate, const float* res, float scale, int64_t n,
                             float* dst) {
  constexpr int L = Vec<V>::lanes;
  int64_t i = 0;
  for (; i + L <= n; i += L) {
    V a, b;
    std::memcpy(&a, value + i, sizeof(a));
    std::memcpy(&b, gate + i, sizeof(b));
    const V out = glu_v<V>(a, b, res ? res + i : nullptr, scale);
    std::memcpy(dst + i, &out, sizeof(out));
  }
  if (i < n) {  // the tail through one padded vector
    const int64_t left = n - i;
    alignas(64) float a[L] = {}, b[L] = {}, r[L] = {};
    std::memcpy(a, value + i, left * sizeof(float));
    std::memcpy(b, gate + i, left * sizeof(float));
    if (res) std::memcpy(r, res + i, left * sizeof(float));
    V va, vb;
    std::memcpy(&va, a, sizeof(va));
    std::memcpy(&vb, b, sizeof(vb));
    const V out = glu_v<V>(va, vb, res ? r : nullptr, scale);
    std::memcpy(dst + i, &out, left * sizeof(float));
  }
}

#if defined(__x86_64__)
__attribute__((target("avx512f"))) void glu_span_avx512(const float* value, const float* gate, const float* res,
                                                         float scale, int64_t n, float* dst) {
  glu_span<v16>(value, gate, res, scale, n, dst);
}
__attribute__((target("avx2,fma"))) void glu_span_avx2(const float* value, const float* gate, const float* res,
                                                       float scale, int64_t n, float* dst) {
  glu_span<v8>(value, gate, res, scale, n, dst);
}
#endif
void glu_span_base(const float* value, const float* gate, const float* res, float scale, int64_t n, float* dst) {
  glu_span<v4>(value, gate, res, scale, n, dst);
}

}  // namespace

void glu_span_f32(const float* value, const float* gate, const float* res, float scale, int64_t n, float* dst) {
  static const Isa isa = kernel_isa();
#if defined(__x86_64__)
  if (isa == Isa::avx512) return glu_span_avx512(value, gate, res, scale, n, dst);
  if (isa == Isa::avx2) return glu_span_avx2(value, gate, res, scale, n, dst);
#endif
  glu_span_base(value, gate, res, scale, n, dst);
}

}  // namespace convs2s
