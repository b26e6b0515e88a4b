// See isa.h.

#include "isa.h"

#include <cstdlib>
#include <string>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#endif

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
  return best;  // "amx", "avx512" (or a value the Python side has already rejected): no cap here
}

// AMX is left out by the caps below it only (an unknown value is ignored, as for the other levels).
bool amx_capped() {
  const char* cap = std::getenv("CONVS2S_KERNELS_ISA");
  if (cap == nullptr) return false;
  const std::string want(cap);
  return want == "avx512" || want == "avx2" || want == "baseline";
}

bool detect_amx_int8() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && defined(__linux__)
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool tile = d & (1u << 24), int8 = d & (1u << 25);
  if (!tile || !int8) return false;
  // the OS must hold tile state (XCR0 bits 17 and 18) and let this process use it
  unsigned lo, hi;
  __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if ((lo & (3u << 17)) != (3u << 17)) return false;
  constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
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

bool kernel_has_amx_int8() {
  static const bool amx = kernel_isa() == Isa::avx512 && !amx_capped() && kernel_has_vnni() && detect_amx_int8();
  return amx;
}

}  // namespace convs2s
