// Shared argument checks for the CPU kernels. The Python wrappers validate shapes with
// readable messages first; these guard the C++ entry points against misuse from elsewhere.
#pragma once

#include <torch/extension.h>

#define CONVS2S_CHECK_CPU(t) TORCH_CHECK((t).device().is_cpu(), #t " must be a CPU tensor")
#define CONVS2S_CHECK_DIM(t, n) TORCH_CHECK((t).dim() == (n), #t " must have " #n " dimensions, got ", (t).dim())

#include <cstdlib>
#include <cstring>
#include <limits>

namespace convs2s {

// Every buffer a kernel must fill: at::empty, or NaN-filled when CONVS2S_KERNELS_POISON=1 (the
// tests set it), so an element a kernel forgets to write shows up as NaN. Read once per process.
inline at::Tensor new_output(at::IntArrayRef sizes, const at::TensorOptions& options) {
  static const bool poison = [] {
    const char* v = std::getenv("CONVS2S_KERNELS_POISON");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  if (poison && at::isFloatingType(c10::typeMetaToScalarType(options.dtype())))
    return at::full(sizes, std::numeric_limits<double>::quiet_NaN(), options);
  return at::empty(sizes, options);
}

// ``t`` itself when its last dimension has unit stride, else a contiguous copy: the kernels walk
// rows by their strides but read each row's channels as one run.
inline at::Tensor last_dim_contiguous(const at::Tensor& t) {
  return t.size(-1) <= 1 || t.stride(-1) == 1 ? t : t.contiguous();
}

}  // namespace convs2s
