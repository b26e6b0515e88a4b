// How far ahead of its reads a streaming kernel asks for the lines of its stream (into L1): the
// AVX2 int8 kernel's own prefetch (linear_w8a8_avx2.cpp; bench/results/kernel-decisions.md#w8a8-avx2-prefetch) and the read
// bandwidth probe that plays that kernel's reader for the roofline (read_peak.cpp).
#pragma once

#include <cstdint>

namespace convs2s {

constexpr int64_t kStreamAheadBytes = 8192;

}  // namespace convs2s
