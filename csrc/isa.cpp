// See isa.h.

#include "isa.h"

#include <cstdlib>
#include <string>

namespace convs2s {

namespace {

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

}  // namespace

Isa kernel_isa() {
  static const Isa isa = detect_isa();
  return isa;
}

bool kernel_has_vnni() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const bool vnni = kernel_isa() == Isa::avx512 && __builtin_cpu_supports("avx512vnni") &&
                           __builtin_cpu_supports("avx512bw");
  return vnni;
#else
  return false;
#endif
}

}  // namespace convs2s
