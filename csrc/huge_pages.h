// Tensors on 2 MB transparent huge pages, for weights a decoding step streams from memory.
#pragma once

#include <ATen/core/Tensor.h>

namespace convs2s {

// An uninitialised CPU tensor whose memory is 2 MB aligned and advised as huge pages
// (madvise(MADV_HUGEPAGE); the kernel grants them where transparent huge pages are enabled,
// "always" or "madvise"); at::empty for tensors under 2 MB or off Linux.
at::Tensor huge_page_empty(at::IntArrayRef sizes, at::ScalarType dtype);
// A contiguous copy of `t` (a CPU tensor) in such memory.
at::Tensor huge_page_copy(const at::Tensor& t);

}  // namespace convs2s
