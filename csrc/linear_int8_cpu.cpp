// The linear_int8 op: weight-only int8 (a quarter of float32's bytes streamed, float32 activations
// and accumulation) on the few-row kernel, or a GEMM on the weight dequantised once past the rows
// the kernel choice measured for it.

#include "common.h"
#include <ATen/ops/addmm.h>
#include <ATen/ops/mm.h>
#include "kernel_choice.h"
#include "small_gemm.h"

namespace convs2s {

void check_int8_linear_args(const char* op, const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scale) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, op, ": x must be float32 (M, K)");
  TORCH_CHECK(qweight.dim() == 2 && qweight.scalar_type() == at::kChar, op, ": qweight must be int8 (N, K)");
  TORCH_CHECK(qweight.size(1) == x.size(1), op, ": qweight has ", qweight.size(1), " input features but x has ",
              x.size(1));
  TORCH_CHECK(scale.dim() == 1 && scale.size(0) == qweight.size(0) && scale.scalar_type() == at::kFloat, op,
              ": scale must be float32 (N,)");
}

at::Tensor small_gemm_int8_kernel(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scale,
                                  const c10::optional<at::Tensor>& bias) {
  check_int8_linear_args("linear_int8", x, qweight, scale);
  const int64_t M = x.size(0), K = x.size(1), N = qweight.size(0);
  TORCH_CHECK(M >= 1 && M <= kSmallGemmMaxRows, "the int8 few-row kernel takes 1..", kSmallGemmMaxRows, " rows");
  TORCH_CHECK(K >= 1 && N >= 1, "the int8 few-row kernel: K and N must be positive");
  const at::Tensor xc = x.contiguous(), qc = qweight.contiguous(), sc = scale.contiguous();
  at::Tensor bf = bias.has_value() ? bias->to(at::kFloat).contiguous() : at::Tensor();
  at::Tensor y = new_output({M, N}, x.options());
  small_gemm_nk(M, xc.data_ptr<float>(), K, qc.data_ptr<int8_t>(), N, K, bf.defined() ? bf.data_ptr<float>() : nullptr,
                y.data_ptr<float>(), N, sc.data_ptr<float>());
  return y;
}

at::Tensor small_gemm_int8(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scale,
                           const c10::optional<at::Tensor>& bias) {
  check_int8_linear_args("linear_int8", x, qweight, scale);
  if (!use_few_rows(Form::nk, at::kChar, x.size(1), qweight.size(0), x.size(0))) {
    // many rows: a GEMM is compute-bound there, so dequantise once and let the BLAS run
    const at::Tensor w = qweight.to(at::kFloat).mul_(scale.unsqueeze(1));
    return bias.has_value() ? at::addmm(*bias, x, w.t()) : at::mm(x, w.t());
  }
  return small_gemm_int8_kernel(x, qweight, scale, bias);
}

}  // namespace convs2s
