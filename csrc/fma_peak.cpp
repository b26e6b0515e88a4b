// The FMA units' peak, and the int8 dot products', measured: the compute limits a roofline divides by.
//
// A library GEMM is not always the machine's peak: MKL's fp32 GEMM runs its AVX2 code on AMD
// CPUs, where the project's AVX-512 kernels outran it, a "fraction of peak" above 1
// (bench/results/kernel-decisions.md#fma-peak-not-library-gemm).
// Here each thread runs independent multiply-adds on registers only (no memory traffic), at the
// instruction set the project's kernels run at (kernel_isa(), so CONVS2S_KERNELS_ISA=avx2 caps it).

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

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
// 16 chains there spilled; bench/results/kernel-decisions.md#fma-peak-not-library-gemm).
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

// ---- the int8 dot products' rate: exact int8 x int8 -> int32 multiply-adds on registers ----
// The instructions linear_w8a8's kernels multiply with, in the same mix (linear_w8a8_avx512.cpp, _avx2.cpp):
// AVX-512 VNNI's vpdpbusd (64 multiply-adds), or AVX2's vpsignb + vpmaddubsw + vpmaddwd + vpaddd
// (32; without vpsignb for 7-bit activations). The AVX2 group is bound by the vector instructions
// issued, not the multiplies, so the 3-instruction 7-bit group runs more multiply-adds a cycle
// (bench/results/kernel-decisions.md#fma-peak-int8-dot-rate).

// Accumulators per thread: VNNI's as the FMA chains (vpdpbusd's latency 5 on two pipes); AVX2's
// fixed by the assembly below (ymm8-15).
constexpr int kDotChainsVnni = kChainsFor<20>, kDotChainsAvx2 = 8;

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx512f,avx512bw,avx512vnni"))) int64_t dot_vnni(int64_t iters, int /*mode: vpdpbusd takes any alike*/) {
  constexpr int kChains = kDotChainsVnni;
  __m512i acc[kChains];
  const __m512i u = _mm512_set1_epi8(3), s = _mm512_set1_epi8(-5);
  for (int a = 0; a < kChains; ++a) acc[a] = _mm512_set1_epi32(a);
  for (int64_t i = 0; i < iters; ++i)
    for (int a = 0; a < kChains; ++a) acc[a] = _mm512_dpbusd_epi32(acc[a], u, s);
  __m512i sum = acc[0];
  for (int a = 1; a < kChains; ++a) sum = _mm512_add_epi32(sum, acc[a]);
  return _mm512_reduce_add_epi32(sum);
}

// Eight groups a round, in assembly: written with intrinsics, every group's product is the same
// loop-invariant value and the compiler computes it once, leaving the adds alone. 8-bit
// activations move their sign onto the weight first (vpsignb); 7-bit ones, stored with an offset,
// go into vpmaddubsw as they are (linear_w8a8_avx2.cpp's avx2_packed7_tile).
#define CONVS2S_DOT_GROUP(acc)                                 \
  "vpsignb %%ymm0, %%ymm1, %%ymm3\n\t"                           \
  "vpmaddubsw %%ymm3, %%ymm0, %%ymm3\n\t"                        \
  "vpmaddwd %%ymm2, %%ymm3, %%ymm3\n\t"                          \
  "vpaddd %%ymm3, %%ymm" #acc ", %%ymm" #acc "\n\t"
#define CONVS2S_DOT7_GROUP(acc)                                \
  "vpmaddubsw %%ymm1, %%ymm0, %%ymm3\n\t"                        \
  "vpmaddwd %%ymm2, %%ymm3, %%ymm3\n\t"                          \
  "vpaddd %%ymm3, %%ymm" #acc ", %%ymm" #acc "\n\t"
// 7-bit activations and 7-bit weights (avx2_packed7_tile with kPairs): two groups' pairs added in int16, then
// one widening: 64 multiply-adds a group.
#define CONVS2S_DOT77_GROUP(acc)                               \
  "vpmaddubsw %%ymm1, %%ymm0, %%ymm3\n\t"                        \
  "vpmaddubsw %%ymm1, %%ymm0, %%ymm4\n\t"                        \
  "vpaddw %%ymm4, %%ymm3, %%ymm3\n\t"                            \
  "vpmaddwd %%ymm2, %%ymm3, %%ymm3\n\t"                          \
  "vpaddd %%ymm3, %%ymm" #acc ", %%ymm" #acc "\n\t"
#define CONVS2S_DOT_LOOP(GROUP)                                                                        \
  "1:\n\t" GROUP(8) GROUP(9) GROUP(10) GROUP(11) GROUP(12) GROUP(13) GROUP(14) GROUP(15) "dec %[n]\n\t" \
  "jnz 1b\n\t"
// mode: 0 8-bit activations, 1 7-bit, 2 7-bit activations and weights
__attribute__((target("avx2"))) int64_t dot_avx2(int64_t iters, int mode) {
  alignas(32) int32_t out[kDotChainsAvx2 * 8] = {};
  if (iters > 0)
    asm volatile(
        "vpcmpeqd %%ymm1, %%ymm1, %%ymm1\n\t"  // bytes -1 (signed weights)
        "vpabsb %%ymm1, %%ymm0\n\t"  // bytes 1 (unsigned activations)
        "vpabsw %%ymm1, %%ymm2\n\t"  // int16 ones (vpmaddwd's pair sums)
        "vpxor %%ymm8, %%ymm8, %%ymm8\n\t" "vpxor %%ymm9, %%ymm9, %%ymm9\n\t"
        "vpxor %%ymm10, %%ymm10, %%ymm10\n\t" "vpxor %%ymm11, %%ymm11, %%ymm11\n\t"
        "vpxor %%ymm12, %%ymm12, %%ymm12\n\t" "vpxor %%ymm13, %%ymm13, %%ymm13\n\t"
        "vpxor %%ymm14, %%ymm14, %%ymm14\n\t" "vpxor %%ymm15, %%ymm15, %%ymm15\n\t"
        "cmp $1, %[mode]\n\t"
        "je 2f\n\t"
        "ja 4f\n\t"
        CONVS2S_DOT_LOOP(CONVS2S_DOT_GROUP)
        "jmp 3f\n\t"
        "2:\n\t"
        CONVS2S_DOT_LOOP(CONVS2S_DOT7_GROUP)
        "jmp 3f\n\t"
        "4:\n\t"
        CONVS2S_DOT_LOOP(CONVS2S_DOT77_GROUP)
        "3:\n\t"
        "vmovdqa %%ymm8, (%[out])\n\t" "vmovdqa %%ymm9, 32(%[out])\n\t"
        "vmovdqa %%ymm10, 64(%[out])\n\t" "vmovdqa %%ymm11, 96(%[out])\n\t"
        "vmovdqa %%ymm12, 128(%[out])\n\t" "vmovdqa %%ymm13, 160(%[out])\n\t"
        "vmovdqa %%ymm14, 192(%[out])\n\t" "vmovdqa %%ymm15, 224(%[out])\n\t"
        "vzeroupper\n\t"
        : [n] "+r"(iters)
        : [out] "r"(out), [mode] "r"(int64_t(mode))
        // vzeroupper clears the upper halves of every ymm register, so all sixteen are clobbered
        : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12",
          "xmm13", "xmm14", "xmm15", "cc", "memory");
  int64_t sum = 0;
  for (int32_t v : out) sum += v;
  return sum;
}
#undef CONVS2S_DOT_LOOP
#undef CONVS2S_DOT7_GROUP
#undef CONVS2S_DOT77_GROUP
#undef CONVS2S_DOT_GROUP
#endif

// The int8 kernels' loop at their instruction set and its multiply-adds per round of one thread;
// none where they have no SIMD dot product (the baseline's plain integer loops have no register
// rate to speak of).
struct DotLoop {
  int64_t (*run)(int64_t iters, int mode);  // mode: dot_avx2's (the group for 7-bit activations, weights)
  int per_round;       // multiply-adds a round of one thread, with the 8-bit group
  bool paired_groups;  // mode 2 does twice the multiply-adds a group (AVX2's 7-bit pairs)
};

DotLoop dot_loop() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (kernel_has_vnni()) return {dot_vnni, kDotChainsVnni * 64, false};
  if (kernel_isa() != Isa::base) return {dot_avx2, kDotChainsAvx2 * 32, true};
#endif
  return {nullptr, 0, false};
}

// Seconds that `body` takes on every thread at once.
template <typename F> double seconds_on_every_thread(const F& body) {
  const int threads = at::get_num_threads();
  const auto t0 = std::chrono::steady_clock::now();
  at::parallel_for(0, threads, 1, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) body();
  });
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

double int8_dot_peak_gops(int64_t iters, int64_t activation_bits, int64_t weight_bits) {
  TORCH_CHECK(iters >= 1, "int8_dot_peak_gops: iters must be positive");
  TORCH_CHECK(activation_bits == 8 || activation_bits == 7, "int8_dot_peak_gops: activation_bits must be 8 or 7, got ",
              activation_bits);
  TORCH_CHECK(weight_bits == 8 || weight_bits == 7, "int8_dot_peak_gops: weight_bits must be 8 or 7, got ", weight_bits);
  const DotLoop loop = dot_loop();
  if (!loop.run) return 0.0;
  // the kernels pair groups only with 7-bit activations and weights (linear_w8a8_avx2.cpp)
  const int mode = activation_bits == 8 ? 0 : weight_bits == 8 ? 1 : 2;
  std::atomic<int64_t> sink{0};  // the results are used, so the loops are not removed
  const double secs = seconds_on_every_thread([&] { sink += loop.run(iters, mode); });
  TORCH_CHECK(sink.load() != 0, "int8_dot_peak_gops: the loops produced nothing");
  const int per_round = loop.per_round * (mode == 2 && loop.paired_groups ? 2 : 1);
  return 2.0 * double(iters) * per_round * at::get_num_threads() / secs / 1e9;
}

double fma_peak_gflops(int64_t iters) {
  TORCH_CHECK(iters >= 1, "fma_peak_gflops: iters must be positive");
  const Isa isa = kernel_isa();
  std::atomic<float> sink{0.f};  // the results are used, so the loops are not removed
  const double secs = seconds_on_every_thread([&] { sink = sink + run(isa, iters); });
  TORCH_CHECK(sink.load() != 0.f, "fma_peak_gflops: the loops produced nothing");
  return 2.0 * double(iters) * per_round(isa) * at::get_num_threads() / secs / 1e9;
}

}  // namespace convs2s
