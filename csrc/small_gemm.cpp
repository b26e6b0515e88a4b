// Matrix products with few rows (decoding: one row per sentence x beam): float32, bf16 or int8
// weights, float32 activations and accumulation.
//
// With a few dozen rows or fewer, a GEMM library packs the whole weight matrix for a handful of
// FLOPs per element and runs below the memory bandwidth that bounds the product. These kernels
// read every weight from memory once, in its stored layout, and keep a register tile of
// accumulators (rows x columns) sized to the instruction set's register file: 32 zmm for
// AVX-512, 16 ymm for AVX2. Rows beyond one tile re-read the same weight block from L1/L2 (the
// block is cut along K so that it stays there; the (K, N) kernel reads a packed copy of it below
// 16 rows a chunk), never from memory. Written with GCC/Clang vector
// extensions and compiled three times (AVX-512, AVX2+FMA, baseline), the best chosen at run time.

#include "small_gemm.h"
#include "common.h"
#include "huge_pages.h"
#include "row_tiles.h"
#include "isa.h"
#include "vec.h"

#include <ATen/Parallel.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/record_function.h>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>

namespace convs2s {

namespace {

template <typename V> CONVS2S_INLINE V load(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// bf16 weights: widened to float32 (a bf16 is the top half of a float32), half the bytes read.
template <typename V> CONVS2S_INLINE V load(const at::BFloat16* p) {
  return widen_bf16_v<V>(reinterpret_cast<const uint16_t*>(p));
}

// int8 weights (the per-output-channel scale is applied after the sum): a quarter of the bytes.
// Widened in steps: GCC vectorises int8->int16->int32 (vpmovsx) but scalarises int8->float.
template <typename V> CONVS2S_INLINE V load(const int8_t* p) {
  typename Vec<V>::i8 q;
  std::memcpy(&q, p, sizeof(q));
  const auto w = __builtin_convertvector(__builtin_convertvector(q, typename Vec<V>::i16), typename Vec<V>::i32);
  return __builtin_convertvector(w, V);
}

template <typename V> CONVS2S_INLINE void store(float* p, V v) { std::memcpy(p, &v, sizeof(v)); }

CONVS2S_INLINE float to_float(float v) { return v; }
CONVS2S_INLINE float to_float(int8_t v) { return static_cast<float>(v); }
CONVS2S_INLINE float to_float(at::BFloat16 v) { return static_cast<float>(v); }

// Horizontal sums as a tree of halves (a scalar loop over the lanes costs more than the dot
// product itself when K is short: fc3's K is 512).
CONVS2S_INLINE float hsum(v4 v) {
  const v4 a = v + __builtin_shufflevector(v, v, 2, 3, 0, 1);
  return a[0] + a[1];
}
CONVS2S_INLINE float hsum(v8 v) {
  return hsum(__builtin_shufflevector(v, v, 0, 1, 2, 3) + __builtin_shufflevector(v, v, 4, 5, 6, 7));
}
CONVS2S_INLINE float hsum(v16 v) {
  return hsum(__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
              __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15));
}

// The operands of one product: y[m, n] = s[n] * sum_k x[m, k] w(k, n) + b[n] (s, b may be null).
template <typename W>
struct Gemm {
  const float* x;
  int64_t ldx;
  const W* w;
  int64_t K, N;
  const float* b;
  const float* s;
  float* y;
  int64_t ldy;
};

// Software prefetch. The (K, N) kernel, in tiles of two rows or more: the more rows a tile has,
// the longer it computes on each weight vector and the fewer loads it keeps in flight, which the
// hardware prefetchers alone do not make up for; every row tile prefetches, not only the first
// (bench/results/kernel-decisions.md#small-gemm-kn-prefetch). The (N, K) kernel: see nk_tile.
template <int M> constexpr bool kPrefetch = M >= 2;
// The line at `offset` elements from p, which may lie past the weight's end (a prefetch never
// faults; the address is formed as an integer, not as an out-of-range pointer). `Locality` 3
// fetches into L1, 2 into L2.
template <int Locality = 3, typename W> CONVS2S_INLINE void prefetch(const W* p, int64_t offset) {
  __builtin_prefetch(reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(p) + offset * sizeof(W)), 0, Locality);
}
// The cache lines of `bytes` bytes from `offset` elements on (a tile's piece of one weight row).
template <typename W> CONVS2S_INLINE void prefetch_lines(const W* p, int64_t offset, int bytes) {
  for (int b = 0; b < bytes; b += 64) prefetch(reinterpret_cast<const char*>(p), offset * int64_t(sizeof(W)) + b);
}

// ---- (K, N) weights (the linearised conv weight): broadcast x[m, k] times weight row pieces ----

const Isa kIsa = kernel_isa();

// Weight rows a panel sweeps at a time (kn_panel): KC, or at AVX-512 KC_WIDE from
// kWideChunkRows rows on. Few rows are memory-bound: 16 rows walked side by side are 16 streams
// the hardware prefetchers follow. Many rows are compute-bound: each tile stores and reloads its
// accumulators once per chunk, and a 64-row chunk (16 KB of a 64-column piece, re-read from L1
// or L2 by the next row tile) amortises that 4x. KC_WIDE pays at AVX-512 from about 16 rows on
// and loses below; AVX2 (16-column tiles) keeps KC
// (bench/results/kernel-decisions.md#small-gemm-kn-wide-chunk).
constexpr int64_t KC = 16;
constexpr int64_t KC_WIDE = 64;
constexpr int64_t kWideChunkRows = 16;
CONVS2S_INLINE int64_t kn_chunk(int64_t rows) {
  return kIsa == Isa::avx512 && rows >= kWideChunkRows ? KC_WIDE : KC;
}
// The (K, N) kernel prefetches the weight rows this far ahead of the row it reads.
constexpr int64_t kKnPrefetchAhead = 16;

// Where a tile's weight vectors come from: the weight itself (`stream`), the weight with a
// widened copy of the tile's chunk piece kept in a small contiguous buffer for the row tiles
// after it (`stream_and_pack`), or that buffer (`packed`).
enum class KnSource { stream, stream_and_pack, packed };

// Tile: rows [r, r + M) x columns [c, c + VT * lanes), k in [k0, k1); accumulators start from y
// (partial sums of earlier K chunks) unless this is the first chunk.
template <typename V, int M, int VT, KnSource kSrc = KnSource::stream, typename W>
CONVS2S_INLINE void kn_tile(const Gemm<W>& g, int64_t r, int64_t c, int64_t k0, int64_t k1, bool first,
                            float* pack = nullptr) {
  constexpr int L = Vec<V>::lanes;
  V acc[M][VT];
  for (int m = 0; m < M; ++m)
    for (int v = 0; v < VT; ++v) acc[m][v] = first ? V{} : load<V>(g.y + (r + m) * g.ldy + c + v * L);
  const float* x = g.x + r * g.ldx;
  for (int64_t k = k0; k < k1; ++k) {
    V wv[VT];
    const int64_t piece = (k - k0) * VT * L;  // this weight row's place in the packed buffer
    if constexpr (kSrc == KnSource::packed) {
      for (int v = 0; v < VT; ++v) wv[v] = load<V>(pack + piece + v * L);
    } else {
      for (int v = 0; v < VT; ++v) wv[v] = load<V>(g.w + k * g.N + c + v * L);
      if constexpr (kSrc == KnSource::stream_and_pack)
        for (int v = 0; v < VT; ++v) store<V>(pack + piece + v * L, wv[v]);
    }
    // the same columns kKnPrefetchAhead rows on (with KC rows a chunk: the next chunk's piece);
    // packed tiles too ask for the lines the first tile asked for, as every tile did before the
    // packing, not the chunk after next (bench/results/kernel-decisions.md#small-gemm-kn-prefetch)
    if constexpr (kPrefetch<M>)
      prefetch_lines(g.w, (k + kKnPrefetchAhead) * g.N + c, VT * L * sizeof(W));
    for (int m = 0; m < M; ++m) {
      const float xv = x[m * g.ldx + k];
      for (int v = 0; v < VT; ++v) acc[m][v] += xv * wv[v];
    }
  }
  for (int m = 0; m < M; ++m)
    for (int v = 0; v < VT; ++v) store<V>(g.y + (r + m) * g.ldy + c + v * L, acc[m][v]);
}

// Rows cut into tiles of at most MT, as even as can be (15 rows: 5 + 5 + 5, not 6 + 6 + 3): a
// small last tile reads every weight vector and prefetch line for few FMAs; the (N, K) kernel
// gained nothing and keeps its tiles. A loop over tiles, not a function taking a lambda: a
// lambda's body is compiled without the caller's target attribute (the (N, K) kernel ran several
// times slower so: bench/results/kernel-decisions.md#small-gemm-even-tiles).
struct EvenTiles {
  int64_t count, base, extra;
  EvenTiles(int64_t rows, int64_t most) : count((rows + most - 1) / most), base(rows / count), extra(rows % count) {}
  int64_t rows(int64_t t) const { return base + (t < extra); }
};

// Columns [n0, n1) of every row (one thread's panel). K is swept in chunks of kc weight rows
// (kn_chunk), each chunk across the whole panel: kc sequential streams that the hardware prefetchers follow
// (a narrow column block walked down K jumps a page per row and starves them). Partial sums wait
// in y. With more rows than one tile and KC rows a chunk, the first row tile copies its chunk
// piece (widened to float32) into a contiguous buffer that the next row tiles read: weight rows
// 4-32 KB apart (N of 1024-8192 floats) fall into a few L1 sets, more lines than their ways, so
// the piece re-read in place came back from L2; at AVX-512's 64-row chunk the copy cost more than
// it saved (bench/results/kernel-decisions.md#small-gemm-kn-pack-buffer).
template <typename V, int MT, int VT, typename W>
CONVS2S_INLINE void kn_panel(const Gemm<W>& g, int64_t rows, int64_t n0, int64_t n1) {
  constexpr int L = Vec<V>::lanes;
  static_assert(MT >= 1 && MT <= 8, "CONVS2S_ROWS_SWITCH dispatches tiles of 1..8 rows");
  alignas(64) float pack[KC * VT * L];
  const int64_t kc = kn_chunk(rows);
  const bool packing = rows > MT && kc == KC;
  const EvenTiles tiles(rows, MT);
  for (int64_t k0 = 0; k0 < g.K; k0 += kc) {
    const int64_t k1 = std::min(g.K, k0 + kc);
    const bool first = k0 == 0;
    int64_t c = n0;
    for (; c + VT * L <= n1; c += VT * L)
      for (int64_t t = 0, r = 0; t < tiles.count; r += tiles.rows(t), ++t) {
        if (!packing)
          CONVS2S_ROWS_SWITCH(tiles.rows(t), MT, (kn_tile<V, M, VT>(g, r, c, k0, k1, first)))
        else if (t == 0)
          CONVS2S_ROWS_SWITCH(tiles.rows(t), MT, (kn_tile<V, M, VT, KnSource::stream_and_pack>(g, r, c, k0, k1, first, pack)))
        else
          CONVS2S_ROWS_SWITCH(tiles.rows(t), MT, (kn_tile<V, M, VT, KnSource::packed>(g, r, c, k0, k1, first, pack)))
      }
    for (; c + L <= n1; c += L)
      for (int64_t t = 0, r = 0; t < tiles.count; r += tiles.rows(t), ++t)
        CONVS2S_ROWS_SWITCH(tiles.rows(t), MT, (kn_tile<V, M, 1>(g, r, c, k0, k1, first)))
    for (; c < n1; ++c) {  // ragged edge
      for (int64_t m = 0; m < rows; ++m) {
        float sum = first ? 0.f : g.y[m * g.ldy + c];
        for (int64_t k = k0; k < k1; ++k) sum += g.x[m * g.ldx + k] * to_float(g.w[k * g.N + c]);
        g.y[m * g.ldy + c] = sum;
      }
    }
  }
  if (g.s == nullptr && g.b == nullptr) return;
  for (int64_t m = 0; m < rows; ++m)
    for (int64_t c = n0; c < n1; ++c) {
      float& out = g.y[m * g.ldy + c];
      out = (g.s ? g.s[c] * out : out) + (g.b ? g.b[c] : 0.f);
    }
}

// ---- (K, N) weights packed once (pack_kn_weight): column blocks one after another ----
//
// A decoding step's conv and Linear weights never change, so they can be laid out once for the kernel: the
// (K, N) matrix cut into blocks of NB = VT * lanes columns, each block stored as its own (K, NB)
// row-major run. A block's product then reads one contiguous stream (the kernel above walks 16
// weight rows side by side, 16 streams 4-32 KB apart), keeps its accumulators in registers
// across the whole of K when one row tile holds every row, and needs no pack buffer for the row
// tiles after the first: they re-read a chunk of the block that the first tile just brought to L1.

// Bytes of a block's chunk that the row tiles share while it sits in L1 (a third to a half of a
// 32-48 KB L1; the tiles' x rows and the next chunk's prefetched lines need room too).
constexpr int64_t kPackedChunkBytes = 16 << 10;
// The first row tile asks for the lines this far ahead of the row it reads (into L1): 16 rows of
// a 64-column AVX-512 block, 256 rows of a 16-column AVX2 one: at AVX2 the longer distance won,
// at AVX-512 anything past 1 KB did alike (bench/results/kernel-decisions.md#small-gemm-packed-ahead).
template <int64_t NB> constexpr int64_t kPackedAheadBytes = NB >= 64 ? 4 << 10 : 16 << 10;

// A row tile's share of the next chunk's weight rows (`rows` of them from `w`), which it asks for
// (into L1) one row every `every` of its own rows, so that the memory streams while it computes.
template <typename W> struct ChunkShare {
  const W* w = nullptr;
  int64_t rows = 0;
  int64_t every = 1;
};

// Rows [0, M) of x times k in [k0, k1) of one block (its rows NB = VT * lanes wide) into y's
// columns [0, NB); the last chunk applies scale and bias (either may be null) on the way out.
// kAhead: prefetch this chunk's rows ahead of the ones read; `share`: some of the next chunk's.
template <typename V, int M, int VT, bool kAhead, typename W>
CONVS2S_INLINE void kp_tile(const float* x, int64_t ldx, const W* blk, int64_t k0, int64_t k1, bool first, bool last,
                            float* y, int64_t ldy, const float* s, const float* b, ChunkShare<W> share) {
  constexpr int L = Vec<V>::lanes;
  constexpr int64_t NB = VT * L;
  constexpr int64_t ahead = kPackedAheadBytes<NB> / (NB * int64_t(sizeof(W)));
  V acc[M][VT];
  for (int m = 0; m < M; ++m)
    for (int v = 0; v < VT; ++v) acc[m][v] = first ? V{} : load<V>(y + m * ldy + v * L);
  int64_t due = 0;
  for (int64_t k = k0; k < k1; ++k) {
    V wv[VT];
    for (int v = 0; v < VT; ++v) wv[v] = load<V>(blk + k * NB + v * L);
    if constexpr (kAhead) prefetch_lines(blk, (k + ahead) * NB, NB * sizeof(W));
    if (share.rows > 0 && due-- == 0) {
      prefetch_lines(share.w, 0, NB * sizeof(W));
      share.w += NB;
      --share.rows;
      due = share.every - 1;
    }
    for (int m = 0; m < M; ++m) {
      const float xv = x[m * ldx + k];
      for (int v = 0; v < VT; ++v) acc[m][v] += xv * wv[v];
    }
  }
  if (last && (s || b))
    for (int v = 0; v < VT; ++v) {
      const V sv = s ? load<V>(s + v * L) : V{} + 1.f, bv = b ? load<V>(b + v * L) : V{};
      for (int m = 0; m < M; ++m) acc[m][v] = acc[m][v] * sv + bv;
    }
  for (int m = 0; m < M; ++m)
    for (int v = 0; v < VT; ++v) store<V>(y + m * ldy + v * L, acc[m][v]);
}

// Blocks [b0, b1) of a packed weight, every row. One row tile: the whole of K at once, prefetching
// ahead. More: K in chunks of kPackedChunkBytes, every row tile over a chunk (from L1) before the
// next, each tile asking for an equal share of the next chunk (this block's, or the next block's
// first) while it computes: the first tile alone prefetching ahead left the memory idle while the
// later tiles computed (bench/results/kernel-decisions.md#small-gemm-packed-chunk-share). A last
// block narrower than NB is computed into a scratch tile and copied out.
template <typename V, int MT, int VT, typename W>
CONVS2S_INLINE void kp_blocks(const Gemm<W>& g, int64_t rows, int64_t b0, int64_t b1) {
  constexpr int L = Vec<V>::lanes;
  constexpr int64_t NB = VT * L;
  static_assert(MT >= 1 && MT <= 8, "CONVS2S_ROWS_SWITCH dispatches tiles of 1..8 rows");
  const EvenTiles tiles(rows, MT);
  const int64_t kc = tiles.count == 1 ? g.K : std::max<int64_t>(1, kPackedChunkBytes / (NB * int64_t(sizeof(W))));
  alignas(64) float scratch[kSmallGemmMaxRows * NB];
  for (int64_t blk = b0; blk < b1; ++blk) {
    const W* w = g.w + blk * g.K * NB;
    const int64_t c = blk * NB;
    const bool ragged = c + NB > g.N;
    float* y = ragged ? scratch : g.y + c;
    const int64_t ldy = ragged ? NB : g.ldy;
    const float* s = ragged || !g.s ? nullptr : g.s + c;
    const float* b = ragged || !g.b ? nullptr : g.b + c;
    for (int64_t k0 = 0; k0 < g.K; k0 += kc) {
      const int64_t k1 = std::min(g.K, k0 + kc);
      const bool first = k0 == 0, last = k1 == g.K;
      // the next chunk: this block's rows [k1, k1 + kc), or the next block's first kc rows
      const W* next = k1 < g.K ? w + k1 * NB : (blk + 1 < b1 ? w + g.K * NB : nullptr);
      const int64_t next_rows = !next ? 0 : std::min(kc, k1 < g.K ? g.K - k1 : g.K);
      const int64_t per_tile = (next_rows + tiles.count - 1) / tiles.count;
      for (int64_t t = 0, r = 0; t < tiles.count; r += tiles.rows(t), ++t) {
        ChunkShare<W> share;
        if (tiles.count > 1) {
          const int64_t s0 = std::min(next_rows, t * per_tile);
          share.w = next + s0 * NB;
          share.rows = std::min(next_rows, s0 + per_tile) - s0;
          share.every = std::max<int64_t>(1, (k1 - k0) / std::max<int64_t>(1, share.rows));
        }
        // the first tile prefetches ahead where nothing asked for its chunk: one tile, or a run's first chunk
        if (t == 0 && (tiles.count == 1 || (first && blk == b0)))
          CONVS2S_ROWS_SWITCH(tiles.rows(t), MT,
                              (kp_tile<V, M, VT, true>(g.x + r * g.ldx, g.ldx, w, k0, k1, first, last, y + r * ldy, ldy, s, b, share)))
        else
          CONVS2S_ROWS_SWITCH(tiles.rows(t), MT,
                              (kp_tile<V, M, VT, false>(g.x + r * g.ldx, g.ldx, w, k0, k1, first, last, y + r * ldy, ldy, s, b, share)))
      }
    }
    if (ragged)
      for (int64_t m = 0; m < rows; ++m)
        for (int64_t j = c; j < g.N; ++j) {
          const float v = scratch[m * NB + j - c];
          g.y[m * g.ldy + j] = (g.s ? g.s[j] * v : v) + (g.b ? g.b[j] : 0.f);
        }
  }
}

// ---- (N, K) weights (nn.Linear): dot products along contiguous weight rows ----

// Blocks of NT weight rows ahead that nk_tile prefetches (1, 2 and 4 measured alike).
constexpr int64_t kNkAheadBlocks = 2;

// Tile `tile` of `tiles` (rows [r, r + M)) x outputs [n, n + NT), the whole of K; finishes y
// (scale and bias). While it computes, it prefetches into L2 its share of the block of NT weight
// rows kNkAheadBlocks on: tile t takes the t-th of `tiles` equal stretches of the block's lines,
// spread evenly over its own loop, so that the memory keeps streaming while later row tiles
// compute on the block in L1. Prefetching only in the first row tile (into L1, 1 KB ahead)
// left it idle then; dealing the lines out in turn instead (tile t the lines t, t + tiles, ...)
// gained less (bench/results/kernel-decisions.md#small-gemm-nk-prefetch).
template <typename V, int M, int NT, typename W>
CONVS2S_INLINE void nk_tile(const Gemm<W>& g, int64_t r, int64_t n, int tile, int tiles) {
  constexpr int L = Vec<V>::lanes;
  const int64_t KL = g.K - g.K % L;
  const int64_t ahead = kNkAheadBlocks * NT * g.K;
  V acc[M][NT];
  for (int m = 0; m < M; ++m)
    for (int j = 0; j < NT; ++j) acc[m][j] = V{};
  const W* w = g.w + n * g.K;
  const float* x = g.x + r * g.ldx;
  // Slot q of all tiles' line slots (tile t's are [t * lines, (t + 1) * lines)) prefetches line
  // q / tiles of each of the block's rows when q is a multiple of `tiles`.
  constexpr int64_t kLine = 64 / int64_t(sizeof(W));  // weights per cache line (>= L)
  const int64_t lines = (KL + kLine - 1) / kLine;
  int64_t q = tile * lines, due = q % tiles;
  for (int64_t k = 0; k < KL; k += L) {
    V wv[NT];
    for (int j = 0; j < NT; ++j) wv[j] = load<V>(w + j * g.K + k);
    if (k % kLine == 0) {  // a line slot: this k starts a cache line along the weight rows
      if (due == 0)
        for (int j = 0; j < NT; ++j) prefetch<2>(w, ahead + j * g.K + q / tiles * kLine);
      ++q;
      if (++due == tiles) due = 0;
    }
    for (int m = 0; m < M; ++m) {
      const V xv = load<V>(x + m * g.ldx + k);
      for (int j = 0; j < NT; ++j) acc[m][j] += xv * wv[j];
    }
  }
  for (int m = 0; m < M; ++m)
    for (int j = 0; j < NT; ++j) {
      float sum = hsum(acc[m][j]);
      for (int64_t k = KL; k < g.K; ++k) sum += x[m * g.ldx + k] * to_float(w[j * g.K + k]);
      const int64_t col = n + j;
      g.y[(r + m) * g.ldy + col] = (g.s ? g.s[col] * sum : sum) + (g.b ? g.b[col] : 0.f);
    }
}

template <typename V, int MT, int NT, typename W>
CONVS2S_INLINE void nk_block(const Gemm<W>& g, int64_t rows, int64_t n0, int64_t n1) {
  static_assert(MT >= 1 && MT <= 8, "CONVS2S_ROWS_SWITCH dispatches tiles of 1..8 rows");
  const int tiles = int((rows + MT - 1) / MT);
  int64_t n = n0;
  for (; n + NT <= n1; n += NT)
    for (int64_t r = 0; r < rows; r += MT)
      CONVS2S_ROWS_SWITCH(std::min<int64_t>(MT, rows - r), MT, (nk_tile<V, M, NT>(g, r, n, int(r / MT), tiles)))
  for (; n < n1; ++n)
    for (int64_t r = 0; r < rows; r += MT)
      CONVS2S_ROWS_SWITCH(std::min<int64_t>(MT, rows - r), MT, (nk_tile<V, M, 1>(g, r, n, int(r / MT), tiles)))
}

// One variant per instruction set. Register tiles: AVX-512 has 32 zmm (kn: 6 rows x 4 vectors =
// 24 accumulators + 4 weight vectors; nk: 4 x 4), AVX2 16 ymm (kn: 6 x 2 = 12 + 2; nk: 4 x 2),
// the baseline (SSE2, 16 xmm holding half a v8 each) smaller still.
#define CONVS2S_DEFINE_VARIANT(SUFFIX, TARGET, VT_, KN_MT, KN_VT, NK_MT, NK_NT)                                 \
  template <typename W>                                                                                         \
  TARGET void kn_##SUFFIX(const Gemm<W>& g, int64_t rows, int64_t n0, int64_t n1) {                             \
    kn_panel<VT_, KN_MT, KN_VT>(g, rows, n0, n1);                                                               \
  }                                                                                                             \
  template <typename W>                                                                                         \
  TARGET void nk_##SUFFIX(const Gemm<W>& g, int64_t rows, int64_t n0, int64_t n1) {                             \
    nk_block<VT_, NK_MT, NK_NT>(g, rows, n0, n1);                                                               \
  }                                                                                                             \
  template <typename W>                                                                                         \
  TARGET void kp_##SUFFIX(const Gemm<W>& g, int64_t rows, int64_t b0, int64_t b1) {                             \
    kp_blocks<VT_, KN_MT, KN_VT>(g, rows, b0, b1);                                                              \
  }

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
CONVS2S_DEFINE_VARIANT(avx512, __attribute__((target("avx512f"))), v16, 6, 4, 4, 4)
CONVS2S_DEFINE_VARIANT(avx2, __attribute__((target("avx2,fma"))), v8, 6, 2, 4, 2)
#endif
CONVS2S_DEFINE_VARIANT(base, , v8, 2, 2, 2, 2)

// Column blocks of 64 per task: every thread streams whole 256-byte pieces of each weight row.
constexpr int64_t kBlock = 64;

// The (N, K) or (K, N) kernel of the instruction set chosen at load time, over outputs [n0, n1).
template <bool kNK, typename W> void columns(const Gemm<W>& g, int64_t rows, int64_t n0, int64_t n1) {
  switch (kIsa) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    case Isa::avx512: return kNK ? nk_avx512(g, rows, n0, n1) : kn_avx512(g, rows, n0, n1);
    case Isa::avx2: return kNK ? nk_avx2(g, rows, n0, n1) : kn_avx2(g, rows, n0, n1);
#endif
    default: return kNK ? nk_base(g, rows, n0, n1) : kn_base(g, rows, n0, n1);
  }
}

// The packed (K, N) kernel of the instruction set chosen at load time, over blocks [b0, b1).
template <typename W> void packed_blocks(const Gemm<W>& g, int64_t rows, int64_t b0, int64_t b1) {
  switch (kIsa) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    case Isa::avx512: return kp_avx512(g, rows, b0, b1);
    case Isa::avx2: return kp_avx2(g, rows, b0, b1);
#endif
    default: return kp_base(g, rows, b0, b1);
  }
}

}  // namespace

int64_t kn_packed_width() { return kIsa == Isa::avx512 ? 4 * 16 : 2 * 8; }

template <typename W>
void small_gemm_kn_packed(int64_t rows, const float* x, int64_t ldx, const W* packed, int64_t K, int64_t N,
                          const float* b, float* y, int64_t ldy, const float* s) {
  TORCH_CHECK(rows >= 1 && rows <= kSmallGemmMaxRows, "small_gemm_kn_packed takes 1..", kSmallGemmMaxRows, " rows");
  RECORD_FUNCTION("convs2s::few_rows_kn_packed", std::vector<c10::IValue>());
  const Gemm<W> g{x, ldx, packed, K, N, b, s, y, ldy};
  const int64_t blocks = (N + kn_packed_width() - 1) / kn_packed_width();
  // runs of whole blocks, each one stream through memory, dealt out as threads come free: a fixed
  // half each waited for a slower core (bench/results/kernel-decisions.md#small-gemm-packed-runs)
  parallel_runs(blocks, [&](int64_t b0, int64_t b1) { packed_blocks(g, rows, b0, b1); });
}

at::Tensor pack_kn_weight(const at::Tensor& w) {
  TORCH_CHECK(w.dim() == 2, "pack_kn_weight: the weight must be (K, N)");
  TORCH_CHECK(w.scalar_type() == at::kFloat || w.scalar_type() == at::kBFloat16, "pack_kn_weight: float32 or bf16");
  const int64_t K = w.size(0), N = w.size(1), NB = kn_packed_width(), blocks = (N + NB - 1) / NB;
  at::Tensor padded = w.contiguous();
  if (blocks * NB != N) padded = at::constant_pad_nd(padded, {0, blocks * NB - N});
  // the decoding step streams it from memory every step: on huge pages (huge_pages.h)
  at::Tensor out = huge_page_empty({blocks, K, NB}, w.scalar_type());
  out.copy_(padded.view({K, blocks, NB}).permute({1, 0, 2}));
  return out;
}

const char* small_gemm_isa() {
  switch (kIsa) {
    case Isa::avx512: return "avx512f";
    case Isa::avx2: return "avx2+fma";
    default: return "baseline";
  }
}

template <typename W>
void small_gemm_nk(int64_t rows, const float* x, int64_t ldx, const W* w, int64_t N, int64_t K,
                   const float* b, float* y, int64_t ldy, const float* s) {
  TORCH_CHECK(rows >= 1 && rows <= kSmallGemmMaxRows, "small_gemm_nk takes 1..", kSmallGemmMaxRows, " rows");
  RECORD_FUNCTION("convs2s::few_rows_nk", std::vector<c10::IValue>());
  const Gemm<W> g{x, ldx, w, K, N, b, s, y, ldy};
  at::parallel_for(0, N, kBlock, [&](int64_t n0, int64_t n1) { columns<true>(g, rows, n0, n1); });
}

// The (K, N) kernel splits K between pairs of threads when the weight is large enough (and the
// call is not already inside a parallel region): each thread then sweeps whole weight rows, a
// chunk of consecutive rows (one contiguous stretch of memory; kn_chunk) at a time, where a split
// by columns gave each thread 16 half-rows (bench/results/kernel-decisions.md#small-gemm-split-k). The
// second half's partial sums wait in a buffer that a last pass adds, with scale and bias. Beyond
// two threads the pairs split the columns.
constexpr int64_t kSplitKMinWeights = int64_t(1) << 18;

template <typename W>
void kn_split_k(const Gemm<W>& g, int64_t rows, int threads) {
  const int64_t K = g.K, N = g.N;
  const int64_t kc = kn_chunk(rows);
  const int64_t half = (K / 2 + kc - 1) / kc * kc;  // whole chunks in the first half
  const int64_t groups = threads / 2;
  const int64_t blocks = (N + kBlock - 1) / kBlock, per_group = (blocks + groups - 1) / groups;
  std::unique_ptr<float[]> part(new float[rows * N]);
  at::parallel_for(0, 2 * groups, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n0 = (t / 2) * per_group * kBlock, n1 = std::min(N, (t / 2 + 1) * per_group * kBlock);
      if (n0 >= n1) continue;
      const bool first = t % 2 == 0;
      const int64_t k0 = first ? 0 : half, k1 = first ? half : K;
      const Gemm<W> h{g.x + k0, g.ldx, g.w + k0 * N, k1 - k0, N, nullptr, nullptr, first ? g.y : part.get(),
                      first ? g.ldy : N};
      columns<false>(h, rows, n0, n1);
    }
  });
  parallel_row_spans(rows, N, [&](int64_t m, int64_t c0, int64_t c1) {
    float* out = g.y + m * g.ldy;
    const float* p = part.get() + m * N;
    for (int64_t c = c0; c < c1; ++c) {
      const float v = out[c] + p[c];
      out[c] = (g.s ? g.s[c] * v : v) + (g.b ? g.b[c] : 0.f);
    }
  });
}

template <typename W>
void small_gemm_kn(int64_t rows, const float* x, int64_t ldx, const W* w, int64_t K, int64_t N,
                   const float* b, float* y, int64_t ldy, const float* s) {
  TORCH_CHECK(rows >= 1 && rows <= kSmallGemmMaxRows, "small_gemm_kn takes 1..", kSmallGemmMaxRows, " rows");
  RECORD_FUNCTION("convs2s::few_rows_kn", std::vector<c10::IValue>());
  const Gemm<W> g{x, ldx, w, K, N, b, s, y, ldy};
  const int threads = at::get_num_threads();
  if (threads >= 2 && K >= 2 * kn_chunk(rows) && K * N >= kSplitKMinWeights && !at::in_parallel_region())
    return kn_split_k(g, rows, threads);
  // one contiguous panel of whole 64-column blocks per thread
  const int64_t blocks = (N + kBlock - 1) / kBlock;
  const int64_t per_thread = (blocks + threads - 1) / threads;
  at::parallel_for(0, blocks, per_thread, [&](int64_t b0, int64_t b1) {
    columns<false>(g, rows, b0 * kBlock, std::min(N, b1 * kBlock));
  });
}

#define CONVS2S_INSTANTIATE(W)                                                                                  \
  template void small_gemm_nk<W>(int64_t, const float*, int64_t, const W*, int64_t, int64_t, const float*, float*, \
                                 int64_t, const float*);                                                        \
  template void small_gemm_kn<W>(int64_t, const float*, int64_t, const W*, int64_t, int64_t, const float*, float*, \
                                 int64_t, const float*); \
  template void small_gemm_kn_packed<W>(int64_t, const float*, int64_t, const W*, int64_t, int64_t, const float*, \
                                        float*, int64_t, const float*);
CONVS2S_INSTANTIATE(float)
CONVS2S_INSTANTIATE(at::BFloat16)
CONVS2S_INSTANTIATE(int8_t)

}  // namespace convs2s
