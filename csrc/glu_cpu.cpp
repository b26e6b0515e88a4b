// The GLU epilogue's float32 loop (glu.h), vectorised: out = (value * sigmoid(gate) + residual) * scale;
// and its derivative, the conv+GLU backward's first pass.
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
#include "vec_exp.h"

#include <cstring>

// The vector helpers below are always inlined into the per-ISA functions, so no vector crosses a
// call boundary; GCC warns about their would-be ABI all the same.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace convs2s {

namespace {

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

// dv = d * s, dg = d * value * s * (1 - s), dres = d, with d = dout * scale and s = sigmoid(gate).
template <typename V>
CONVS2S_INLINE void glu_backward_v(const float* dout, const float* value, const float* gate, float scale, float* dv,
                                   float* dg, float* dres) {
  V d, a, b;
  std::memcpy(&d, dout, sizeof(d));
  std::memcpy(&a, value, sizeof(a));
  std::memcpy(&b, gate, sizeof(b));
  d *= scale;
  const V s = 1.f / (1.f + exp_v<V>(-b));
  const V ds = d * s, dgv = ds * a * (1.f - s);
  std::memcpy(dv, &ds, sizeof(ds));
  std::memcpy(dg, &dgv, sizeof(dgv));
  if (dres) std::memcpy(dres, &d, sizeof(d));
}

template <typename V>
CONVS2S_INLINE void glu_backward_span(const float* dout, const float* value, const float* gate, float scale, int64_t n,
                                      float* dv, float* dg, float* dres) {
  constexpr int L = Vec<V>::lanes;
  int64_t i = 0;
  for (; i + L <= n; i += L)
    glu_backward_v<V>(dout + i, value + i, gate + i, scale, dv + i, dg + i, dres ? dres + i : nullptr);
  if (i < n) {  // the tail through padded vectors
    const int64_t left = n - i;
    alignas(64) float o[L] = {}, a[L] = {}, b[L] = {}, rv[L], rg[L], rr[L];
    std::memcpy(o, dout + i, left * sizeof(float));
    std::memcpy(a, value + i, left * sizeof(float));
    std::memcpy(b, gate + i, left * sizeof(float));
    glu_backward_v<V>(o, a, b, scale, rv, rg, rr);
    std::memcpy(dv + i, rv, left * sizeof(float));
    std::memcpy(dg + i, rg, left * sizeof(float));
    if (dres) std::memcpy(dres + i, rr, left * sizeof(float));
  }
}

#if defined(__x86_64__)
__attribute__((target("avx512f"))) void glu_backward_span_avx512(const float* dout, const float* value,
                                                                  const float* gate, float scale, int64_t n, float* dv,
                                                                  float* dg, float* dres) {
  glu_backward_span<v16>(dout, value, gate, scale, n, dv, dg, dres);
}
__attribute__((target("avx2,fma"))) void glu_backward_span_avx2(const float* dout, const float* value,
                                                                const float* gate, float scale, int64_t n, float* dv,
                                                                float* dg, float* dres) {
  glu_backward_span<v8>(dout, value, gate, scale, n, dv, dg, dres);
}
#endif
void glu_backward_span_base(const float* dout, const float* value, const float* gate, float scale, int64_t n, float* dv,
                            float* dg, float* dres) {
  glu_backward_span<v4>(dout, value, gate, scale, n, dv, dg, dres);
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

// bfloat16 <-> float32 over n elements (vec.h's conversions, then the tail one by one).
template <typename V>
CONVS2S_INLINE void widen_bf16(const uint16_t* src, int64_t n, float* dst) {
  constexpr int L = Vec<V>::lanes;
  int64_t i = 0;
  for (; i + L <= n; i += L) {
    const V x = widen_bf16_v<V>(src + i);
    std::memcpy(dst + i, &x, sizeof(x));
  }
  for (; i < n; ++i) dst[i] = load_f32(src + i);
}

template <typename V>
CONVS2S_INLINE void narrow_bf16(const float* src, int64_t n, uint16_t* dst) {
  constexpr int L = Vec<V>::lanes;
  int64_t i = 0;
  for (; i + L <= n; i += L) {
    const auto h = __builtin_convertvector(round_bf16_bits_v<V>(load_v<V>(src + i)), typename Vec<V>::u16);
    std::memcpy(dst + i, &h, sizeof(h));
  }
  for (; i < n; ++i) dst[i] = c10::BFloat16(src[i]).x;
}

#if defined(__x86_64__)
__attribute__((target("avx512f"))) void widen_bf16_avx512(const uint16_t* src, int64_t n, float* dst) {
  widen_bf16<v16>(src, n, dst);
}
__attribute__((target("avx2,fma"))) void widen_bf16_avx2(const uint16_t* src, int64_t n, float* dst) {
  widen_bf16<v8>(src, n, dst);
}
__attribute__((target("avx512f"))) void narrow_bf16_avx512(const float* src, int64_t n, uint16_t* dst) {
  narrow_bf16<v16>(src, n, dst);
}
__attribute__((target("avx2,fma"))) void narrow_bf16_avx2(const float* src, int64_t n, uint16_t* dst) {
  narrow_bf16<v8>(src, n, dst);
}
#endif
void widen_bf16_base(const uint16_t* src, int64_t n, float* dst) { widen_bf16<v4>(src, n, dst); }
void narrow_bf16_base(const float* src, int64_t n, uint16_t* dst) { narrow_bf16<v4>(src, n, dst); }

}  // namespace

void bf16_to_f32(const c10::BFloat16* src, int64_t n, float* dst) {
  static const Isa isa = kernel_isa();
  const auto* s = reinterpret_cast<const uint16_t*>(src);
#if defined(__x86_64__)
  if (isa == Isa::avx512) return widen_bf16_avx512(s, n, dst);
  if (isa == Isa::avx2) return widen_bf16_avx2(s, n, dst);
#endif
  widen_bf16_base(s, n, dst);
}

void f32_to_bf16(const float* src, int64_t n, c10::BFloat16* dst) {
  static const Isa isa = kernel_isa();
  auto* d = reinterpret_cast<uint16_t*>(dst);
#if defined(__x86_64__)
  if (isa == Isa::avx512) return narrow_bf16_avx512(src, n, d);
  if (isa == Isa::avx2) return narrow_bf16_avx2(src, n, d);
#endif
  narrow_bf16_base(src, n, d);
}

void glu_span_f32(const float* value, const float* gate, const float* res, float scale, int64_t n, float* dst) {
  static const Isa isa = kernel_isa();
#if defined(__x86_64__)
  if (isa == Isa::avx512) return glu_span_avx512(value, gate, res, scale, n, dst);
  if (isa == Isa::avx2) return glu_span_avx2(value, gate, res, scale, n, dst);
#endif
  glu_span_base(value, gate, res, scale, n, dst);
}

void glu_backward_span_f32(const float* dout, const float* value, const float* gate, float scale, int64_t n, float* dv,
                           float* dg, float* dres) {
  static const Isa isa = kernel_isa();
#if defined(__x86_64__)
  if (isa == Isa::avx512) return glu_backward_span_avx512(dout, value, gate, scale, n, dv, dg, dres);
  if (isa == Isa::avx2) return glu_backward_span_avx2(dout, value, gate, scale, n, dv, dg, dres);
#endif
  glu_backward_span_base(dout, value, gate, scale, n, dv, dg, dres);
}

}  // namespace convs2s
