// int8 x int8 matrix products for decoding: y = (xq @ qweight^T) * sx[m] * scale[n] + b[n], where
// xq is each row of x quantised on the fly (symmetric, one scale per row) and qweight the
// per-output-row int8 weight of quantize_int8.
//
// The weight-only int8 kernels (small_gemm.cpp) widen every weight to float32 once per row tile,
// which costs more than the bytes it saves once a step has ten rows or more. Here both operands
// stay 8-bit and the CPU's integer dot products do the work: AVX-512 VNNI's vpdpbusd (64
// multiply-adds into 16 int32 lanes, one instruction), or AVX2's vpmaddubsw + vpmaddwd. The
// integer sums are exact, so a backend differs from the reference only in the final float
// rounding.
//
// vpdpbusd and vpmaddubsw multiply unsigned by signed bytes:
// * VNNI: activations are stored as xq + 128 (unsigned) and the excess, 128 * sum_k w[n, k],
//   is subtracted at the end; the weight sums come from the packed weight (made once per weight),
//   or for the reducing kernel from the same pass (one more vpdpbusd per weight vector, in the
//   first row tile of each column tile only).
// * AVX2: |xq| times w with x's sign moved onto w (vpsignb), so each pair of products is at most
//   2 * 127 * 127 < 2^15 and vpmaddubsw's int16 saturation never triggers. Weights are in
//   [-127, 127] as quantize_int8 writes them (-(-128) would wrap; the Python op refuses -128).
// * AMX-INT8 (tdpbssd) multiplies signed by signed bytes: the signed rows as they are.
// * With 7-bit activations (activation_bits 7: xq in [-63, 63], an option for AVX2 CPUs without
//   VNNI), the AVX2 packed kernel stores them as xq + 64 (unsigned, <= 127), so that each pair of
//   products is at most 2 * 127 * 127 < 2^15 without vpsignb, and subtracts 64 * sum_k w[n, k] at
//   the end (the weight sums from the packed weight): 3 instructions per 32 multiply-adds, not 4.
//   The padding past K is 64 in that copy and 0 in the weight, so it adds nothing.
// * With 7-bit weights too (weight_bits 7: the weight in [-63, 63], quantize_int8(w, bits=7)), each
//   pair is at most 2 * 127 * 63, so the AVX2 packed kernel adds two k4 groups' pairs in int16
//   before one vpmaddwd widens them (avx2_packed7_tile's kPairs): 5 instructions per 64 multiply-adds, 3 of
//   them on the multiply ports, against 6 and 4. The other kernels take such a weight as any other.
//
// The caller may pass the weight packed once (pack_w8a8_weight: 64-column blocks, 4 k per column
// side by side, then the block's column sums), the layout the block kernels and AMX's B tiles read;
// without it the VNNI block kernel packs each block per call, and AMX is not used.

#include "common.h"
#include "isa.h"
#include "kernel_choice.h"
#include "row_tiles.h"
#include "small_gemm.h"
#include "stream_ahead.h"
#include "vec.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define CONVS2S_X86 1
#endif

namespace convs2s {

namespace {

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

// Quantise row m: sx = max|x| / qmax (1 for a row of zeros), xq = round-half-even(x / sx) in
// [-qmax, qmax] (qmax 127, or 63 for 7-bit activations), as quantize_rows_int8 in the reference.
// The rounding adds and subtracts 1.5 * 2^23, which rounds to nearest-even for |v| <= 127.5 in
// any vector width (std::nearbyint is a library call here).
// Written for vectors of V (AVX-512, AVX2 or baseline): compiled for the baseline alone, the max
// stayed a scalar chain (a float max reduction is not vectorised without -ffast-math) and the
// division 4 lanes wide, ~6% of an int8 decoding step at 12 rows. The max is exact in any order;
// NaNs are skipped, as by the scalar loop (a comparison with NaN is false). u (the kernels'
// unsigned copy) may be null.
template <typename V>
CONVS2S_INLINE void quantize_row_v(const float* x, int64_t K, int8_t* q, uint8_t* u, int64_t Kp, int qmax,
                                   Unsigned enc, float* sx) {
  constexpr int L = Vec<V>::lanes;
  typedef typename Vec<V>::i32 I;
  typedef typename Vec<V>::i8 Q;
  const I abs_mask = I{} + 0x7fffffff;
  V m0{}, m1{};
  int64_t k = 0;
  for (; k + 2 * L <= K; k += 2 * L) {
    V a, b;
    std::memcpy(&a, x + k, sizeof(V));
    std::memcpy(&b, x + k + L, sizeof(V));
    a = (V)((I)a & abs_mask);
    b = (V)((I)b & abs_mask);
    m0 = a > m0 ? a : m0;
    m1 = b > m1 ? b : m1;
  }
  m0 = m1 > m0 ? m1 : m0;
  float amax = 0.f;
  for (int i = 0; i < L; ++i) amax = std::max(amax, m0[i]);
  for (; k < K; ++k) amax = std::max(amax, std::abs(x[k]));
  const float scale = amax / static_cast<float>(qmax);
  const float div = scale > 0.f ? scale : 1.f;
  *sx = div;
  constexpr float kMagic = 12582912.f;
  k = 0;
  for (; k + L <= K; k += L) {
    V v;
    std::memcpy(&v, x + k, sizeof(V));
    const V r = (v / div + kMagic) - kMagic;  // IEEE arithmetic: never simplified away
    I i = __builtin_convertvector(r, I);  // as the scalar cast: a NaN becomes INT_MIN, then -qmax
    i = i > qmax ? I{} + qmax : i;
    i = i < -qmax ? I{} - qmax : i;
    const Q b = __builtin_convertvector(i, Q);
    std::memcpy(q + k, &b, sizeof(Q));
  }
  for (; k < K; ++k) {
    const float r = (x[k] / div + kMagic) - kMagic;
    q[k] = static_cast<int8_t>(std::min(qmax, std::max(-qmax, static_cast<int>(r))));
  }
  std::memset(q + K, 0, Kp - K);
  if (u == nullptr) return;
  const int offset = enc == Unsigned::plus128 ? 128 : enc == Unsigned::plus64 ? 64 : 0;
  for (int64_t k = 0; k < K; ++k) u[k] = static_cast<uint8_t>(enc == Unsigned::abs ? std::abs(q[k]) : q[k] + offset);
  std::memset(u + K, offset, Kp - K);
}

#ifdef CONVS2S_X86
__attribute__((target("avx512f"))) void quantize_row_avx512(const float* x, int64_t K, int8_t* q, uint8_t* u, int64_t Kp,
                                                        int qmax, Unsigned enc, float* sx) {
  quantize_row_v<v16>(x, K, q, u, Kp, qmax, enc, sx);
}
__attribute__((target("avx2"))) void quantize_row_avx2(const float* x, int64_t K, int8_t* q, uint8_t* u, int64_t Kp,
                                                       int qmax, Unsigned enc, float* sx) {
  quantize_row_v<v8>(x, K, q, u, Kp, qmax, enc, sx);
}
#endif
void quantize_row(const float* x, int64_t K, int8_t* q, uint8_t* u, int64_t Kp, int qmax, Unsigned enc, float* sx,
                  Isa isa) {
#ifdef CONVS2S_X86
  if (isa == Isa::avx512) return quantize_row_avx512(x, K, q, u, Kp, qmax, enc, sx);
  if (isa == Isa::avx2) return quantize_row_avx2(x, K, q, u, Kp, qmax, enc, sx);
#endif
  quantize_row_v<v4>(x, K, q, u, Kp, qmax, enc, sx);
}

// ---- baseline: plain integer loops ----

void w8a8_base(const Operands& g, int64_t rows, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    const int8_t* w = g.w + n * g.K;
    for (int64_t m = 0; m < rows; ++m) {
      const int8_t* x = g.xq + m * g.Kp;
      int32_t sum = 0;
      for (int64_t k = 0; k < g.K; ++k) sum += static_cast<int32_t>(x[k]) * static_cast<int32_t>(w[k]);
      finish(g, m, n, sum);
    }
  }
}

#ifdef CONVS2S_X86

// ---- AVX-512 VNNI: tiles of MT rows x NT weight rows, 64 bytes of K per step ----

#define CONVS2S_VNNI __attribute__((target("avx512f,avx512bw,avx512vnni,avx512vl")))

// Sums of u8 x s8 products, 4 per int32 lane (vpdpbusd): acc + u8 . s8. Accumulators are GCC
// vectors (I32x16) passed by value. As __m512i arrays updated through _mm512_dpbusd_epi32, GCC 12
// kept the packed kernel's 5 x 4 tile on the stack, loaded and stored around every vpdpbusd,
// wherever the tile was instantiated for several row counts in one function.
typedef Vec<v16>::i32 I32x16;
CONVS2S_VNNI CONVS2S_INLINE I32x16 dpbusd(I32x16 acc, __m512i u8, __m512i s8) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u8), "vm"(s8));
  return acc;
}

// The 16 int32 lanes of a folded to 4.
CONVS2S_VNNI inline __m128i fold4(__m512i a) {
  const __m256i s = _mm256_add_epi32(_mm512_castsi512_si256(a), _mm512_extracti64x4_epi64(a, 1));
  return _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
}

// [sum a0, sum a1, sum a2, sum a3] of four vectors of int32 lanes.
CONVS2S_VNNI inline __m128i hsum4(__m512i a0, __m512i a1, __m512i a2, __m512i a3) {
  return _mm_hadd_epi32(_mm_hadd_epi32(fold4(a0), fold4(a1)), _mm_hadd_epi32(fold4(a2), fold4(a3)));
}

// v[j], or zeros past the tile's NT vectors.
template <int NT>
CONVS2S_VNNI CONVS2S_INLINE __m512i pick(const I32x16 (&v)[NT], int j) { return j < NT ? __m512i(v[j]) : _mm512_setzero_si512(); }

// Up to 16 columns from n on (`left` of them real): their mask, weight scales and bias, loaded
// once for every row of a tile.
struct Columns16 {
  __mmask16 mask;
  __m512 s, b;
};

CONVS2S_VNNI inline Columns16 columns16(const Operands& g, int64_t n, int64_t left) {
  const __mmask16 mask = left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1);
  return {mask, _mm512_maskz_loadu_ps(mask, g.s + n), g.b ? _mm512_maskz_loadu_ps(mask, g.b + n) : _mm512_setzero_ps()};
}

// finish() on 16 lanes: row m's outputs at those columns from their exact sums.
CONVS2S_VNNI inline void finish16(const Operands& g, int64_t m, int64_t n, const Columns16& c, __m512i sums) {
  const __m512 scale = _mm512_mul_ps(_mm512_set1_ps(g.sx[m]), c.s);
  __m512 out = _mm512_mul_ps(_mm512_cvtepi32_ps(sums), scale);
  asm("" : "+v"(out));
  if (g.b) out = _mm512_add_ps(out, c.b);
  _mm512_mask_storeu_ps(g.y + m * g.ldy + n, c.mask, out);
}

// Rows [r, r + MT) x weight rows [n, n + NT): MT and NT compile-time, so the accumulators live in registers.
template <int MT, int NT>
CONVS2S_VNNI inline void vnni_tile(const Operands& g, int64_t r, int64_t n, int32_t* wsum, bool first) {
  I32x16 acc[MT][NT], ws[NT];
  for (int j = 0; j < NT; ++j) {
    ws[j] = I32x16{};
    for (int m = 0; m < MT; ++m) acc[m][j] = I32x16{};
  }
  const __m512i ones = _mm512_set1_epi8(1);
  const int8_t* w = g.w + n * g.K;
  const uint8_t* x = g.xu + r * g.Kp;
  for (int64_t k = 0; k < g.K; k += 64) {
    const __mmask64 mask = g.K - k >= 64 ? ~__mmask64(0) : (__mmask64(1) << (g.K - k)) - 1;
    __m512i wv[NT];
    for (int j = 0; j < NT; ++j) wv[j] = _mm512_maskz_loadu_epi8(mask, w + j * g.K + k);
    if (first)
      for (int j = 0; j < NT; ++j) ws[j] = dpbusd(ws[j], ones, wv[j]);
    for (int m = 0; m < MT; ++m) {
      const __m512i xv = _mm512_loadu_si512(x + m * g.Kp + k);
      for (int j = 0; j < NT; ++j) acc[m][j] = dpbusd(acc[m][j], xv, wv[j]);
    }
  }
  if (first)
    for (int j = 0; j < NT; j += 4)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(wsum + j), hsum4(__m512i(ws[j]), pick(ws, j + 1), pick(ws, j + 2),
                                                                    pick(ws, j + 3)));
  for (int m = 0; m < MT; ++m)
    for (int j = 0; j < NT; j += 4) {
      const __m128i sums = hsum4(__m512i(acc[m][j]), pick(acc[m], j + 1), pick(acc[m], j + 2), pick(acc[m], j + 3));
      const __m128i excess = _mm_slli_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wsum + j)), 7);
      finish_upto4(g, r + m, n + j, std::min(4, NT - j), _mm_sub_epi32(sums, excess));
    }
}

CONVS2S_VNNI void w8a8_vnni(const Operands& g, int64_t rows, int64_t n0, int64_t n1) {
  constexpr int MT = 4, NT = 4;  // 16 accumulators + 4 weight sums + 4 weight vectors of 32 zmm
  alignas(16) int32_t wsum[4];  // whole vectors: the epilogue reads four lanes whatever NT
  int64_t n = n0;
  for (; n + NT <= n1; n += NT)
    for (int64_t r = 0; r < rows; r += MT)
      CONVS2S_ROWS_SWITCH(std::min<int64_t>(MT, rows - r), MT, (vnni_tile<M, NT>(g, r, n, wsum, r == 0)));
  for (; n < n1; ++n)
    for (int64_t r = 0; r < rows; r += MT)
      CONVS2S_ROWS_SWITCH(std::min<int64_t>(MT, rows - r), MT, (vnni_tile<M, 1>(g, r, n, wsum, r == 0)));
}

// ---- AVX-512 VNNI, many rows: each column block packed once so that no sum needs reducing ----
// With many rows the products are compute-bound and the horizontal sums of the kernel above cost
// as much as the dot products when K is short (fc3's 512). Here a block of 64 weight rows is
// rearranged to [16 ceil(K/64)][64][4] bytes and its column sums (pack_w8a8_weight's layout, or per call; one vector:
// 4 consecutive k of 16 outputs), then each activation's 4 bytes are broadcast against it: every
// vpdpbusd adds into 16 distinct outputs.

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
// Without a packed weight the packed kernel packs each block per call, which pays from
// M >= K / 8 rows (and 16 at least): packing costs a pass of K/4 scattered stores per weight row
// whatever M, the reducing kernel's horizontal sums cost a fixed few instructions per output
// against its K/64 dot products, so the longer K, the later packing pays (measured on the Xeon of
// bench/results/xeon-amx-2c: K 256 from ~24 rows, 512 from ~48, 1536 and 3072 beyond 160).
bool packed_pays(int64_t M, int64_t K) { return M >= 16 && M * 8 >= K; }

// Weight rows [n0, n0 + cols) into buf[k4][c][4], zero past K and past cols, then their column
// sums: one block of pack_w8a8_weight's layout (convs2s_kernels/ops/linear_w8a8/reference.py).
void pack_block(const Operands& g, int64_t n0, int64_t cols, int64_t K4, int8_t* buf) {
  std::memset(buf, 0, kPackedBlockBytes(K4));
  int32_t sums[kPackedCols] = {};
  for (int64_t c = 0; c < cols; ++c) {
    const int8_t* row = g.w + (n0 + c) * g.K;
    const int64_t whole = g.K / 4;
    for (int64_t k4 = 0; k4 < whole; ++k4) std::memcpy(buf + (k4 * kPackedCols + c) * 4, row + 4 * k4, 4);
    if (whole < K4) std::memcpy(buf + (whole * kPackedCols + c) * 4, row + 4 * whole, g.K - 4 * whole);
    for (int64_t k = 0; k < g.K; ++k) sums[c] += row[k];
  }
  std::memcpy(buf + K4 * kPackedCols * 4, sums, sizeof(sums));
}

// The block of columns [n0, n0 + 64): the caller's packed weight (n0 a multiple of 64), or packed now into scratch.
const int8_t* weight_block(const Operands& g, int64_t n0, int64_t cols, int64_t K4, std::vector<int8_t>& scratch) {
  if (g.packed) return g.packed + (n0 / kPackedCols) * kPackedBlockBytes(K4);
  scratch.resize(kPackedBlockBytes(K4));
  pack_block(g, n0, cols, K4, scratch.data());
  return scratch.data();
}

// The first row tile of a block prefetches the block's stream this far ahead into L1 (its four
// lines of each group of 4 k; past the block's end into the next block, which follows it). On a
// Zen 5 VM (2 threads), the step's packed int8 weights cycled cold, paired in one process:
// 0.86x the time at 5 rows, 0.91x at 10, 0.89x at 15, alike at 1 (8 KB; 4 and 16 KB within 3%).
// Possible since the column sums come packed: the tile's 4 sum registers had left no room, and
// GCC spilled the accumulators once the prefetch was added (2026-11-25, results amd-zen5-2c).
constexpr int64_t kVnniAheadBytes = 8192;

// kAhead: the block's first row tile, which also prefetches its stream (kVnniAheadBytes).
template <int MT, bool kAhead>
CONVS2S_VNNI inline void packed_tile(const Operands& g, const int8_t* buf, int64_t K4, int64_t r, int64_t n0,
                                     int64_t cols) {
  constexpr int V = kPackedCols / 16;
  I32x16 acc[MT][V];
  for (int v = 0; v < V; ++v)
    for (int m = 0; m < MT; ++m) acc[m][v] = I32x16{};
  const uint8_t* x = g.xu + r * g.Kp;
  for (int64_t k4 = 0; k4 < K4; ++k4) {
    if constexpr (kAhead)
      for (int l = 0; l < 4; ++l) __builtin_prefetch(buf + k4 * kPackedCols * 4 + kVnniAheadBytes + 64 * l, 0, 3);
    __m512i wv[V];
    for (int v = 0; v < V; ++v) wv[v] = _mm512_loadu_si512(buf + (k4 * kPackedCols + 16 * v) * 4);
    for (int m = 0; m < MT; ++m) {
      int32_t four;
      std::memcpy(&four, x + m * g.Kp + 4 * k4, 4);
      const __m512i xb = _mm512_set1_epi32(four);
      for (int v = 0; v < V; ++v) acc[m][v] = dpbusd(acc[m][v], xb, wv[v]);
    }
  }
  const int32_t* sums = block_column_sums(buf, K4);
  for (int v = 0; v < V && 16 * v < cols; ++v) {
    const Columns16 c = columns16(g, n0 + 16 * v, cols - 16 * v);
    const __m512i excess = _mm512_slli_epi32(_mm512_loadu_si512(sums + 16 * v), 7);  // 128 * sum_k w
    for (int m = 0; m < MT; ++m) finish16(g, r + m, n0 + 16 * v, c, _mm512_sub_epi32(__m512i(acc[m][v]), excess));
  }
}

CONVS2S_VNNI void w8a8_vnni_packed(const Operands& g, int64_t rows, int64_t n0, int64_t n1) {
  constexpr int MT = 5;  // 20 accumulators + 4 weight vectors + 1 broadcast of 32 zmm
  const int64_t K4 = packed_k4(g.K);
  std::vector<int8_t> scratch;
  for (int64_t n = n0; n < n1; n += kPackedCols) {
    const int64_t cols = std::min(kPackedCols, n1 - n);
    const int8_t* buf = weight_block(g, n, cols, K4, scratch);
    for (int64_t r = 0; r < rows; r += MT) {
      if (r == 0)
        CONVS2S_ROWS_SWITCH(std::min<int64_t>(MT, rows - r), MT, (packed_tile<M, true>(g, buf, K4, r, n, cols)))
      else
        CONVS2S_ROWS_SWITCH(std::min<int64_t>(MT, rows - r), MT, (packed_tile<M, false>(g, buf, K4, r, n, cols)))
    }
  }
}

// ---- AMX-INT8: tiles of 16 rows x 64 bytes, signed x signed (tdpbssd), on packed blocks ----
// One block of 64 columns is four C tiles (16 rows x 16 int32); per 64 bytes of k, one A tile of
// activations and four B tiles straight from the packed weight (16 groups of 4 k x 16 columns,
// rows 256 bytes apart). The tile unit's 1024 multiply-adds a cycle leave the weight's bytes as
// the only cost, at any row count. Activations are padded to whole 16-row tiles (zero rows).

#define CONVS2S_AMX __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vnni,avx512vl")))

constexpr int64_t kAmxRows = 16;

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

CONVS2S_AMX void amx_configure() {
  TileConfig cfg;
  for (int t = 0; t < 7; ++t) {  // 0-3: C, 4: A, 5-6: B; all 16 rows x 64 bytes
    cfg.rows[t] = kAmxRows;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
}

// Rows [r, r + 16) of x times the packed block at buf, sums into sums[16][64].
CONVS2S_AMX inline void amx_block(const Operands& g, const int8_t* buf, int64_t K4, int64_t r, int32_t* sums) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  const int8_t* a = g.xq + r * g.Kp;
  for (int64_t kt = 0; kt < K4 / 16; ++kt) {
    const int8_t* b = buf + kt * 16 * kPackedCols * 4;
    _tile_loadd(4, a + kt * 64, g.Kp);
    _tile_loadd(5, b, kPackedCols * 4);
    _tile_dpbssd(0, 4, 5);
    _tile_loadd(6, b + 64, kPackedCols * 4);
    _tile_dpbssd(1, 4, 6);
    _tile_loadd(5, b + 128, kPackedCols * 4);
    _tile_dpbssd(2, 4, 5);
    _tile_loadd(6, b + 192, kPackedCols * 4);
    _tile_dpbssd(3, 4, 6);
  }
  _tile_stored(0, sums, kPackedCols * 4);
  _tile_stored(1, sums + 16, kPackedCols * 4);
  _tile_stored(2, sums + 32, kPackedCols * 4);
  _tile_stored(3, sums + 48, kPackedCols * 4);
}

CONVS2S_AMX void w8a8_amx(const Operands& g, int64_t rows, int64_t n0, int64_t n1) {
  const int64_t K4 = packed_k4(g.K);
  alignas(64) int32_t sums[kAmxRows * kPackedCols];
  amx_configure();
  for (int64_t n = n0; n < n1; n += kPackedCols) {
    const int64_t cols = std::min(kPackedCols, n1 - n);
    const int8_t* buf = g.packed + (n / kPackedCols) * kPackedBlockBytes(K4);
    for (int64_t r = 0; r < rows; r += kAmxRows) {
      amx_block(g, buf, K4, r, sums);
      for (int64_t v = 0; 16 * v < cols; ++v) {
        const Columns16 c = columns16(g, n + 16 * v, cols - 16 * v);
        for (int64_t m = 0; m < std::min(kAmxRows, rows - r); ++m)
          finish16(g, r + m, n + 16 * v, c, _mm512_loadu_si512(sums + m * kPackedCols + 16 * v));
      }
    }
  }
  _tile_release();
}

// ---- AVX2: vpsignb + vpmaddubsw + vpmaddwd, 32 bytes of K per step ----

#define CONVS2S_AVX2 __attribute__((target("avx2,fma")))

CONVS2S_AVX2 inline __m128i hsum4(__m256i a0, __m256i a1, __m256i a2, __m256i a3) {
  const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(a0, a1), _mm256_hadd_epi32(a2, a3));
  return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

// 32 bytes of a weight row from k on, zero past K (the row's end may be the buffer's end).
CONVS2S_AVX2 inline __m256i load_weight(const int8_t* w, int64_t k, int64_t K) {
  if (K - k >= 32) return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + k));
  alignas(32) int8_t tail[32] = {};
  std::memcpy(tail, w + k, K - k);
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(tail));
}

typedef Vec<v8>::i32 I32x8;

// The `lines` cache lines from `from` on (bytes [from, from + 64 * lines)) that a pass over one
// block prefetches into L2 while it computes.
struct PrefetchShare {
  const int8_t* from;
  int64_t lines;
};
template <int NT>
CONVS2S_AVX2 CONVS2S_INLINE __m256i pick(const I32x8 (&v)[NT], int j) { return j < NT ? __m256i(v[j]) : _mm256_setzero_si256(); }

// One k4 step of a pass's prefetch share: share.lines lines spread evenly over the K4 steps (a
// line every K4 / lines steps, or several a step); due and line carry over between steps.
CONVS2S_INLINE void prefetch_share_step(const PrefetchShare& share, int64_t K4, int64_t& due, int64_t& line) {
  for (due += share.lines; due >= K4; due -= K4) __builtin_prefetch(share.from + 64 * line++, 0, 2);
}

// The outputs of a packed pass (MT rows x 32 columns, cols of them real) from its accumulators,
// less `excess` per column vector (7-bit activations' offset; zeros otherwise). The sums leave the
// registers in loops of constant trip counts: finished straight from acc (a loop bounded by cols),
// GCC kept a copy of every accumulator on the stack, stored at every k4.
template <int MT>
CONVS2S_AVX2 CONVS2S_INLINE void finish_packed_pass(const Operands& g, int64_t r, int64_t n, int64_t cols,
                                                    const I32x8 (&acc)[MT][4], const __m256i (&excess)[4]) {
  alignas(32) int32_t sums[MT][32];
  for (int m = 0; m < MT; ++m)
    for (int v = 0; v < 4; ++v)
      _mm256_store_si256(reinterpret_cast<__m256i*>(sums[m] + 8 * v), _mm256_sub_epi32(__m256i(acc[m][v]), excess[v]));
  for (int m = 0; m < MT; ++m)
    for (int64_t c = 0; c < cols; c += 4)
      finish_upto4(g, r + m, n + c, static_cast<int>(std::min<int64_t>(4, cols - c)),
                   _mm_load_si128(reinterpret_cast<const __m128i*>(sums[m] + c)));
}

template <int MT, int NT>
CONVS2S_AVX2 inline void avx2_tile(const Operands& g, int64_t r, int64_t n) {
  I32x8 acc[MT][NT];
  for (int m = 0; m < MT; ++m)
    for (int j = 0; j < NT; ++j) acc[m][j] = I32x8{};
  const __m256i ones = _mm256_set1_epi16(1);
  const int8_t* w = g.w + n * g.K;
  for (int64_t k = 0; k < g.K; k += 32) {
    __m256i wv[NT];
    for (int j = 0; j < NT; ++j) wv[j] = load_weight(w + j * g.K, k, g.K);
    for (int m = 0; m < MT; ++m) {
      const int64_t off = (r + m) * g.Kp + k;
      const __m256i xs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g.xq + off));
      const __m256i xa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g.xu + off));
      for (int j = 0; j < NT; ++j) {
        const __m256i pairs = _mm256_maddubs_epi16(xa, _mm256_sign_epi8(wv[j], xs));
        acc[m][j] += I32x8(_mm256_madd_epi16(pairs, ones));
      }
    }
  }
  for (int m = 0; m < MT; ++m)
    for (int j = 0; j < NT; j += 4)
      finish_upto4(g, r + m, n + j, std::min(4, NT - j),
                   hsum4(__m256i(acc[m][j]), pick(acc[m], j + 1), pick(acc[m], j + 2), pick(acc[m], j + 3)));
}

CONVS2S_AVX2 void w8a8_avx2(const Operands& g, int64_t rows, int64_t n0, int64_t n1) {
  constexpr int MT = 2, NT = 4;  // 8 accumulators + 4 weight vectors + 2 activations + ones of 16 ymm
  int64_t n = n0;
  for (; n + NT <= n1; n += NT)
    for (int64_t r = 0; r < rows; r += MT)
      CONVS2S_ROWS_SWITCH(std::min<int64_t>(MT, rows - r), MT, (avx2_tile<M, NT>(g, r, n)));
  for (; n < n1; ++n)
    for (int64_t r = 0; r < rows; r += MT)
      CONVS2S_ROWS_SWITCH(std::min<int64_t>(MT, rows - r), MT, (avx2_tile<M, 1>(g, r, n)));
}

// The first row tile of each pass over a block half prefetches the half's own stream this far ahead
// into L1 (its two lines of each 256-byte group of 4 k; across the block's end into the next block,
// which follows it in the packed weight). Without it every thread's first block, and whatever the
// hardware prefetchers left behind, arrived at the loads' pace: a step's products ran at about the
// memory's time plus the arithmetic's. On a Zen 5 VM capped at AVX2, 2 threads, against the build
// without it: cold 3072 x 2048 alone 0.75x the time at 5 rows, 0.86x at 10, 0.9x at 15, 0.7-0.8x at
// 1 (in the caches unchanged); whole fconv_wmt_en_fr decodes of the peer workload, builds alternated,
// 0.89x (8-bit) and 0.92x (7-bit, int8 encoder). 4-16 KB measured alike; from every row tile, no
// better; the prefetch shares below stay (without them the steps ran 1.16-1.22x slower). The VNNI
// kernel has its own (kVnniAheadBytes), since the column sums come packed. The distance,
// kStreamAheadBytes, lives in stream_ahead.h: the read-bandwidth probe (read_peak.cpp) reads alike.

// AVX2 on packed blocks: half a block (32 columns, four vectors of 8 outputs x 4 k) per pass, each
// row's 4 activation bytes broadcast against it, sign moved as above; no horizontal sums.
// kAhead: the block half's first row tile, which also prefetches its own stream (kStreamAheadBytes).
template <int MT, bool kAhead>
CONVS2S_AVX2 inline void avx2_packed_tile(const Operands& g, const int8_t* buf, int64_t K4, int64_t r, int64_t n,
                                          int64_t cols, const PrefetchShare& share) {
  constexpr int V = 4;
  I32x8 acc[MT][V];  // GCC vectors, as the VNNI tiles' (dpbusd): __m256i ones were kept on the stack
  for (int m = 0; m < MT; ++m)
    for (int v = 0; v < V; ++v) acc[m][v] = I32x8{};
  const __m256i ones = _mm256_set1_epi16(1);
  int64_t due = 0, line = 0;
  for (int64_t k4 = 0; k4 < K4; ++k4) {
    prefetch_share_step(share, K4, due, line);
    if constexpr (kAhead) {  // this half's two lines of the group kStreamAheadBytes on
      __builtin_prefetch(buf + k4 * kPackedCols * 4 + kStreamAheadBytes, 0, 3);
      __builtin_prefetch(buf + k4 * kPackedCols * 4 + kStreamAheadBytes + 64, 0, 3);
    }
    __m256i wv[V];
    for (int v = 0; v < V; ++v) wv[v] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(buf + (k4 * kPackedCols + 8 * v) * 4));
    for (int m = 0; m < MT; ++m) {
      int32_t s4, a4;
      std::memcpy(&s4, g.xq + (r + m) * g.Kp + 4 * k4, 4);
      std::memcpy(&a4, g.xu + (r + m) * g.Kp + 4 * k4, 4);
      const __m256i xs = _mm256_set1_epi32(s4), xa = _mm256_set1_epi32(a4);
      for (int v = 0; v < V; ++v) {
        const __m256i pairs = _mm256_maddubs_epi16(xa, _mm256_sign_epi8(wv[v], xs));
        acc[m][v] += I32x8(_mm256_madd_epi16(pairs, ones));
      }
    }
  }
  const __m256i none[V] = {};
  finish_packed_pass<MT>(g, r, n, cols, acc, none);
}

// The same pass with 7-bit activations stored as xq + 64 (Operands::plus64): vpmaddubsw straight
// on the unsigned copy and the weight, no vpsignb. The excess, 64 * sum_k w[n, k], comes off at
// the end, from the block's column sums. Weights are read from L1 as operands.
// kPairs: 7-bit weights too (Operands::weight7, |w| <= 63): each vpmaddubsw pair is then at most
// 2 * 127 * 63 = 16002, so the pairs of two k4 groups add in int16 (32004 < 2^15) before one
// vpmaddwd widens them: 5 instructions per 64 multiply-adds instead of 6, and 3 on the multiply
// ports instead of 4. K4 is even (whole 64-byte tiles of k).
template <int MT, bool kAhead, bool kPairs>
CONVS2S_AVX2 inline void avx2_packed7_tile(const Operands& g, const int8_t* buf, int64_t K4, int64_t r, int64_t n,
                                           int64_t cols, const PrefetchShare& share) {
  constexpr int V = 4;
  constexpr int kGroups = kPairs ? 2 : 1;  // k4 groups a pass of the loop takes
  I32x8 acc[MT][V];
  for (int v = 0; v < V; ++v)
    for (int m = 0; m < MT; ++m) acc[m][v] = I32x8{};
  const __m256i ones = _mm256_set1_epi16(1);
  int64_t due = 0, line = 0;
  for (int64_t k4 = 0; k4 < K4; k4 += kGroups) {
    const int8_t* w = buf + k4 * kPackedCols * 4;
    for (int q = 0; q < kGroups; ++q) {
      prefetch_share_step(share, K4, due, line);
      if constexpr (kAhead) {  // the first row tile: this half's stream ahead, as above
        __builtin_prefetch(w + q * kPackedCols * 4 + kStreamAheadBytes, 0, 3);
        __builtin_prefetch(w + q * kPackedCols * 4 + kStreamAheadBytes + 64, 0, 3);
      }
    }
    for (int m = 0; m < MT; ++m) {
      const uint8_t* a = g.xu + (r + m) * g.Kp + 4 * k4;
      int32_t a0;
      std::memcpy(&a0, a, 4);  // 4-byte broadcasts straight from memory
      const __m256i xa0 = _mm256_set1_epi32(a0);
      if constexpr (kPairs) {
        int32_t a1;
        std::memcpy(&a1, a + 4, 4);
        const __m256i xa1 = _mm256_set1_epi32(a1);
        for (int v = 0; v < V; ++v) {
          const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 32 * v));
          const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + kPackedCols * 4 + 32 * v));
          const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(xa0, w0), _mm256_maddubs_epi16(xa1, w1));
          acc[m][v] += I32x8(_mm256_madd_epi16(pairs, ones));
        }
      } else {
        for (int v = 0; v < V; ++v) {
          const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 32 * v));
          acc[m][v] += I32x8(_mm256_madd_epi16(_mm256_maddubs_epi16(xa0, wv), ones));
        }
      }
    }
  }
  const int32_t* sums = block_column_sums(buf, K4);  // buf: the half's first column, its sums likewise
  __m256i excess[V];
  for (int v = 0; v < V; ++v)
    excess[v] = _mm256_slli_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sums + 8 * v)), 6);
  finish_packed_pass<MT>(g, r, n, cols, acc, excess);
}

// One packed AVX2 pass loop: row tiles of MT rows, 8-bit (kSeven false) or 7-bit activations.
template <int MT, bool kSeven>
CONVS2S_AVX2 void w8a8_avx2_packed_rows(const Operands& g, int64_t rows, int64_t n0, int64_t n1) {
  const int64_t K4 = packed_k4(g.K);
  std::vector<int8_t> scratch;
  for (int64_t n = n0; n < n1; n += kPackedCols) {
    const int64_t cols = std::min(kPackedCols, n1 - n);
    const int8_t* buf = weight_block(g, n, cols, K4, scratch);
    // Each pass over this block (halves x row tiles) asks for an equal share of the next block's
    // lines into L2 while it computes, so that the memory streams while the later passes work
    // from the caches: with the hardware prefetchers alone it sat idle then. Sweeps of a decoding
    // step's packed int8 weights (119 MB, AVX2, Zen 3 VM, 2 threads, paired): 0.95x at 1 row,
    // 0.84x at 5, 0.88x at 8, 0.91x at 12, 0.92x at 16; two blocks ahead, or the share spread
    // over the first half of the passes, measured the same. Only within a thread's run of blocks:
    // a run of one block (a weight of under 2048 columns at 2 threads) prefetches nothing, and
    // prefetching the block after the run instead measured alike (0.99-1.01x, whole steps).
    const int64_t passes = (cols + kPackedCols / 2 - 1) / (kPackedCols / 2) * ((rows + MT - 1) / MT);
    const int64_t next_lines = g.packed && n + kPackedCols < n1 ? kPackedBlockBytes(K4) / 64 : 0;
    int64_t pass = 0;
    for (int64_t half = 0; half < cols; half += kPackedCols / 2)
      for (int64_t r = 0; r < rows; r += MT, ++pass) {
        const int64_t l0 = next_lines * pass / passes, l1 = next_lines * (pass + 1) / passes;
        const PrefetchShare share{buf + kPackedBlockBytes(K4) + 64 * l0, l1 - l0};
        const int64_t width = std::min<int64_t>(kPackedCols / 2, cols - half);
        // if constexpr: each loop instantiates only its own tiles (no 8-bit tile of three rows)
        if constexpr (!kSeven) {
          if (r == 0)
            CONVS2S_ROWS_SWITCH(std::min<int64_t>(MT, rows - r), MT,
                                (avx2_packed_tile<M, true>(g, buf + half * 4, K4, r, n + half, width, share)))
          else
            CONVS2S_ROWS_SWITCH(std::min<int64_t>(MT, rows - r), MT,
                                (avx2_packed_tile<M, false>(g, buf + half * 4, K4, r, n + half, width, share)))
        } else if (g.weight7) {
          if (r == 0)
            CONVS2S_ROWS_SWITCH(std::min<int64_t>(MT, rows - r), MT,
                                (avx2_packed7_tile<M, true, true>(g, buf + half * 4, K4, r, n + half, width, share)))
          else
            CONVS2S_ROWS_SWITCH(std::min<int64_t>(MT, rows - r), MT,
                                (avx2_packed7_tile<M, false, true>(g, buf + half * 4, K4, r, n + half, width, share)))
        } else if (r == 0) {
          CONVS2S_ROWS_SWITCH(std::min<int64_t>(MT, rows - r), MT,
                              (avx2_packed7_tile<M, true, false>(g, buf + half * 4, K4, r, n + half, width, share)))
        } else {
          CONVS2S_ROWS_SWITCH(std::min<int64_t>(MT, rows - r), MT,
                              (avx2_packed7_tile<M, false, false>(g, buf + half * 4, K4, r, n + half, width, share)))
        }
      }
  }
}

// Row tiles of 16 ymm. 8-bit: 8 accumulators + 4 weight vectors + 2 broadcasts + ones, two rows.
// 7-bit: the weights are read from L1 as operands, so three rows fit (12 accumulators + a
// broadcast + ones), now that the column sums come packed. 17 packed step weights (83 MB) cycled
// cold, capped at AVX2 on a Zen 5 VM, 2 threads, 4 rounds alternated against two rows: 0.88x the
// time at 3 rows, 0.92x at 5, 0.95x at 6, 0.97x at 12-15, alike at 1 and 10; four rows (18
// registers) spilled and measured no better than three. 7-bit weights too (kPairs,
// 16 registers, one accumulator spilled): three rows against two, 17 packed step weights cycled
// cold, capped at AVX2 on a Zen 5 VM, 8 rounds alternated: 0.85x the time at 3 rows, 0.93x at 5,
// 0.96x at 12-15, alike at 1, 8 and 10. Against 8-bit weights at three rows: 0.88x at 5 rows,
// 0.82-0.84x at 8-15.
CONVS2S_AVX2 void w8a8_avx2_packed(const Operands& g, int64_t rows, int64_t n0, int64_t n1) {
  if (g.plus64) return w8a8_avx2_packed_rows<3, true>(g, rows, n0, n1);
  w8a8_avx2_packed_rows<2, false>(g, rows, n0, n1);
}

#endif  // CONVS2S_X86

// ---- many rows: the math library's int8 GEMM, where its sums are exact ----
// torch._int_mm (oneDNN) multiplies int8 by int8 into int32, rearranging the weight on every call.
// Without VNNI oneDNN multiplies with vpmaddubsw, whose int16 pairs saturate, and its sums are not
// exact; so it is used only where a probe with saturating values comes out exact (once per
// process), and the kernels above run elsewhere.
//
// Which kernel runs is measured per weight shape where the caller passes the packed weight
// (kernel_choice.h, forms w8a8 and w7a8; convs2s_kernels.tune) at up to kSmallGemmMaxRows rows:
// the packed kernel (VNNI or AVX2) against
// the alternative, the library where its sums are exact, else the reducing kernel. On a Zen 4
// (bench/results/amd-epyc-2c, fconv_wmt_en_fr's shapes, cold): the packed VNNI kernel beat the
// library at every row count 1-64 (1.3-3.6x); capped at AVX2, the packed kernel beat the reducing
// one at 5-20 rows on a 1024 x 1536 weight but lost at 12 rows on fc3's 40000 x 512.
// Unmeasured shapes follow rules measured on the Xeon of bench/results/xeon-amx-2c (decoder
// shapes K 512-4096, N 1024-40000): the library from 10 rows (3-7x the reducing VNNI kernel at
// 32-640 rows); AMX from 2 rows on a packed weight, measured or not (1.0-1.3x the reducing VNNI
// kernel at 2 rows, 2-4x the best other from 5 on, 2-4x the library; at 1 row up to 1.5x
// slower); the AVX2 packed kernel from 12 (0.7-0.9x the reducing one from 12, up to 2.5x slower
// at 1); with VNNI, the packed kernel on a packed weight at any row count (1.3-3x the reducing
// one at 1-25 rows on the Zen 4: no sums to reduce, one contiguous stream per 64-column block).
constexpr int64_t kLibraryMinRows = 10;
constexpr int64_t kAmxMinRows = 2;
constexpr int64_t kAvx2PackedMinRows = 12;

enum W8a8Kernel : int64_t { kReducing = 0, kPacked = 1, kLibrary = 2, kAmx = 3 };

bool library_sums_exact() {
  static const bool exact = [] {
#ifdef CONVS2S_X86
    // only CPUs with int8 dot products that accumulate in int32 (AVX512-VNNI, AVX-VNNI; every
    // AMX-INT8 CPU has AVX512-VNNI): elsewhere a library has no exact fast path to find
    if (!__builtin_cpu_supports("avx512vnni") && !__builtin_cpu_supports("avxvnni")) return false;
#else
    return false;
#endif
    const int64_t M = 32, K = 320, N = 72;
    // |x| = |w| = 127 everywhere, signs varied: every int16 pair of a vpmaddubsw path saturates
    at::Tensor x = at::empty({M, K}, at::kChar), w = at::empty({N, K}, at::kChar);
    int8_t* xp = x.data_ptr<int8_t>();
    int8_t* wp = w.data_ptr<int8_t>();
    for (int64_t i = 0; i < M * K; ++i) xp[i] = (i % 7 == 3) ? -127 : 127;
    for (int64_t i = 0; i < N * K; ++i) wp[i] = (i % 5 == 1) ? -127 : 127;
    at::Tensor sums;
    try {
      sums = at::_int_mm(x, w.t()).contiguous();
    } catch (const std::exception&) {
      return false;  // no int8 GEMM in this build
    }
    const int32_t* sp = sums.data_ptr<int32_t>();
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        int64_t want = 0;
        for (int64_t k = 0; k < K; ++k) want += int64_t(xp[m * K + k]) * int64_t(wp[n * K + k]);
        if (sp[m * N + n] != want) return false;
      }
    return true;
  }();
  return exact;
}

// y from the library's int32 sums (M, N), with finish()'s rounding, rows in parallel.
void finish_from_sums(const Operands& g, int64_t M, const int32_t* sums) {
  at::parallel_for(0, M, 1, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      int64_t n = 0;
#ifdef CONVS2S_X86
      for (; n + 4 <= g.N; n += 4)
        finish4(g, m, n, _mm_loadu_si128(reinterpret_cast<const __m128i*>(sums + m * g.N + n)));
#endif
      for (; n < g.N; ++n) finish(g, m, n, sums[m * g.N + n]);
    }
  });
}


}  // namespace

const char* linear_w8a8_isa() {
  if (kernel_has_amx_int8()) return "amx-int8";
  if (kernel_has_vnni()) return "avx512-vnni";
#ifdef CONVS2S_X86
  if (kernel_isa() != Isa::base) return "avx2";
#endif
  return "baseline";
}

bool linear_w8a8_library_exact() { return library_sums_exact(); }

int64_t linear_w8a8_alternative() { return library_sums_exact() ? kLibrary : kReducing; }

int64_t linear_w8a8_kernel(int64_t M, int64_t K, int64_t N, bool has_packed, int64_t activation_bits) {
  TORCH_CHECK(activation_bits == 8 || activation_bits == 7, "linear_w8a8_kernel: activation_bits must be 8 or 7, got ",
              activation_bits);
  if (has_packed && M >= kAmxMinRows && kernel_has_amx_int8()) return kAmx;  // the weight's bytes are its only cost
  const Form form = activation_bits == 7 ? Form::w7a8 : Form::w8a8;
  // measured at 1..kSmallGemmMaxRows rows; past them (an int8 encoder's B x S rows) the rules below,
  // not the alternative: on AVX2 that is the reducing kernel, which loses to the packed one from 12 rows
  if (has_packed && kernel_isa() != Isa::base && M <= kSmallGemmMaxRows)
    if (const auto packed_wins = measured_few_rows(form, at::kChar, K, N, M))
      return *packed_wins ? kPacked : linear_w8a8_alternative();
  if (M >= kLibraryMinRows && library_sums_exact()) return kLibrary;
  if (kernel_has_vnni()) return has_packed || packed_pays(M, K) ? kPacked : kReducing;
  if (kernel_isa() != Isa::base && has_packed && M >= kAvx2PackedMinRows) return kPacked;
  return kReducing;
}

void check_packed(const at::Tensor& packed, int64_t N, int64_t K) {
  const int64_t blocks = (N + kPackedCols - 1) / kPackedCols, K4 = packed_k4(K);
  TORCH_CHECK(packed.scalar_type() == at::kChar && packed.is_contiguous() && packed.dim() == 4 &&
                  packed.size(0) == blocks && packed.size(1) == K4 + 1 && packed.size(2) == kPackedCols &&
                  packed.size(3) == 4,
              "linear_w8a8: packed must be pack_w8a8_weight(qweight): contiguous int8 (", blocks, ", ", K4 + 1, ", ",
              kPackedCols, ", 4)");
  TORCH_CHECK(packed.device().is_cpu(), "linear_w8a8: packed must be on the CPU");
}

at::Tensor linear_w8a8_with(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scale,
                            const c10::optional<at::Tensor>& bias, int64_t kernel,
                            const c10::optional<at::Tensor>& packed, int64_t activation_bits, int64_t weight_bits) {
  CONVS2S_CHECK_CPU(x);
  TORCH_CHECK(weight_bits == 8 || weight_bits == 7, "linear_w8a8: weight_bits must be 8 or 7, got ", weight_bits);
  TORCH_CHECK(activation_bits == 8 || activation_bits == 7, "linear_w8a8: activation_bits must be 8 or 7, got ",
              activation_bits);
  check_int8_linear_args("linear_w8a8", x, qweight, scale);
  TORCH_CHECK(!bias.has_value() || (bias->dim() == 1 && bias->size(0) == qweight.size(0)),
              "linear_w8a8: bias must be (N,)");
  TORCH_CHECK(kernel >= -1 && kernel <= 3, "linear_w8a8: kernel is -1 (auto), 0, 1, 2 or 3, got ", kernel);
  RECORD_FUNCTION("convs2s::linear_w8a8", std::vector<c10::IValue>());
  const int64_t M = x.size(0), K = x.size(1), N = qweight.size(0);
  TORCH_CHECK(K <= 65536, "linear_w8a8: at most 65536 input features (int32 sums), got ", K);
  if (packed.has_value()) check_packed(*packed, N, K);
  TORCH_CHECK(kernel != 3 || (packed.has_value() && kernel_has_amx_int8()),
              "linear_w8a8: the AMX kernel needs AMX-INT8 (uncapped) and a packed weight");
  at::Tensor y = new_output({M, N}, x.options());
  if (M == 0 || N == 0) return y;
  const at::Tensor xc = x.contiguous(), qc = qweight.contiguous(), sc = scale.contiguous();
  const at::Tensor bf = bias.has_value() ? bias->to(at::kFloat).contiguous() : at::Tensor();
  const bool vnni = kernel_has_vnni();
  const Isa isa = kernel_isa();
  const int64_t chosen = kernel >= 0 ? kernel : linear_w8a8_kernel(M, K, N, packed.has_value(), activation_bits);
  const bool amx = chosen == kAmx, library = chosen == kLibrary;
  const bool use_packed = chosen == kPacked;  // the packed block kernel (VNNI or AVX2; the baseline has one kernel)
  // the kernels read whole vectors (one spare: full loads never leave the buffer) and AMX whole
  // 16-row tiles (zero rows past M); the library takes the signed rows alone, unpadded
  const int64_t Kp = library ? K : (K + kPad - 1) / kPad * kPad + kPad;
  const int64_t rows_alloc = amx ? (M + kAmxRows - 1) / kAmxRows * kAmxRows : M;
  std::vector<int8_t> xq(rows_alloc * Kp);
  const bool unsigned_copy = !library && !amx;
  // 7-bit activations on the AVX2 packed kernel: xq + 64 (no sign moves); elsewhere as with 8 bits
  const bool plus64 = activation_bits == 7 && use_packed && !vnni && isa != Isa::base;
  const Unsigned enc = vnni ? Unsigned::plus128 : plus64 ? Unsigned::plus64 : Unsigned::abs;
  const int qmax = activation_bits == 7 ? 63 : 127;
  std::vector<uint8_t> xu(unsigned_copy ? M * Kp : 0);
  std::vector<float> sx(M);
  const float* xp = xc.data_ptr<float>();
  // rows in parallel once there are enough of them to pay for waking the other threads
  at::parallel_for(0, M, std::max<int64_t>(1, 16384 / std::max<int64_t>(K, 1)), [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m)
      quantize_row(xp + m * K, K, &xq[m * Kp], unsigned_copy ? &xu[m * Kp] : nullptr, Kp, qmax, enc, &sx[m], isa);
  });
  const Operands g{xq.data(), xu.data(), Kp, qc.data_ptr<int8_t>(), N, K, sx.data(), sc.data_ptr<float>(),
                   bf.defined() ? bf.data_ptr<float>() : nullptr, y.data_ptr<float>(), N,
                   packed.has_value() ? packed->data_ptr<int8_t>() : nullptr, plus64,
                   /*weight7=*/plus64 && weight_bits == 7};
  if (library) {
    const at::Tensor sums = at::_int_mm(at::from_blob(xq.data(), {M, K}, at::kChar), qc.t()).contiguous();
    finish_from_sums(g, M, sums.data_ptr<int32_t>());
    return y;
  }
  // whole 64-column blocks per task (a packed weight is laid out in them), dealt out in runs
  const int64_t blocks = (N + kPackedCols - 1) / kPackedCols;
  parallel_runs(blocks, [&](int64_t b0, int64_t b1) {
    const int64_t n0 = b0 * kPackedCols, n1 = std::min(N, b1 * kPackedCols);
#ifdef CONVS2S_X86
    if (amx) return w8a8_amx(g, M, n0, n1);
    if (vnni) return use_packed ? w8a8_vnni_packed(g, M, n0, n1) : w8a8_vnni(g, M, n0, n1);
    if (isa != Isa::base) return use_packed ? w8a8_avx2_packed(g, M, n0, n1) : w8a8_avx2(g, M, n0, n1);
#endif
    w8a8_base(g, M, n0, n1);
  });
  (void)isa;
  (void)use_packed;
  return y;
}

at::Tensor linear_w8a8(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scale,
                       const c10::optional<at::Tensor>& bias, const c10::optional<at::Tensor>& packed,
                       int64_t activation_bits, int64_t weight_bits) {
  return linear_w8a8_with(x, qweight, scale, bias, -1, packed, activation_bits, weight_bits);
}

}  // namespace convs2s
