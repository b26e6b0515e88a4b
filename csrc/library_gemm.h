// The float32 GEMM that runs where the few-row kernels do not (see library_gemm.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include "kernel_choice.h"

namespace convs2s {

enum class GemmLibrary : int64_t { blas = 0, onednn = 1 };

// Whether this torch build has oneDNN's inner-product op (mkldnn::_linear_pointwise) for float32 on the CPU.
bool onednn_gemm_available();
// x (M, K) @ w + bias on the named library: w is (N, K) if w_is_nk else (K, N), any strides; the
// blas side is exactly what the reference composition calls (at::linear / at::addmm / at::mm).
at::Tensor gemm_with(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias, bool w_is_nk,
                     GemmLibrary library);
// The same on the library measured faster for this weight shape and row count (use_onednn_gemm),
// ATen's otherwise (for every dtype but float32, and with torch.backends.mkldnn.enabled off).
at::Tensor library_gemm(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias, Form form,
                        bool w_is_nk);

}  // namespace convs2s
