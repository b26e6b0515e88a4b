// The FMA units' peak, measured: the compute limit a roofline divides by.
//
// A library GEMM is not always the machine's peak: MKL's fp32 GEMM runs its AVX2 code on AMD
// CPUs, so on an AVX-512 AMD EPYC (Zen 5) it measured 237 GFLOP/s with 2 threads while the
// project's AVX-512 kernels ran a decoding step's products at ~300, a "fraction of peak" above 1.
// Here each thread runs independent multiply-adds on registers only (no memory traffic), at the
// instruction set the project's kernels run at (kernel_isa(), so CONVS2S_KERNELS_ISA=avx2 caps it).

#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <atomic>
#include <chrono>
#include <cstdint>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#endif

#include "isa.h"

namespace convs2s {

namespace {

// Accumulators per thread: enough independent chains to cover the FMA latency (4 cycles) on two
// or more pipes, with the two constants in registers too (32 zmm at AVX-512, 16 ymm / xmm below:
// 16 chains there spilled and measured 170 GFLOP/s where MKL's GEMM ran 237).
template <int kRegisters> constexpr int kChainsFor = kRegisters - 4;

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx512f"))) float fma_avx512(int64_t iters) {
  constexpr int kChains = kChainsFor<20>;
  __m512 acc[kChains];
  const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
  for (int a = 0; a < kChains; ++a) acc[a] = _mm512_set1_ps(1.f + a);
  for (int64_t i = 0; i < iters; ++i)
    for (int a = 0; a < kChains; ++a) acc[a] = _mm512_fmadd_ps(acc[a], m, c);
  __m512 s = acc[0];
  for (int a = 1; a < kChains; ++a) s = _mm512_add_ps(s, acc[a]);
  return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx2,fma"))) float fma_avx2(int64_t iters) {
  constexpr int kChains = kChainsFor<16>;
  __m256 acc[kChains];
  const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
  for (int a = 0; a < kChains; ++a) acc[a] = _mm256_set1_ps(1.f + a);
  for (int64_t i = 0; i < iters; ++i)
    for (int a = 0; a < kChains; ++a) acc[a] = _mm256_fmadd_ps(acc[a], m, c);
  __m256 s = acc[0];
  for (int a = 1; a < kChains; ++a) s = _mm256_add_ps(s, acc[a]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, s);
  float sum = 0.f;
  for (float v : lanes) sum += v;
  return sum;
}
#endif

// Baseline: a multiply and an add per lane (no FMA instruction), 4 lanes, counted as 2 FLOPs.
float fma_base(int64_t iters) {
  constexpr int kChains = kChainsFor<16>;
  typedef float v4 __attribute__((vector_size(16)));
  v4 acc[kChains];
  const v4 m = v4{} + 0.999999f, c = v4{} + 1e-7f;
  for (int a = 0; a < kChains; ++a) acc[a] = v4{} + (1.f + a);
  for (int64_t i = 0; i < iters; ++i)
    for (int a = 0; a < kChains; ++a) acc[a] = acc[a] * m + c;
  float sum = 0.f;
  for (int a = 0; a < kChains; ++a) sum += acc[a][0] + acc[a][1] + acc[a][2] + acc[a][3];
  return sum;
}

float run(Isa isa, int64_t iters) {
  switch (isa) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    case Isa::avx512: return fma_avx512(iters);
    case Isa::avx2: return fma_avx2(iters);
#endif
    default: return fma_base(iters);
  }
}

// Multiply-adds per round of one thread: chains x lanes.
int per_round(Isa isa) { return isa == Isa::avx512 ? kChainsFor<20> * 16 : isa == Isa::avx2 ? kChainsFor<16> * 8 : kChainsFor<16> * 4; }

}  // namespace

double fma_peak_gflops(int64_t iters) {
  TORCH_CHECK(iters >= 1, "fma_peak_gflops: iters must be positive");
  const Isa isa = kernel_isa();
  const int threads = at::get_num_threads();
  std::atomic<float> sink{0.f};  // the results are used, so the loops are not removed
  const auto t0 = std::chrono::steady_clock::now();
  at::parallel_for(0, threads, 1, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) sink = sink + run(isa, iters);
  });
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  TORCH_CHECK(sink.load() != 0.f, "fma_peak_gflops: the loops produced nothing");
  return 2.0 * double(iters) * per_round(isa) * threads / secs / 1e9;
}

}  // namespace convs2s
