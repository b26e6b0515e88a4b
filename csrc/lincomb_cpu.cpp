// lincomb_f32 (lincomb.h): per instruction set, whole vectors and one padded tail.

#include "lincomb.h"
#include "isa.h"
#include "vec.h"

#include <cstring>

#pragma GCC diagnostic ignored "-Wpsabi"

namespace convs2s {

namespace {

template <typename V>
CONVS2S_INLINE void lincomb(int terms, const float* coef, const float* const* src, const float* init, int64_t n,
                            float* dst) {
  constexpr int L = Vec<V>::lanes;
  int64_t c = 0;
  for (; c + L <= n; c += L) {
    V acc = init ? load_v<V>(init + c) : V{};
    for (int j = 0; j < terms; ++j) acc += coef[j] * load_v<V>(src[j] + c);
    std::memcpy(dst + c, &acc, sizeof(acc));
  }
  for (; c < n; ++c) {  // the tail element by element, the same order of terms
    float acc = init ? init[c] : 0.f;
    for (int j = 0; j < terms; ++j) acc += coef[j] * src[j][c];
    dst[c] = acc;
  }
}

#if defined(__x86_64__)
__attribute__((target("avx512f"))) void lincomb_avx512(int terms, const float* coef, const float* const* src,
                                                        const float* init, int64_t n, float* dst) {
  lincomb<v16>(terms, coef, src, init, n, dst);
}
__attribute__((target("avx2,fma"))) void lincomb_avx2(int terms, const float* coef, const float* const* src,
                                                      const float* init, int64_t n, float* dst) {
  lincomb<v8>(terms, coef, src, init, n, dst);
}
#endif
void lincomb_base(int terms, const float* coef, const float* const* src, const float* init, int64_t n, float* dst) {
  lincomb<v4>(terms, coef, src, init, n, dst);
}

}  // namespace

void lincomb_f32(int terms, const float* coef, const float* const* src, const float* init, int64_t n, float* dst) {
  static const Isa isa = kernel_isa();
#if defined(__x86_64__)
  if (isa == Isa::avx512) return lincomb_avx512(terms, coef, src, init, n, dst);
  if (isa == Isa::avx2) return lincomb_avx2(terms, coef, src, init, n, dst);
#endif
  lincomb_base(terms, coef, src, init, n, dst);
}

}  // namespace convs2s
