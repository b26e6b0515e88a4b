// Shared argument checks for the CPU kernels. The Python wrappers validate shapes with
// readable messages first; these guard the C++ entry points against misuse from elsewhere.
#pragma once

#include <torch/extension.h>

#define CONVS2S_CHECK_CPU(t) TORCH_CHECK((t).device().is_cpu(), #t " must be a CPU tensor")
#define CONVS2S_CHECK_DIM(t, n) TORCH_CHECK((t).dim() == (n), #t " must have " #n " dimensions, got ", (t).dim())
#define CONVS2S_CHECK_LAST_CONTIGUOUS(t) \
  TORCH_CHECK((t).size(-1) <= 1 || (t).stride(-1) == 1, #t " must have a contiguous last dimension")
