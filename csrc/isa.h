// The instruction set the project's own kernels run at: the best this CPU has, capped by
// CONVS2S_KERNELS_ISA (amx | avx512 | avx2 | baseline). With oneDNN's and MKL's own caps, an
// AVX-512 machine then reproduces an AVX2-only one, and an AMX machine (avx512) one without AMX.
#pragma once

namespace convs2s {

enum class Isa { avx512, avx2, base };

// Read once per process (the environment variable at the first call).
Isa kernel_isa();
// AVX-512 VNNI (vpdpbusd) and AVX512-BW, at the avx512 level only: the int8 dot-product kernels' fast path.
bool kernel_has_vnni();
// AMX-INT8 tiles, uncapped (CONVS2S_KERNELS_ISA unset or amx), with the kernel's permission to
// use them granted (Linux arch_prctl, once per process): the int8 products' many-row fast path.
bool kernel_has_amx_int8();

}  // namespace convs2s
