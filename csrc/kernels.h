// The entry points of the CPU kernels, one declaration each: the pybind module binds them and
// the one-call decoder step (decoder_step_cpu.cpp) calls the conv step directly.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace convs2s {

std::vector<at::Tensor> decoder_layers_step(
    at::Tensor x, const at::Tensor& emb_scores, const std::vector<at::Tensor>& states,
    const c10::optional<at::Tensor>& parents, const std::vector<at::Tensor>& conv_w,
    const std::vector<c10::optional<at::Tensor>>& conv_scale, const std::vector<c10::optional<at::Tensor>>& conv_b,
    const std::vector<int64_t>& residual, const std::vector<c10::optional<at::Tensor>>& proj_w,
    const std::vector<c10::optional<at::Tensor>>& proj_scale, const std::vector<c10::optional<at::Tensor>>& proj_b,
    const std::vector<c10::optional<at::Tensor>>& z_in, const std::vector<c10::optional<at::Tensor>>& z_bias,
    const std::vector<c10::optional<at::Tensor>>& y_out, const std::vector<c10::optional<at::Tensor>>& b_out,
    const at::Tensor& pad_mask, const at::Tensor& src_scale, bool need_attn, const std::vector<int64_t>& activation_bits,
    const std::vector<c10::optional<at::Tensor>>& conv_packed, const std::vector<c10::optional<at::Tensor>>& proj_packed,
    const std::vector<int64_t>& weight_bits);
std::vector<at::Tensor> beam_candidates(const at::Tensor& logits, const c10::optional<at::Tensor>& prev_scores,
                                        int64_t beam, int64_t step, int64_t max_len, int64_t min_len, double unkpen,
                                        const c10::optional<at::Tensor>& forced_len,
                                        const c10::optional<at::Tensor>& ignore, int64_t pad, int64_t eos,
                                        int64_t unk);
std::vector<at::Tensor> beam_update(const at::Tensor& cand_scores, const at::Tensor& cand_tokens,
                                    const at::Tensor& cand_beams, const at::Tensor& cand_eos, int64_t step,
                                    at::Tensor tokens, at::Tensor scores, const c10::optional<at::Tensor>& attn,
                                    const at::Tensor& ignore, const at::Tensor& sent_ids, at::Tensor f_tokens,
                                    at::Tensor f_pos_scores, at::Tensor f_scores, at::Tensor f_lengths,
                                    const c10::optional<at::Tensor>& f_attn, at::Tensor f_count, at::Tensor f_done,
                                    double lenpen, bool at_max_len, int64_t eos);
// GFLOP/s of register-only multiply-adds on every thread at the kernels' instruction set
// (fma_peak.cpp): the compute limit a roofline divides by; `iters` rounds per thread.
double fma_peak_gflops(int64_t iters);
// GB/s of one streaming read of `buffer` split between every thread, prefetching ahead as the int8
// kernels do (read_peak.cpp): the bandwidth limit a roofline divides by, beside a copy and a sum.
double read_peak_gbps(const at::Tensor& buffer);
// GOP/s (2 per multiply-add) of register-only exact int8 dot products on every thread, in the
// instructions linear_w8a8's kernels use for activation_bits (VNNI, or AVX2's vpmaddubsw sequence,
// shorter for 7-bit activations, two groups' pairs added before widening with 7-bit weights too); 0
// on the baseline.
double int8_dot_peak_gops(int64_t iters, int64_t activation_bits = 8, int64_t weight_bits = 8);
// The conv step's input window (N, k, C_in): state rows gathered by beam_index (or in order),
// shifted, x_t appended; the new state is its last k - 1 steps.
at::Tensor conv_window(const at::Tensor& x_t, const at::Tensor& state, const c10::optional<at::Tensor>& beam_index);
// GLU of (rows, 2C) products into (rows, C): the conv kernels' epilogue, one pass.
at::Tensor glu_rows(const at::Tensor& pre);
// packed: the weight viewed as (k * C_in, 2C) in pack_kn_weight's layout, or none.
std::vector<at::Tensor> conv_step_forward(const at::Tensor& x_t, const at::Tensor& state,
                                          const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                                          const c10::optional<at::Tensor>& beam_index,
                                          const c10::optional<at::Tensor>& packed = c10::nullopt);
// packed (inference): the weight viewed as (k * C_in, 2C) in pack_kn_weight's layout, or none.
std::vector<at::Tensor> conv_glu_forward(const at::Tensor& x, const at::Tensor& weight,
                                         const c10::optional<at::Tensor>& bias,
                                         const c10::optional<at::Tensor>& residual,
                                         const c10::optional<at::Tensor>& pad_mask, bool causal, double scale,
                                         const c10::optional<at::Tensor>& packed = c10::nullopt,
                                         int64_t winograd = 0);
std::vector<at::Tensor> conv_glu_backward(const at::Tensor& dout, const at::Tensor& x, const at::Tensor& weight,
                                          const at::Tensor& pre, const c10::optional<at::Tensor>& pad_mask,
                                          bool causal, double scale, bool need_residual_grad, int64_t winograd = 0);
// x times its dropout mask (a hash of seed and element index, kept with probability 1 - p) over
// 1 - p: dropout_cpu.cpp. The same call with the same seed applies the mask to the gradient.
at::Tensor dropout_apply(const at::Tensor& x, double p, int64_t seed);
// One NAG update of every parameter, in place (params and bufs; a missing grad counts as zero):
// nag_step_cpu.cpp.
void nag_step(const std::vector<at::Tensor>& params, const std::vector<c10::optional<at::Tensor>>& grads,
              const std::vector<at::Tensor>& bufs, double lr, double momentum, double weight_decay, double grad_scale);
// The L2 norm over every element of the tensors (contiguous, one floating dtype), as a float64
// scalar tensor, in one parallel pass: grad_norm_cpu.cpp.
at::Tensor grad_norm(const std::vector<at::Tensor>& tensors);
// The output projection x (N, C) @ weight (V, C)^T + bias and the label-smoothed cross-entropy
// summed over rows whose target is not ignore_index, block_rows rows at a time: output_loss_cpu.cpp.
// Returns (loss, nll) as float64 scalars, then (dx, dweight, dbias) for a gradient of 1 if grads.
// library: 0 every product on ATen's GEMM; 1 float32's logits and weight-gradient products on
// oneDNN's inner product (library_gemm.h), the input gradient's on ATen's (measured per machine).
std::vector<at::Tensor> output_loss_forward(const at::Tensor& x, const at::Tensor& weight,
                                            const c10::optional<at::Tensor>& bias, const at::Tensor& target, double eps,
                                            int64_t ignore_index, bool grads, int64_t block_rows, int64_t library);
// x (M, K) float32 quantised per row, times qweight (N, K) int8 with scale (N,): linear_w8a8_cpu.cpp.
// packed: the same weight in pack_w8a8_weight's layout (64-column blocks, 4 k per column), which
// the packed kernels read instead of packing per call. activation_bits: 8 (x quantised to
// [-127, 127]) or 7 ([-63, 63]: the AVX2 packed kernel then needs no sign moves). weight_bits 7
// says every weight lies in [-63, 63] (the caller checked it): with 7-bit activations the AVX2
// packed kernel then adds two groups' pairs in int16 before widening them.
at::Tensor linear_w8a8(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scale,
                       const c10::optional<at::Tensor>& bias, const c10::optional<at::Tensor>& packed,
                       int64_t activation_bits = 8, int64_t weight_bits = 8);
// The same on a named kernel (3 AMX-INT8 tiles, which need a packed weight and AMX; 2 the math
// library's int8 GEMM; 1 the packed-block kernel, packing per call without a packed weight; 0 the
// reducing one; -1 by rows, K, packed, AMX and whether the library's sums are exact here); the
// baseline has one kernel. For tests and measuring.
at::Tensor linear_w8a8_with(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scale,
                            const c10::optional<at::Tensor>& bias, int64_t kernel,
                            const c10::optional<at::Tensor>& packed, int64_t activation_bits = 8,
                            int64_t weight_bits = 8);
// "amx-int8", "avx512-vnni", "avx2" or "baseline": the kernel linear_w8a8 runs on this CPU.
const char* linear_w8a8_isa();
// Whether the math library's int8 GEMM gives exact sums here (then linear_w8a8 may use it, at the
// rows the kernel choice gives it, where AMX on a packed weight does not take the call).
bool linear_w8a8_library_exact();
// The kernel linear_w8a8_with(kernel=-1) runs for M rows of an (N, K) weight (0 reducing, 1
// packed blocks, 2 the library's int8 GEMM, 3 AMX), with activations of activation_bits (8 or 7:
// the kernel choice's form w8a8 or w7a8).
int64_t linear_w8a8_kernel(int64_t M, int64_t K, int64_t N, bool has_packed, int64_t activation_bits = 8);
// What a measured choice (form w8a8 or w7a8) runs where the packed kernel lost: the library where its
// sums are exact (2), else the reducing kernel (0).
int64_t linear_w8a8_alternative();
std::vector<at::Tensor> attention_forward(const at::Tensor& q, const at::Tensor& z, const at::Tensor& y,
                                          const c10::optional<at::Tensor>& src_lengths, bool left_pad);
std::vector<at::Tensor> attention_backward(const at::Tensor& dctx, const at::Tensor& q, const at::Tensor& z,
                                           const at::Tensor& y, const at::Tensor& p_scaled,
                                           const c10::optional<at::Tensor>& src_lengths, bool left_pad,
                                           const c10::optional<at::Tensor>& dp_extra);

}  // namespace convs2s
