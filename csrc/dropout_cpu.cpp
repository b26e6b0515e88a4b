// Dropout on the CPU with its mask a hash of (seed, element index) instead of a stored or drawn
// tensor: torch's bernoulli_ draws from a sequential Mersenne twister (bench/results/amd-zen3-2c/
// training-ops.md), this is a few multiplies and shifts per element in parallel, and backward
// recomputes the same mask from the seed (nothing saved).
//
// keep(i) = fmix32(i * 0x9E3779B1 + seed_lo ^ seed_hi) >= threshold, with murmur3's finaliser:
// for a fixed seed, distinct indices below 2^32 give distinct hashes (both steps are bijections).
// The reference (convs2s_kernels/ops/dropout/reference.py) computes the same bits in int64 ops.

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty_like.h>
#include <cstdint>
#include <type_traits>

#include <cstring>

#include "common.h"
#include "isa.h"
#include "kernels.h"
#include "vec.h"

// The vector helpers are inlined into the per-ISA functions; GCC warns about their would-be ABI all the same.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace convs2s {

namespace {

inline uint32_t fmix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return h;
}

// float32 lanes stored back as the element type (read through vec.h's load_f32_lanes): float32 as
// it is; bfloat16 bits rounded to nearest even (vec.h, as the scalar c10::BFloat16 conversions do).
template <typename V>
CONVS2S_INLINE void store_kept(float* p, V x, typename Vec<V>::u32 keep) {
  typename Vec<V>::u32 bits;
  std::memcpy(&bits, &x, sizeof(bits));
  bits &= keep;
  std::memcpy(p, &bits, sizeof(bits));
}
template <typename V>
CONVS2S_INLINE void store_kept(uint16_t* p, V x, typename Vec<V>::u32 keep) {
  const auto h = __builtin_convertvector(round_bf16_bits_v<V>(x) & keep, typename Vec<V>::u16);
  std::memcpy(p, &h, sizeof(h));
}
CONVS2S_INLINE float scaled_or_zero(float x, bool kept, float scale) { return kept ? x * scale : 0.f; }
CONVS2S_INLINE uint16_t scaled_or_zero(uint16_t x, bool kept, float scale) {
  c10::BFloat16 v;
  v.x = x;
  return (kept ? c10::BFloat16(float(v) * scale) : c10::BFloat16(0.f)).x;
}

// The loop on whole vectors: the hash in 32-bit lanes (vpmulld at AVX2), the mask a compare, each
// element scaled in float32 (T: float, or bfloat16 bits as uint16_t).
template <typename V, typename T>
CONVS2S_INLINE void dropout_span(const T* src, T* dst, int64_t begin, int64_t end, uint32_t mix, uint32_t threshold,
                                 float scale) {
  using U = typename Vec<V>::u32;
  constexpr int L = Vec<V>::lanes;
  U lane;
  for (int i = 0; i < L; ++i) lane[i] = uint32_t(i);
  int64_t i = begin;
  for (; i + L <= end; i += L) {
    U h = (lane + static_cast<uint32_t>(i)) * 0x9E3779B1u + mix;
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    h ^= h >> 16;
    store_kept<V>(dst + i, load_f32_lanes<V>(src + i) * scale, (U)(h >= threshold));
  }
  for (; i < end; ++i) {
    const uint32_t h = fmix32(static_cast<uint32_t>(i) * 0x9E3779B1u + mix);
    dst[i] = scaled_or_zero(src[i], h >= threshold, scale);
  }
}

// One copy per instruction set and element type (overloads), the best chosen at run time.
#define CONVS2S_DROPOUT_ISA(name, target, V)                                                                      \
  target void name(const float* src, float* dst, int64_t begin, int64_t end, uint32_t mix, uint32_t threshold,   \
                   float scale) {                                                                                 \
    dropout_span<V>(src, dst, begin, end, mix, threshold, scale);                                                 \
  }                                                                                                               \
  target void name(const uint16_t* src, uint16_t* dst, int64_t begin, int64_t end, uint32_t mix,                  \
                   uint32_t threshold, float scale) {                                                             \
    dropout_span<V>(src, dst, begin, end, mix, threshold, scale);                                                 \
  }

#if defined(__x86_64__)
CONVS2S_DROPOUT_ISA(dropout_avx512, __attribute__((target("avx512f"))), v16)
CONVS2S_DROPOUT_ISA(dropout_avx2, __attribute__((target("avx2,fma"))), v8)
#endif
CONVS2S_DROPOUT_ISA(dropout_base, , v4)

template <typename T>
void dropout_vectors(const T* src, T* dst, int64_t begin, int64_t end, uint32_t mix, uint32_t threshold, float scale) {
  static const Isa isa = kernel_isa();
#if defined(__x86_64__)
  if (isa == Isa::avx512) return dropout_avx512(src, dst, begin, end, mix, threshold, scale);
  if (isa == Isa::avx2) return dropout_avx2(src, dst, begin, end, mix, threshold, scale);
#endif
  dropout_base(src, dst, begin, end, mix, threshold, scale);
}

}  // namespace

at::Tensor dropout_apply(const at::Tensor& x, double p, int64_t seed) {
  TORCH_CHECK(p >= 0.0 && p < 1.0, "dropout: p must lie in [0, 1)");
  TORCH_CHECK(x.numel() <= (int64_t(1) << 32), "dropout: at most 2^32 elements per call");
  const at::Tensor xc = x.contiguous();
  at::Tensor out = at::empty_like(xc);
  const uint64_t s = static_cast<uint64_t>(seed);
  const uint32_t mix = static_cast<uint32_t>(s) ^ static_cast<uint32_t>(s >> 32);
  // keep when the hash is at least p * 2^32 (rounded down): P(keep) = 1 - p within 2^-32
  const uint64_t threshold = static_cast<uint64_t>(p * 4294967296.0);
  const int64_t n = xc.numel();
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, xc.scalar_type(), "dropout_apply", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const acc_t scale = acc_t(1.0 / (1.0 - p));
    const scalar_t* src = xc.data_ptr<scalar_t>();
    scalar_t* dst = out.data_ptr<scalar_t>();
    at::parallel_for(0, n, 16384, [&](int64_t begin, int64_t end) {
      if constexpr (std::is_same_v<scalar_t, float>) {
        // cast: the branch must compile for every dispatched type, though only float32 takes it
        dropout_vectors(reinterpret_cast<const float*>(src), reinterpret_cast<float*>(dst), begin, end, mix,
                        static_cast<uint32_t>(threshold), float(scale));
        return;
      }
      if constexpr (std::is_same_v<scalar_t, at::BFloat16>) {  // bf16 autocast's activations, as their bits
        dropout_vectors(reinterpret_cast<const uint16_t*>(src), reinterpret_cast<uint16_t*>(dst), begin, end, mix,
                        static_cast<uint32_t>(threshold), float(scale));
        return;
      }
      for (int64_t i = begin; i < end; ++i) {
        const uint32_t h = fmix32(static_cast<uint32_t>(i) * 0x9E3779B1u + mix);
        dst[i] = h >= threshold ? scalar_t(acc_t(src[i]) * scale) : scalar_t(0);
      }
    });
  });
  return out;
}

}  // namespace convs2s
