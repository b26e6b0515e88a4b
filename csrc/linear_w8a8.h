// Internal to the linear_w8a8 kernels (linear_w8a8_cpu.cpp: the op, quantisation, the baseline and
// library paths, the choice; linear_w8a8_avx512.cpp: VNNI and AMX; linear_w8a8_avx2.cpp: AVX2).
#pragma once

#include <cstdint>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define CONVS2S_X86 1
#endif

// The inline functions below are compiled into every file that includes this header; setup.py
// compiles every file with the same flags, so each copy is baseline x86-64 code (per-file -m flags
// would let the linker keep an AVX-512 copy for every caller).

namespace convs2s {
namespace w8a8 {

// Activations padded to whole 64-byte vectors (the padding is never multiplied by a real weight:
// the weight's tail is loaded masked or zero-filled).
constexpr int64_t kPad = 64;

struct Operands {
  const int8_t* xq;   // (M, Kp) signed activations
  const uint8_t* xu;  // (M, Kp) xq + 128 (VNNI), |xq| (AVX2) or xq + 64 (7-bit, the AVX2 packed kernel)
  int64_t Kp;
  const int8_t* w;    // (N, K)
  int64_t N, K;
  const float* sx;    // (M,) activation scales
  const float* s;     // (N,) weight scales
  const float* b;     // (N,) or null
  float* y;
  int64_t ldy;
  const int8_t* packed;  // the weight in pack_w8a8_weight's layout, or null
  bool plus64;           // xu is xq + 64 (7-bit activations, the AVX2 packed kernel) instead of |xq|
  bool weight7;          // with plus64: every weight in [-63, 63], so two k4 groups' pairs add in int16
};

// How the kernels' unsigned copy of the activations is written.
enum class Unsigned { plus128, abs, plus64 };

// One output: the exact integer sum, scaled as the reference does (one float32 product of the
// two scales, then one multiply and one add; the empty asm keeps the compiler from fusing them
// into an FMA, which would round once instead of twice).
inline void finish(const Operands& g, int64_t m, int64_t n, int32_t sum) {
  float v = static_cast<float>(sum) * (g.sx[m] * g.s[n]);
  asm("" : "+x"(v));
  g.y[m * g.ldy + n] = g.b ? v + g.b[n] : v;
}

#ifdef CONVS2S_X86
// Four outputs of row m from column n on: finish() on four lanes at once (SSE2, any x86-64).
inline void finish4(const Operands& g, int64_t m, int64_t n, __m128i sums) {
  const __m128 scale = _mm_mul_ps(_mm_set1_ps(g.sx[m]), _mm_loadu_ps(g.s + n));
  __m128 v = _mm_mul_ps(_mm_cvtepi32_ps(sums), scale);
  asm("" : "+x"(v));
  if (g.b) v = _mm_add_ps(v, _mm_loadu_ps(g.b + n));
  _mm_storeu_ps(g.y + m * g.ldy + n, v);
}

// The outputs of row m, columns n .. n + count, from their sums (count <= 4).
inline void finish_upto4(const Operands& g, int64_t m, int64_t n, int count, __m128i sums) {
  if (count == 4) return finish4(g, m, n, sums);
  alignas(16) int32_t s4[4];
  _mm_store_si128(reinterpret_cast<__m128i*>(s4), sums);
  for (int i = 0; i < count; ++i) finish(g, m, n + i, s4[i]);
}
#endif

// ---- the packed layout (pack_w8a8_weight): 64-column blocks, 4 k per column side by side ----

constexpr int64_t kPackedCols = 64;
// k in groups of 4, padded to whole 64-byte tiles (16 groups: one AMX tile of B, one 64-byte row of
// activations); the layout's size in its second dimension.
constexpr int64_t packed_k4(int64_t K) { return (K + 63) / 64 * 16; }
// A block: its K4 groups, then one more holding the block's 64 column sums sum_k w[n, k] (int32,
// in column order). The kernels that take unsigned activations subtract 128 or 64 times them; made
// once per weight, they no longer cost a pass's first row tile one more multiply per weight vector
// (a sixth of the AVX2 7-bit arithmetic at 5 rows) nor four registers.
constexpr int64_t kPackedBlockBytes(int64_t K4) { return (K4 + 1) * kPackedCols * 4; }
inline const int32_t* block_column_sums(const int8_t* buf, int64_t K4) {
  return reinterpret_cast<const int32_t*>(buf + K4 * kPackedCols * 4);
}

// Weight rows [n0, n0 + cols) into buf[k4][c][4], zero past K and past cols, then their column sums.
void pack_block(const Operands& g, int64_t n0, int64_t cols, int64_t K4, int8_t* buf);
// The block of columns [n0, n0 + 64): the caller's packed weight (n0 a multiple of 64), or packed now into scratch.
const int8_t* weight_block(const Operands& g, int64_t n0, int64_t cols, int64_t K4, std::vector<int8_t>& scratch);

// ---- the kernels: output columns [n0, n1) of every row ----
#ifdef CONVS2S_X86
void vnni(const Operands& g, int64_t rows, int64_t n0, int64_t n1);         // reducing, any weight
void vnni_packed(const Operands& g, int64_t rows, int64_t n0, int64_t n1);  // packed blocks
constexpr int64_t kAmxRows = 16;                                             // AMX's row tile
void amx(const Operands& g, int64_t rows, int64_t n0, int64_t n1);          // packed weight only
void avx2(const Operands& g, int64_t rows, int64_t n0, int64_t n1);         // reducing, any weight
void avx2_packed(const Operands& g, int64_t rows, int64_t n0, int64_t n1);  // packed blocks
#endif

}  // namespace w8a8
}  // namespace convs2s
