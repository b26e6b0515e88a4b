// The linear op and the float32 / bf16 products the conv kernels share: the few-row kernels
// (small_gemm.cpp) at the row counts the kernel choice measured for a weight shape, the measured
// library's GEMM (library_gemm.cpp) at the others.

#include "common.h"
#include "kernel_choice.h"
#include "library_gemm.h"
#include "small_gemm.h"

#include <algorithm>

namespace convs2s {

at::Tensor small_gemm(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias, bool w_is_nk) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && w.is_contiguous(), "small_gemm: x (M, K), contiguous 2-D weight");
  TORCH_CHECK(x.scalar_type() == w.scalar_type(), "small_gemm: x and weight must share a dtype");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, "small_gemm: float32 or bf16");
  const int64_t M = x.size(0), K = x.size(1), N = w_is_nk ? w.size(0) : w.size(1);
  TORCH_CHECK((w_is_nk ? w.size(1) : w.size(0)) == K, "small_gemm: weight does not match x's K");
  TORCH_CHECK(M >= 1 && M <= kSmallGemmMaxRows, "small_gemm takes 1..", kSmallGemmMaxRows, " rows");
  TORCH_CHECK(K >= 1 && N >= 1, "small_gemm: K and N must be positive");
  const at::Tensor xf = x.to(at::kFloat).contiguous();  // activations are tiny: widen once
  at::Tensor bf = bias.has_value() ? bias->to(at::kFloat).contiguous() : at::Tensor();
  at::Tensor y = new_output({M, N}, x.options().dtype(at::kFloat));
  const float* bp = bf.defined() ? bf.data_ptr<float>() : nullptr;
  if (w.scalar_type() == at::kFloat) {
    if (w_is_nk) small_gemm_nk(M, xf.data_ptr<float>(), K, w.data_ptr<float>(), N, K, bp, y.data_ptr<float>(), N);
    else small_gemm_kn(M, xf.data_ptr<float>(), K, w.data_ptr<float>(), K, N, bp, y.data_ptr<float>(), N);
    return y;
  }
  const at::BFloat16* wp = w.data_ptr<at::BFloat16>();
  if (w_is_nk) small_gemm_nk(M, xf.data_ptr<float>(), K, wp, N, K, bp, y.data_ptr<float>(), N);
  else small_gemm_kn(M, xf.data_ptr<float>(), K, wp, K, N, bp, y.data_ptr<float>(), N);
  return y.to(x.scalar_type());
}

void check_packed_kn(const at::Tensor& packed, int64_t K, int64_t N) {
  const int64_t NB = kn_packed_width();
  TORCH_CHECK(packed.dim() == 3 && packed.is_contiguous() && packed.device().is_cpu(),
              "a packed (K, N) weight is a contiguous CPU (blocks, K, width) tensor (pack_kn_weight)");
  TORCH_CHECK(packed.size(2) == NB, "the weight was packed ", packed.size(2), " columns a block, this CPU's kernels take ",
              NB, " (pack it again with pack_kn_weight)");
  TORCH_CHECK(packed.size(1) == K && N >= 1 && packed.size(0) == (N + NB - 1) / NB, "a packed (", packed.size(0), ", ",
              packed.size(1), ", ", NB, ") weight is not a (K, N) = (", K, ", ", N, ") weight");
}

at::Tensor small_gemm_packed(const at::Tensor& x, const at::Tensor& packed, int64_t N,
                             const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && packed.dim() == 3 && packed.is_contiguous(),
              "small_gemm_packed: x (M, K), packed (blocks, K, width) contiguous");
  TORCH_CHECK(x.scalar_type() == packed.scalar_type() &&
                  (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "small_gemm_packed: x and the packed weight must share a dtype, float32 or bf16");
  const int64_t M = x.size(0), K = x.size(1);
  check_packed_kn(packed, K, N);
  TORCH_CHECK(M >= 1, "small_gemm_packed takes at least one row");
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  at::Tensor bf = bias.has_value() ? bias->to(at::kFloat).contiguous() : at::Tensor();
  TORCH_CHECK(!bf.defined() || bf.numel() == N, "small_gemm_packed: bias must have N elements");
  at::Tensor y = new_output({M, N}, x.options().dtype(at::kFloat));
  const float* bp = bf.defined() ? bf.data_ptr<float>() : nullptr;
  // pieces of at most kSmallGemmMaxRows rows, each reading the whole weight (past the cap the
  // product is compute-bound: re-reading it costs little against the rows' arithmetic)
  for (int64_t r = 0; r < M; r += kSmallGemmMaxRows) {
    const int64_t rows = std::min(kSmallGemmMaxRows, M - r);
    const float* xr = xf.data_ptr<float>() + r * K;
    float* yr = y.data_ptr<float>() + r * N;
    if (packed.scalar_type() == at::kFloat)
      small_gemm_kn_packed(rows, xr, K, packed.data_ptr<float>(), K, N, bp, yr, N);
    else
      small_gemm_kn_packed(rows, xr, K, packed.data_ptr<at::BFloat16>(), K, N, bp, yr, N);
  }
  return x.scalar_type() == at::kFloat ? y : y.to(x.scalar_type());
}

at::Tensor measured_product(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias,
                            bool w_is_nk) {
  const auto dtype = x.scalar_type();
  const bool kernel_dtype = (dtype == at::kFloat || dtype == at::kBFloat16) && dtype == w.scalar_type();
  const int64_t K = x.size(1), N = w_is_nk ? w.size(0) : w.size(1);
  if (kernel_dtype && use_few_rows(w_is_nk ? Form::nk : Form::kn, w.scalar_type(), K, N, x.size(0)))
    return small_gemm(x, w.contiguous(), bias, w_is_nk);  // stream the weight once, not pack it for a GEMM
  return library_gemm(x, w, bias, w_is_nk ? Form::nk : Form::kn, w_is_nk);
}

// The pieces run one after another, each split between the threads by column blocks only: at 1024
// rows and more a narrow weight (768 x 256: 4 blocks of 64 columns) ran slower than the library,
// and a library GEMM would use every core of a larger machine; so the library takes the rows past
// 8 pieces (bench/results/kernel-decisions.md#linear-packed-pieces-max-rows).
constexpr int64_t kPackedPiecesMaxRows = 8 * kSmallGemmMaxRows;

at::Tensor measured_packed_product(const at::Tensor& x, const at::Tensor& w, const at::Tensor& packed,
                                   const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(w.dim() == 2 && packed.scalar_type() == w.scalar_type(), "the packed weight must be w's, packed");
  check_packed_kn(packed, w.size(0), w.size(1));
  const auto dtype = x.scalar_type();
  const bool kernel_dtype = (dtype == at::kFloat || dtype == at::kBFloat16) && dtype == packed.scalar_type();
  // Past the kernels' row cap, up to kPackedPiecesMaxRows: the kernel in pieces of that many rows
  // where it was measured faster than the GEMM at the cap: the pieces kept that lead past it
  // (bench/results/kernel-decisions.md#linear-packed-pieces-past-cap).
  const int64_t rows = x.size(0);
  if (kernel_dtype && rows <= kPackedPiecesMaxRows &&
      use_few_rows(Form::kp, dtype, x.size(1), w.size(1), std::min(rows, kSmallGemmMaxRows)))
    return small_gemm_packed(x, packed, w.size(1), bias);
  return library_gemm(x, w, bias, Form::kp, /*w_is_nk=*/false);
}

// y = x @ weight.T + bias for x (M, K) and weight (N, K), float32 or bf16: a decoding step's Linear,
// on the few-row kernel up to the rows measured for this shape (kernel_choice.h), else the measured library's GEMM;
// with `packed` (pack_kn_weight(weight.T)), the packed kernel at the rows measured for form kp.
at::Tensor small_linear(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                        const c10::optional<at::Tensor>& packed) {
  CONVS2S_CHECK_CPU(x);
  TORCH_CHECK(x.scalar_type() == weight.scalar_type() &&
                  (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "small_linear takes float32 or bf16 (x and weight alike)");
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1), "x (M, K), weight (N, K)");
  TORCH_CHECK(x.size(0) >= 1, "small_linear takes at least one row");
  if (packed.has_value()) return measured_packed_product(x, weight.t(), *packed, bias);  // pack_kn_weight(weight.t())
  // a transposed view of a (K, N) matrix (the attention fold's W_in^T): the (K, N) product, no copy
  if (!weight.is_contiguous() && weight.t().is_contiguous())
    return measured_product(x, weight.t(), bias, /*w_is_nk=*/false);
  return measured_product(x, weight, bias, /*w_is_nk=*/true);
}

}  // namespace convs2s
