// linear_w8a8's AVX-512 kernels: VNNI (vpdpbusd, unsigned activations xq + 128 times signed
// weights) reducing and on packed blocks, and AMX-INT8 (tdpbssd, signed x signed) on packed blocks.
#include "linear_w8a8.h"
#include "row_tiles.h"
#include "vec.h"

#include <algorithm>
#include <cstring>
#include <vector>

#ifdef CONVS2S_X86

namespace convs2s {
namespace w8a8 {
namespace {

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

}  // namespace

CONVS2S_VNNI void vnni(const Operands& g, int64_t rows, int64_t n0, int64_t n1) {
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


namespace {

// ---- AVX-512 VNNI, many rows: each column block packed once so that no sum needs reducing ----
// With many rows the products are compute-bound and the horizontal sums of the kernel above cost
// as much as the dot products when K is short (fc3's 512). Here a block of 64 weight rows is
// rearranged to [16 ceil(K/64)][64][4] bytes and its column sums (pack_w8a8_weight's layout, or per call; one vector:
// 4 consecutive k of 16 outputs), then each activation's 4 bytes are broadcast against it: every
// vpdpbusd adds into 16 distinct outputs.

// The first row tile of a block prefetches the block's stream this far ahead into L1 (its four
// lines of each group of 4 k; past the block's end into the next block, which follows it): faster
// from 5 rows on, alike at 1 (bench/results/kernel-decisions.md#w8a8-vnni-prefetch).
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

}  // namespace

CONVS2S_VNNI void vnni_packed(const Operands& g, int64_t rows, int64_t n0, int64_t n1) {
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

namespace {

// ---- AMX-INT8: tiles of 16 rows x 64 bytes, signed x signed (tdpbssd), on packed blocks ----
// One block of 64 columns is four C tiles (16 rows x 16 int32); per 64 bytes of k, one A tile of
// activations and four B tiles straight from the packed weight (16 groups of 4 k x 16 columns,
// rows 256 bytes apart). The tile unit's 1024 multiply-adds a cycle leave the weight's bytes as
// the only cost, at any row count. Activations are padded to whole 16-row tiles (zero rows).

#define CONVS2S_AMX __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vnni,avx512vl")))


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
}  // namespace

CONVS2S_AMX void amx(const Operands& g, int64_t rows, int64_t n0, int64_t n1) {
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

}  // namespace w8a8
}  // namespace convs2s

#endif  // CONVS2S_X86
