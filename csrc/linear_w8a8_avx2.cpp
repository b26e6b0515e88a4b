// linear_w8a8's AVX2 kernels: |xq| times the weight with x's sign moved onto it (vpsignb +
// vpmaddubsw + vpmaddwd), reducing and on packed blocks (8-bit, or 7-bit activations as xq + 64).
#include "linear_w8a8.h"
#include "row_tiles.h"
#include "vec.h"

#include <algorithm>
#include <cstring>
#include <vector>
#include "stream_ahead.h"

#ifdef CONVS2S_X86

namespace convs2s {
namespace w8a8 {
namespace {

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

}  // namespace

CONVS2S_AVX2 void avx2(const Operands& g, int64_t rows, int64_t n0, int64_t n1) {
  constexpr int MT = 2, NT = 4;  // 8 accumulators + 4 weight vectors + 2 activations + ones of 16 ymm
  int64_t n = n0;
  for (; n + NT <= n1; n += NT)
    for (int64_t r = 0; r < rows; r += MT)
      CONVS2S_ROWS_SWITCH(std::min<int64_t>(MT, rows - r), MT, (avx2_tile<M, NT>(g, r, n)));
  for (; n < n1; ++n)
    for (int64_t r = 0; r < rows; r += MT)
      CONVS2S_ROWS_SWITCH(std::min<int64_t>(MT, rows - r), MT, (avx2_tile<M, 1>(g, r, n)));
}

namespace {


// The first row tile of each pass over a block half prefetches the half's own stream this far ahead
// into L1 (its two lines of each 256-byte group of 4 k; across the block's end into the next block,
// which follows it in the packed weight). Without it every thread's first block, and whatever the
// hardware prefetchers left behind, arrived at the loads' pace: a step's products ran at about the
// memory's time plus the arithmetic's. It adds to the prefetch shares below, which still pay
// (bench/results/kernel-decisions.md#w8a8-avx2-prefetch). The VNNI kernel has its own
// (kVnniAheadBytes), since the column sums come packed. The distance,
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
    // from the caches: with the hardware prefetchers alone it sat idle then
    // (bench/results/kernel-decisions.md#w8a8-avx2-next-block-share). Only within a thread's run
    // of blocks: a run of one block (a weight of under 2048 columns at 2 threads) prefetches nothing.
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

}  // namespace

// Row tiles of 16 ymm. 8-bit: 8 accumulators + 4 weight vectors + 2 broadcasts + ones, two rows.
// 7-bit: the weights are read from L1 as operands, so three rows fit (12 accumulators + a
// broadcast + ones), now that the column sums come packed, and run faster than two; four rows (18
// registers) spill. 7-bit weights too (kPairs, 16 registers, one accumulator spilled) take three
// rows, again faster than two (bench/results/kernel-decisions.md#w8a8-avx2-packed-row-tiles).
CONVS2S_AVX2 void avx2_packed(const Operands& g, int64_t rows, int64_t n0, int64_t n1) {
  if (g.plus64) return w8a8_avx2_packed_rows<3, true>(g, rows, n0, n1);
  w8a8_avx2_packed_rows<2, false>(g, rows, n0, n1);
}

}  // namespace w8a8
}  // namespace convs2s

#endif  // CONVS2S_X86
