// The float32 GEMM behind the few-row kernels: where they do not take a product (many rows, a
// shape they lost on), it runs on ATen's GEMM (a BLAS: MKL in torch's x86 builds) or on oneDNN's
// inner product through torch's own op (mkldnn::_linear_pointwise, which torch's CPU compiler emits),
// whichever was measured faster for that weight shape and row count (kernel_choice.h,
// convs2s_kernels.tune). Both, because neither wins everywhere by design: MKL runs its AVX2 code
// on AMD CPUs, where oneDNN took a fraction of its time
// (bench/results/kernel-decisions.md#library-gemm-onednn-or-mkl).
// oneDNN's sums come in another order than MKL's: equal to float32 rounding, not bit for bit (and
// once choices are in force, conv_glu's forward in training takes them too). torch's switch
// (torch.backends.mkldnn.enabled = False) turns the oneDNN side off.

#include "library_gemm.h"

#include <ATen/Context.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/full.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/ones.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>

namespace convs2s {

namespace {

// The op, where its schema is the one called below: (Tensor X, Tensor W, Tensor? B, str attr,
// Scalar?[] scalars, str? algorithm) -> Tensor (a torch that changed it goes without oneDNN here).
const std::optional<c10::OperatorHandle>& onednn_linear_op() {
  static const std::optional<c10::OperatorHandle> op = []() -> std::optional<c10::OperatorHandle> {
    auto found = c10::Dispatcher::singleton().findSchema({"mkldnn::_linear_pointwise", ""});
    if (!found.has_value()) return std::nullopt;
    const auto& schema = found->schema();
    const auto& args = schema.arguments();
    const char* names[] = {"X", "W", "B", "attr", "scalars", "algorithm"};
    if (args.size() != 6 || schema.returns().size() != 1) return std::nullopt;
    for (size_t i = 0; i < args.size(); ++i)
      if (args[i].name() != names[i]) return std::nullopt;
    return found;
  }();
  return op;
}

at::Tensor blas_gemm(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias, bool w_is_nk) {
  if (w_is_nk) return at::linear(x, w, bias);
  return bias.has_value() ? at::addmm(*bias, x, w) : at::mm(x, w);
}

// x @ w_nk^T + bias by oneDNN, the weight as it lies (a transposed view too): oneDNN reorders it
// for its kernel on every call: slower than a weight reordered once, still well ahead of MKL
// (bench/results/kernel-decisions.md#library-gemm-onednn-reorder).
at::Tensor onednn_gemm(const at::Tensor& x, const at::Tensor& w_nk, const c10::optional<at::Tensor>& bias) {
  torch::jit::Stack stack;
  stack.reserve(6);
  stack.emplace_back(x.contiguous());
  stack.emplace_back(w_nk);
  stack.emplace_back(bias.has_value() ? c10::IValue(bias->contiguous()) : c10::IValue());
  stack.emplace_back(std::string("none"));
  stack.emplace_back(c10::List<std::optional<at::Scalar>>());
  stack.emplace_back(c10::IValue());
  onednn_linear_op()->callBoxed(&stack);
  return std::move(stack[0]).toTensor();
}

// Whether oneDNN may take the call at all: float32 CPU tensors throughout.
bool float32_cpu(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias) {
  return x.device().is_cpu() && x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat &&
         (!bias.has_value() || bias->scalar_type() == at::kFloat);
}

}  // namespace

bool onednn_gemm_available() {
  static const bool available = [] {
    if (!onednn_linear_op().has_value()) return false;
    try {  // registered is not enough: a build without oneDNN's CPU kernels throws on use
      const auto f32 = at::TensorOptions().dtype(at::kFloat);
      const at::Tensor y = onednn_gemm(at::ones({2, 3}, f32), at::ones({4, 3}, f32), at::ones({4}, f32));
      return y.size(0) == 2 && y.size(1) == 4 && y.allclose(at::full({2, 4}, 4.f, f32));
    } catch (const std::exception&) {
      return false;
    }
  }();
  return available;
}

at::Tensor gemm_with(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias, bool w_is_nk,
                     GemmLibrary library) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2, "gemm_with: x (M, K) and a 2-D weight");
  if (library == GemmLibrary::blas) return blas_gemm(x, w, bias, w_is_nk);
  TORCH_CHECK(onednn_gemm_available(), "gemm_with: this torch build has no oneDNN inner product (mkldnn::_linear_pointwise)");
  TORCH_CHECK(float32_cpu(x, w, bias), "gemm_with: oneDNN is measured for float32 CPU tensors only");
  return onednn_gemm(x, w_is_nk ? w : w.t(), bias);
}

at::Tensor library_gemm(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias, Form form,
                        bool w_is_nk) {
  const int64_t K = x.size(1), N = w_is_nk ? w.size(0) : w.size(1);
  if (float32_cpu(x, w, bias) && x.size(0) >= 1 && use_onednn_gemm(form, at::kFloat, K, N, x.size(0)) &&
      at::globalContext().userEnabledMkldnn() && onednn_gemm_available())
    return onednn_gemm(x, w_is_nk ? w : w.t(), bias);
  return blas_gemm(x, w, bias, w_is_nk);
}

}  // namespace convs2s
