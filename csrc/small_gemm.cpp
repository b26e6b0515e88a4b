// Matrix products with few rows (decoding: one row per sentence x beam): float32 or bf16 weights,
// float32 activations and accumulation.
//
// With M <= 8 rows, a GEMM library packs the whole weight matrix for a handful of FLOPs per
// element and runs far below the memory bandwidth that bounds the product. These kernels read
// every weight once, in its stored layout, and keep the M rows' accumulators in vector
// registers. They are written with GCC/Clang vector extensions and compiled three times
// (AVX-512, AVX2+FMA, baseline), the best one chosen at run time.

#include "small_gemm.h"
#include "common.h"

#include <ATen/Parallel.h>
#include <cstdlib>
#include <cstring>
#include <string>

namespace convs2s {

namespace {

typedef float v16 __attribute__((vector_size(64)));
typedef uint16_t u16x16 __attribute__((vector_size(32)));
typedef uint32_t u32x16 __attribute__((vector_size(64)));

inline __attribute__((always_inline)) v16 load16(const float* p) {
  v16 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// bf16 weights: widen 16 values to float32 (a bf16 is the top half of a float32), half the bytes read.
inline __attribute__((always_inline)) v16 load16(const at::BFloat16* p) {
  u16x16 h;
  std::memcpy(&h, p, sizeof(h));
  const u32x16 w = __builtin_convertvector(h, u32x16) << 16;
  v16 v;
  std::memcpy(&v, &w, sizeof(v));
  return v;
}

// int8 weights (per-output-channel scale applied after the sum): a quarter of float32's bytes.
typedef int8_t i8x16 __attribute__((vector_size(16)));
typedef int16_t i16x16 __attribute__((vector_size(32)));
typedef int32_t i32x16 __attribute__((vector_size(64)));
inline __attribute__((always_inline)) v16 load16(const int8_t* p) {
  i8x16 q;
  std::memcpy(&q, p, sizeof(q));
  // widened in steps: GCC vectorises int8->int16->int32 (vpmovsx) but scalarises int8->float directly
  const i32x16 w = __builtin_convertvector(__builtin_convertvector(q, i16x16), i32x16);
  return __builtin_convertvector(w, v16);
}

inline __attribute__((always_inline)) float to_float(float v) { return v; }
inline __attribute__((always_inline)) float to_float(int8_t v) { return static_cast<float>(v); }
inline __attribute__((always_inline)) float to_float(at::BFloat16 v) { return static_cast<float>(v); }

inline __attribute__((always_inline)) void store16(float* p, v16 v) { std::memcpy(p, &v, sizeof(v)); }

inline __attribute__((always_inline)) float hsum(v16 v) {
  float s = 0.f;
  for (int i = 0; i < 16; ++i) s += v[i];
  return s;
}

// y[m, n] = s[n] * sum_k x[m, k] w[n, k] (+ b[n]) for n in [n0, n1): weight rows are contiguous
// (Linear). s (per-output scale of int8 weights) may be null. With one or two rows a single
// accumulator chain would be bound by the FMA latency, so U independent chains run side by side.
template <int M, typename W>
inline __attribute__((always_inline)) void dot_form(const float* x, int64_t ldx, const W* w, int64_t K,
                                                    const float* b, const float* s, float* y, int64_t ldy,
                                                    int64_t n0, int64_t n1) {
  constexpr int U = M == 1 ? 4 : (M == 2 ? 2 : 1);
  const int64_t KU = K - K % (16 * U), K16 = K - K % 16;
  for (int64_t n = n0; n < n1; ++n) {
    const W* wr = w + n * K;
    v16 acc[M][U];
    for (int m = 0; m < M; ++m)
      for (int u = 0; u < U; ++u) acc[m][u] = v16{};
    for (int64_t k = 0; k < KU; k += 16 * U) {
      for (int u = 0; u < U; ++u) {
        const v16 wv = load16(wr + k + 16 * u);
        for (int m = 0; m < M; ++m) acc[m][u] += load16(x + m * ldx + k + 16 * u) * wv;
      }
    }
    for (int64_t k = KU; k < K16; k += 16) {
      const v16 wv = load16(wr + k);
      for (int m = 0; m < M; ++m) acc[m][0] += load16(x + m * ldx + k) * wv;
    }
    for (int m = 0; m < M; ++m) {
      v16 total = acc[m][0];
      for (int u = 1; u < U; ++u) total += acc[m][u];
      float sum = hsum(total);
      for (int64_t k = K16; k < K; ++k) sum += x[m * ldx + k] * to_float(wr[k]);
      y[m * ldy + n] = (s ? s[n] * sum : sum) + (b ? b[n] : 0.f);
    }
  }
}

// y[m, n0:n1] = s * sum_k x[m, k] w[k, n0:n1] (+ b): weight columns are contiguous (conv step,
// (K, N)); s (per-column scale of int8 weights) may be null.
template <int M, typename W>
inline __attribute__((always_inline)) void axpy_form(const float* x, int64_t ldx, const W* w, int64_t K,
                                                     int64_t N, const float* b, const float* s, float* y,
                                                     int64_t ldy, int64_t n0, int64_t n1) {
  constexpr int V = 4;  // 64 columns per block: 4 cache lines of each weight row per k
  int64_t n = n0;
  for (; n + 16 * V <= n1; n += 16 * V) {
    v16 acc[M][V];
    for (int m = 0; m < M; ++m)
      for (int v = 0; v < V; ++v) acc[m][v] = (b && !s) ? load16(b + n + 16 * v) : v16{};
    for (int64_t k = 0; k < K; ++k) {
      v16 wv[V];
      for (int v = 0; v < V; ++v) wv[v] = load16(w + k * N + n + 16 * v);
      for (int m = 0; m < M; ++m) {
        const float xv = x[m * ldx + k];
        for (int v = 0; v < V; ++v) acc[m][v] += xv * wv[v];
      }
    }
    if (s) {
      for (int m = 0; m < M; ++m)
        for (int v = 0; v < V; ++v)
          acc[m][v] = acc[m][v] * load16(s + n + 16 * v) + (b ? load16(b + n + 16 * v) : v16{});
    }
    for (int m = 0; m < M; ++m)
      for (int v = 0; v < V; ++v) store16(y + m * ldy + n + 16 * v, acc[m][v]);
  }
  for (; n < n1; ++n) {  // ragged edge
    for (int m = 0; m < M; ++m) {
      float sum = 0.f;
      for (int64_t k = 0; k < K; ++k) sum += x[m * ldx + k] * to_float(w[k * N + n]);
      y[m * ldy + n] = (s ? s[n] * sum : sum) + (b ? b[n] : 0.f);
    }
  }
}

#define CONVS2S_SWITCH_M(M_VALUE, CALL) \
  switch (M_VALUE) {                    \
    case 1: { constexpr int M = 1; CALL; break; } \
    case 2: { constexpr int M = 2; CALL; break; } \
    case 3: { constexpr int M = 3; CALL; break; } \
    case 4: { constexpr int M = 4; CALL; break; } \
    case 5: { constexpr int M = 5; CALL; break; } \
    case 6: { constexpr int M = 6; CALL; break; } \
    case 7: { constexpr int M = 7; CALL; break; } \
    default: { constexpr int M = 8; CALL; break; } \
  }

#define CONVS2S_DEFINE_VARIANT(SUFFIX, TARGET)                                                                   \
  template <typename W>                                                                                         \
  TARGET void dot_rows_##SUFFIX(int64_t rows, const float* x, int64_t ldx, const W* w, int64_t K,               \
                                const float* b, const float* s, float* y, int64_t ldy, int64_t n0, int64_t n1) { \
    CONVS2S_SWITCH_M(rows, (dot_form<M>(x, ldx, w, K, b, s, y, ldy, n0, n1)))                                   \
  }                                                                                                             \
  template <typename W>                                                                                         \
  TARGET void axpy_rows_##SUFFIX(int64_t rows, const float* x, int64_t ldx, const W* w, int64_t K,              \
                                 int64_t N, const float* b, const float* s, float* y, int64_t ldy, int64_t n0, \
                                 int64_t n1) {                                                                  \
    CONVS2S_SWITCH_M(rows, (axpy_form<M>(x, ldx, w, K, N, b, s, y, ldy, n0, n1)))                               \
  }

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
CONVS2S_DEFINE_VARIANT(avx512, __attribute__((target("avx512f"))))
CONVS2S_DEFINE_VARIANT(avx2, __attribute__((target("avx2,fma"))))
#endif
CONVS2S_DEFINE_VARIANT(base, )

enum class Isa { avx512, avx2, base };

// The best instruction set this CPU has, capped by CONVS2S_KERNELS_ISA (avx512 | avx2 | baseline):
// with oneDNN's and MKL's own caps, an AVX-512 machine then reproduces an AVX2-only one.
Isa detect_isa() {
  Isa best = Isa::base;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) {
    best = Isa::avx512;
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    best = Isa::avx2;
  }
#endif
  const char* cap = std::getenv("CONVS2S_KERNELS_ISA");
  if (cap == nullptr) return best;
  const std::string want(cap);
  if (want == "baseline") return Isa::base;
  if (want == "avx2") return best == Isa::avx512 ? Isa::avx2 : best;
  return best;  // "avx512" (or a value the Python side has already rejected): no cap
}

const Isa kIsa = detect_isa();

}  // namespace

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
  at::parallel_for(0, N, 64, [&](int64_t n0, int64_t n1) {
    switch (kIsa) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
      case Isa::avx512: dot_rows_avx512(rows, x, ldx, w, K, b, s, y, ldy, n0, n1); break;
      case Isa::avx2: dot_rows_avx2(rows, x, ldx, w, K, b, s, y, ldy, n0, n1); break;
#endif
      default: dot_rows_base(rows, x, ldx, w, K, b, s, y, ldy, n0, n1);
    }
  });
}

template <typename W>
void small_gemm_kn(int64_t rows, const float* x, int64_t ldx, const W* w, int64_t K, int64_t N,
                   const float* b, float* y, int64_t ldy, const float* s) {
  TORCH_CHECK(rows >= 1 && rows <= kSmallGemmMaxRows, "small_gemm_kn takes 1..", kSmallGemmMaxRows, " rows");
  // column blocks of 64 per task: every thread streams whole 256-byte pieces of each weight row
  const int64_t blocks = (N + 63) / 64;
  at::parallel_for(0, blocks, 2, [&](int64_t b0, int64_t b1) {
    const int64_t n0 = b0 * 64, n1 = std::min(N, b1 * 64);
    switch (kIsa) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
      case Isa::avx512: axpy_rows_avx512(rows, x, ldx, w, K, N, b, s, y, ldy, n0, n1); break;
      case Isa::avx2: axpy_rows_avx2(rows, x, ldx, w, K, N, b, s, y, ldy, n0, n1); break;
#endif
      default: axpy_rows_base(rows, x, ldx, w, K, N, b, s, y, ldy, n0, n1);
    }
  });
}

#define CONVS2S_INSTANTIATE(W)                                                                                  \
  template void small_gemm_nk<W>(int64_t, const float*, int64_t, const W*, int64_t, int64_t, const float*, float*, \
                                 int64_t, const float*);                                                        \
  template void small_gemm_kn<W>(int64_t, const float*, int64_t, const W*, int64_t, int64_t, const float*, float*, \
                                 int64_t, const float*);
CONVS2S_INSTANTIATE(float)
CONVS2S_INSTANTIATE(at::BFloat16)
CONVS2S_INSTANTIATE(int8_t)

}  // namespace convs2s

namespace convs2s {

at::Tensor small_gemm(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias, bool w_is_nk) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && w.is_contiguous(), "small_gemm: x (M, K), contiguous 2-D weight");
  TORCH_CHECK(x.scalar_type() == w.scalar_type(), "small_gemm: x and weight must share a dtype");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, "small_gemm: float32 or bf16");
  const int64_t M = x.size(0), K = x.size(1), N = w_is_nk ? w.size(0) : w.size(1);
  TORCH_CHECK((w_is_nk ? w.size(1) : w.size(0)) == K, "small_gemm: weight does not match x's K");
  TORCH_CHECK(M >= 1 && M <= kSmallGemmMaxRows, "small_gemm takes 1..", kSmallGemmMaxRows, " rows");
  const at::Tensor xf = x.to(at::kFloat).contiguous();  // activations are tiny: widen once
  at::Tensor bf = bias.has_value() ? bias->to(at::kFloat).contiguous() : at::Tensor();
  at::Tensor y = new_output({M, N}, x.options().dtype(at::kFloat));
  const float* bp = bf.defined() ? bf.data_ptr<float>() : nullptr;
  if (w.scalar_type() == at::kFloat) {
    if (w_is_nk) small_gemm_nk(M, xf.data_ptr<float>(), K, w.data_ptr<float>(), N, K, bp, y.data_ptr<float>(), N);
    else small_gemm_kn(M, xf.data_ptr<float>(), K, w.data_ptr<float>(), K, N, bp, y.data_ptr<float>(), N);
    return y;
  }
  const at::BFloat16* wp = w.data_ptr<at::BFloat16>();
  if (w_is_nk) small_gemm_nk(M, xf.data_ptr<float>(), K, wp, N, K, bp, y.data_ptr<float>(), N);
  else small_gemm_kn(M, xf.data_ptr<float>(), K, wp, K, N, bp, y.data_ptr<float>(), N);
  return y.to(x.scalar_type());
}

at::Tensor small_gemm_int8(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scale,
                           const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "linear_int8: x must be float32 (M, K)");
  TORCH_CHECK(qweight.dim() == 2 && qweight.scalar_type() == at::kChar, "linear_int8: qweight must be int8 (N, K)");
  const int64_t M = x.size(0), K = x.size(1), N = qweight.size(0);
  TORCH_CHECK(qweight.size(1) == K, "linear_int8: qweight has ", qweight.size(1), " input features but x has ", K);
  TORCH_CHECK(scale.dim() == 1 && scale.size(0) == N && scale.scalar_type() == at::kFloat,
              "linear_int8: scale must be float32 (N,)");
  if (M > kSmallGemmMaxRows || M == 0) {
    // many rows: a GEMM is compute-bound there, so dequantise once and let the BLAS run
    const at::Tensor w = qweight.to(at::kFloat).mul_(scale.unsqueeze(1));
    return bias.has_value() ? at::addmm(*bias, x, w.t()) : at::mm(x, w.t());
  }
  const at::Tensor xc = x.contiguous(), qc = qweight.contiguous(), sc = scale.contiguous();
  at::Tensor bf = bias.has_value() ? bias->to(at::kFloat).contiguous() : at::Tensor();
  at::Tensor y = new_output({M, N}, x.options());
  small_gemm_nk(M, xc.data_ptr<float>(), K, qc.data_ptr<int8_t>(), N, K, bf.defined() ? bf.data_ptr<float>() : nullptr,
                y.data_ptr<float>(), N, sc.data_ptr<float>());
  return y;
}

}  // namespace convs2s
