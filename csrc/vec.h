// GCC/Clang vector types for the CPU kernels (small_gemm.cpp, linear_w8a8_*.cpp): float vectors
// of 4, 8 and 16 lanes and, per vector type, the integer vectors of as many lanes that widen or
// narrow into it. Functions templated on them are compiled per instruction set with target
// attributes and must be inlined into those (CONVS2S_INLINE).
#pragma once

#include <cstdint>
#include <cstring>

namespace convs2s {

#define CONVS2S_INLINE inline __attribute__((always_inline))

typedef float v16 __attribute__((vector_size(64)));
typedef float v8 __attribute__((vector_size(32)));
typedef float v4 __attribute__((vector_size(16)));

template <typename V> struct Vec {
  static constexpr int lanes = sizeof(V) / sizeof(float);
  typedef uint16_t u16 __attribute__((vector_size(2 * lanes)));
  typedef uint32_t u32 __attribute__((vector_size(4 * lanes)));
  typedef int8_t i8 __attribute__((vector_size(lanes)));
  typedef int16_t i16 __attribute__((vector_size(2 * lanes)));
  typedef int32_t i32 __attribute__((vector_size(4 * lanes)));
};

// An unaligned load of a whole vector (memcpy: no alignment or aliasing assumptions; compiles to one load).
template <typename V>
CONVS2S_INLINE V load_v(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// bfloat16 bits widened to float32 lanes (exact: a shift).
template <typename V>
CONVS2S_INLINE V widen_bf16_v(const uint16_t* p) {
  typename Vec<V>::u16 h;
  std::memcpy(&h, p, sizeof(h));
  const typename Vec<V>::u32 w = __builtin_convertvector(h, typename Vec<V>::u32) << 16;
  V x;
  std::memcpy(&x, &w, sizeof(x));
  return x;
}

// An element type's lanes as float32 (the kernels templated on float and on bfloat16 bits as
// uint16_t read both through these): float32 as it is, bfloat16 widened.
template <typename V>
CONVS2S_INLINE V load_f32_lanes(const float* p) {
  return load_v<V>(p);
}
template <typename V>
CONVS2S_INLINE V load_f32_lanes(const uint16_t* p) {
  return widen_bf16_v<V>(p);
}
CONVS2S_INLINE float load_f32(const float* p) { return *p; }
CONVS2S_INLINE float load_f32(const uint16_t* p) {
  const uint32_t w = uint32_t(*p) << 16;
  float f;
  std::memcpy(&f, &w, sizeof(f));
  return f;
}

// float32 lanes rounded to bfloat16 bits, to nearest even, a NaN to the quiet NaN: c10::BFloat16's
// conversion on a whole vector.
template <typename V>
CONVS2S_INLINE typename Vec<V>::u32 round_bf16_bits_v(V x) {
  using U = typename Vec<V>::u32;
  U bits;
  std::memcpy(&bits, &x, sizeof(bits));
  const U nan = (U)(x != x);
  return (((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16) & ~nan) | (0x7FC0u & nan);
}

}  // namespace convs2s
