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
#include "linear_w8a8.h"
#include "common.h"
#include "isa.h"
#include "kernel_choice.h"
#include "row_tiles.h"
#include "small_gemm.h"
#include "stream_ahead.h"
#include "vec.h"

#include <ATen/Parallel.h>
#include <ATen/ops/_int_mm.h>
#include <ATen/ops/from_blob.h>
#include <ATen/record_function.h>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>


namespace convs2s {
namespace w8a8 {

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

}  // namespace w8a8

using namespace w8a8;

namespace {

// Without a packed weight the packed kernel packs each block per call, which pays from
// M >= K / 8 rows (and 16 at least): packing costs a pass of K/4 scattered stores per weight row
// whatever M, the reducing kernel's horizontal sums cost a fixed few instructions per output
// against its K/64 dot products, so the longer K, the later packing pays
// (bench/results/kernel-decisions.md#w8a8-packed-pays).
bool packed_pays(int64_t M, int64_t K) { return M >= 16 && M * 8 >= K; }

// Quantise row m: sx = max|x| / qmax (1 for a row of zeros), xq = round-half-even(x / sx) in
// [-qmax, qmax] (qmax 127, or 63 for 7-bit activations), as quantize_rows_int8 in the reference.
// The rounding adds and subtracts 1.5 * 2^23, which rounds to nearest-even for |v| <= 127.5 in
// any vector width (std::nearbyint is a library call here).
// Written for vectors of V (AVX-512, AVX2 or baseline): compiled for the baseline alone, the max
// stays a scalar chain (a float max reduction is not vectorised without -ffast-math) and the
// division 4 lanes wide (bench/results/kernel-decisions.md#w8a8-quantize-vectors). The max is exact in any order;
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

// ---- many rows: the math library's int8 GEMM, where its sums are exact ----
// torch._int_mm (oneDNN) multiplies int8 by int8 into int32, rearranging the weight on every call.
// Without VNNI oneDNN multiplies with vpmaddubsw, whose int16 pairs saturate, and its sums are not
// exact; so it is used only where a probe with saturating values comes out exact (once per
// process), and the kernels run elsewhere.
//
// Which kernel runs is measured per weight shape where the caller passes the packed weight
// (kernel_choice.h, forms w8a8 and w7a8; convs2s_kernels.tune) at up to kSmallGemmMaxRows rows:
// the packed kernel (VNNI or AVX2) against the alternative, the library where its sums are exact,
// else the reducing kernel; at AVX2 the winner depends on the shape. Unmeasured shapes follow
// fixed rules: the library from 10 rows; AMX from 2 rows on a packed weight, measured or not; the
// AVX2 packed kernel from 12; with VNNI, the packed kernel on a packed weight at any row count (no
// sums to reduce, one contiguous stream per 64-column block)
// (bench/results/kernel-decisions.md#w8a8-kernel-choice-rules).
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
    if (amx) return w8a8::amx(g, M, n0, n1);
    if (vnni) return use_packed ? w8a8::vnni_packed(g, M, n0, n1) : w8a8::vnni(g, M, n0, n1);
    if (isa != Isa::base) return use_packed ? w8a8::avx2_packed(g, M, n0, n1) : w8a8::avx2(g, M, n0, n1);
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
