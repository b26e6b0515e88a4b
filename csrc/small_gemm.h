// Few-row matrix products for decoding: the kernels (small_gemm.cpp) and the linear and
// linear_int8 products on them (linear_cpu.cpp, linear_int8_cpu.cpp).
#pragma once

#include <ATen/core/Tensor.h>

namespace convs2s {

constexpr int64_t kSmallGemmMaxRows = 64;  // the kernels take any rows up to this; which rows they should take is measured (kernel_choice)

// y[m, n] = s[n] * sum_k x[m, k] w[n, k] + b[n]: w is (N, K) row-major, as nn.Linear stores it.
// W is float, at::BFloat16 or int8_t; x, b, s and y are float32; s (the per-output scale of int8
// weights) and b may be null.
template <typename W>
void small_gemm_nk(int64_t rows, const float* x, int64_t ldx, const W* w, int64_t N, int64_t K,
                   const float* b, float* y, int64_t ldy, const float* s = nullptr);
// y[m, n] = s[n] * sum_k x[m, k] w[k, n] + b[n]: w is (K, N) row-major, as the linearised conv weight.
template <typename W>
void small_gemm_kn(int64_t rows, const float* x, int64_t ldx, const W* w, int64_t K, int64_t N,
                   const float* b, float* y, int64_t ldy, const float* s = nullptr);

// The same product with w packed by pack_kn_weight (blocks of kn_packed_width() columns, each a
// (K, width) row-major run, the last zero-padded): one contiguous stream per thread.
template <typename W>
void small_gemm_kn_packed(int64_t rows, const float* x, int64_t ldx, const W* packed, int64_t K, int64_t N,
                          const float* b, float* y, int64_t ldy, const float* s = nullptr);
// Columns per packed block on this CPU's kernels (64 at AVX-512, 16 otherwise).
int64_t kn_packed_width();
// A (K, N) float32 or bf16 weight as (ceil(N / width), K, width), zero-padded: small_gemm_kn_packed's layout.
at::Tensor pack_kn_weight(const at::Tensor& w);
// Checks that `packed` is a (K, N) weight in pack_kn_weight's layout for this CPU's kernels.
void check_packed_kn(const at::Tensor& packed, int64_t K, int64_t N);
// x (M, K) float32 or bf16 times a packed (K, N) weight of x's dtype (+ bias): small_gemm's (K, N)
// product through small_gemm_kn_packed, any M (pieces of kSmallGemmMaxRows rows); returns (M, N)
// in x's dtype.
at::Tensor small_gemm_packed(const at::Tensor& x, const at::Tensor& packed, int64_t N,
                             const c10::optional<at::Tensor>& bias);

// Few-row product through the kernels above for float32 or bf16 tensors: x (M, K) any strides
// with a contiguous last dim, w contiguous ((N, K) if w_is_nk else (K, N)); returns (M, N) in
// x's dtype (bf16 results rounded once from the float32 accumulators, as a bf16 GEMM would).
at::Tensor small_gemm(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias, bool w_is_nk);
// The same product (w (N, K) if w_is_nk else (K, N)), on small_gemm at the row counts the kernel
// choice gives the few-row kernels for this weight shape and dtype (kernel_choice.h), on the GEMM
// of the library measured faster at the others (library_gemm.h; ATen's for any other dtype).
at::Tensor measured_product(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias,
                            bool w_is_nk);
// x @ w (+ bias) for a (K, N) weight w and its packed layout (pack_kn_weight): small_gemm_packed at
// the row counts the kernel choice gives the packed kernel for this shape (form kp; from
// kSmallGemmMaxRows to 8 x kSmallGemmMaxRows rows, where it took kSmallGemmMaxRows), the measured
// library's GEMM on w at the others (ATen's for any other dtype).
at::Tensor measured_packed_product(const at::Tensor& x, const at::Tensor& w, const at::Tensor& packed,
                                   const c10::optional<at::Tensor>& bias);
// The linear op (linear_cpu.cpp): x @ weight.T + bias for x (M, K) and weight (N, K), float32 or
// bf16; with `packed` (pack_kn_weight(weight.T)) the packed kernel at the rows measured for form kp.
at::Tensor small_linear(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                        const c10::optional<at::Tensor>& packed);
// x (M, K) float32 @ (qweight (N, K) int8 * scale (N,) per row)^T + bias: weight-only int8 for
// decoding (a quarter of float32's bytes streamed, float32 activations and accumulation); rows
// past the measured limit (kernel_choice.h) dequantise the weight once and run a GEMM.
at::Tensor small_gemm_int8(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scale,
                           const c10::optional<at::Tensor>& bias);
// The checks of an int8-weight product's entry point (x (M, K) float32, qweight (N, K) int8, scale
// (N,) float32); messages start with `op`.
void check_int8_linear_args(const char* op, const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scale);
// The int8 few-row kernel itself (1..kSmallGemmMaxRows rows), whatever the measured limit.
at::Tensor small_gemm_int8_kernel(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scale,
                                  const c10::optional<at::Tensor>& bias);
// The instruction set the kernels were dispatched to on this CPU.
const char* small_gemm_isa();

}  // namespace convs2s
