// The instruction set the project's own kernels run at: the best this CPU has, capped by
// CONVS2S_KERNELS_ISA (avx512 | avx2 | baseline). With oneDNN's and MKL's own caps, an AVX-512
// machine then reproduces an AVX2-only one.
#pragma once

namespace convs2s {

enum class Isa { avx512, avx2, base };

// Read once per process (the environment variable at the first call).
Isa kernel_isa();
// AVX-512 VNNI (vpdpbusd) and AVX512-BW, at the avx512 level only: the int8 dot-product kernels' fast path.
bool kernel_has_vnni();

}  // namespace convs2s
