// pybind11 module convs2s_kernels._C: the private entry points of the CPU kernels.
// The public, validated API is convs2s_kernels.ops; call these only through it.

#include <torch/extension.h>  // pybind11 and the type casters: the only file that parses them

#include "common.h"
#include "kernels.h"
#include "kernel_choice.h"
#include "library_gemm.h"
#include "small_gemm.h"
#include "huge_pages.h"

#include <unordered_map>

namespace convs2s {

at::ScalarType weight_dtype(const std::string& name) {
  static const std::unordered_map<std::string, at::ScalarType> names{
      {"float32", at::kFloat}, {"bfloat16", at::kBFloat16}, {"int8", at::kChar}};
  const auto it = names.find(name);
  TORCH_CHECK(it != names.end(), "weight dtype must be float32, bfloat16 or int8, got ", name);
  return it->second;
}
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "convs2s fused CPU kernels (private; use convs2s_kernels.ops)";
  m.def("beam_candidates", &convs2s::beam_candidates,
        "log-softmax, search rules, running scores and each sentence's top 2 * beam; "
        "returns (scores, tokens, beams, eos_mask)",
        py::arg("logits"), py::arg("prev_scores"), py::arg("beam"), py::arg("step"), py::arg("max_len"),
        py::arg("min_len"), py::arg("unkpen"), py::arg("forced_len"), py::arg("ignore"), py::arg("pad"),
        py::arg("eos"), py::arg("unk"));
  m.def("beam_update", &convs2s::beam_update,
        "record finished hypotheses and advance every beam, in place; returns (parents, ignore)");
  m.def("conv_step_forward", &convs2s::conv_step_forward,
        "reorder + shift + append + causal conv step + GLU; returns (out, new_state)",
        py::arg("x_t"), py::arg("state"), py::arg("weight"), py::arg("bias") = py::none(),
        py::arg("beam_index") = py::none(), py::arg("packed") = py::none());
  m.def("conv_glu_forward", &convs2s::conv_glu_forward,
        "conv (causal or centred) + bias + GLU + residual + scale; returns (out, pre)", py::arg("x"),
        py::arg("weight"), py::arg("bias"), py::arg("residual"), py::arg("pad_mask"), py::arg("causal"),
        py::arg("scale"), py::arg("packed") = py::none(), py::arg("winograd") = 0);
  m.def("conv_glu_backward", &convs2s::conv_glu_backward,
        "gradients of conv_glu_forward: (dx, dweight, dbias, dresidual)", py::arg("dout"), py::arg("x"),
        py::arg("weight"), py::arg("pre"), py::arg("pad_mask"), py::arg("causal"), py::arg("scale"),
        py::arg("need_residual_grad"), py::arg("winograd") = 0);
  m.def("dropout_apply", &convs2s::dropout_apply,
        "x times the dropout mask hashed from (seed, index), over 1 - p (forward and backward alike)", py::arg("x"),
        py::arg("p"), py::arg("seed"));
  m.def("nag_step", &convs2s::nag_step,
        "one NAG update in place: g = grad * grad_scale + weight_decay * p; buf = momentum * buf + g; "
        "p -= lr * (g + momentum * buf)", py::arg("params"), py::arg("grads"), py::arg("bufs"), py::arg("lr"),
        py::arg("momentum"), py::arg("weight_decay"), py::arg("grad_scale"));
  m.def("grad_norm", &convs2s::grad_norm, "the L2 norm over every element of the tensors, one pass (float64)",
        py::arg("tensors"));
  m.def("output_loss_forward", &convs2s::output_loss_forward,
        "output projection + label-smoothed cross-entropy, block by block; returns (loss, nll[, dx, dweight, dbias])",
        py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("target"), py::arg("eps"), py::arg("ignore_index"),
        py::arg("grads"), py::arg("block_rows"), py::arg("library") = 0);
  m.def("set_few_rows_choice",
        [](int64_t form, const std::string& dtype, int64_t K, int64_t N, const std::vector<bool>& kernel_rows) {
          convs2s::set_few_rows_choice(form, convs2s::weight_dtype(dtype), K, N, kernel_rows);
        },
        "which row counts (1..few_rows_max) the few-row kernels take for this weight shape (form 0: (N, K), "
        "1: (K, N), 3: (K, N) packed by pack_kn_weight); the others run ATen's GEMM (form 2: int8 (N, K) times int8 activations on a packed weight, the packed int8 kernel against "
        "linear_w8a8_alternative())",
        py::arg("form"), py::arg("dtype"), py::arg("K"), py::arg("N"), py::arg("kernel_rows"));
  m.def("clear_few_rows_choices", &convs2s::clear_few_rows_choices, "forget every measured choice (both kinds)");
  m.def("set_gemm_library_choice",
        [](int64_t form, const std::string& dtype, int64_t K, int64_t N, const std::vector<int64_t>& max_rows,
           const std::vector<bool>& onednn) {
          convs2s::set_gemm_library_choice(form, convs2s::weight_dtype(dtype), K, N, max_rows, onednn);
        },
        "which library's GEMM takes this float32 weight shape's rows where the few-row kernels do not: row ranges "
        "up to max_rows[i] (the last -1, no end), oneDNN where onednn[i], else ATen's BLAS",
        py::arg("form"), py::arg("dtype"), py::arg("K"), py::arg("N"), py::arg("max_rows"), py::arg("onednn"));
  m.def("gemm_library_choices", &convs2s::gemm_library_choices,
        "(form, dtype, K, N, max_rows, onednn) of every shape with a measured GEMM library");
  m.def("onednn_gemm_available", &convs2s::onednn_gemm_available,
        "whether torch's oneDNN inner product (mkldnn::_linear_pointwise) runs float32 here");
  m.def("gemm_with",
        [](const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias, bool w_is_nk,
           const std::string& library) {
          TORCH_CHECK(library == "blas" || library == "onednn", "library must be 'blas' or 'onednn', got ", library);
          return convs2s::gemm_with(x, w, bias, w_is_nk,
                                    library == "blas" ? convs2s::GemmLibrary::blas : convs2s::GemmLibrary::onednn);
        },
        "x @ w (+ bias) on the named library's GEMM, w (N, K) if w_is_nk else (K, N) (for measuring)", py::arg("x"),
        py::arg("w"), py::arg("bias"), py::arg("w_is_nk"), py::arg("library"));
  m.def("few_rows_choices", &convs2s::few_rows_choices, "(form, dtype, K, N, kernel_rows) of every measured shape");
  m.def("few_rows_max", [] { return convs2s::kSmallGemmMaxRows; }, "the most rows the few-row kernels take");
  m.def("few_rows_default", [] { return convs2s::kDefaultFewRows; }, "the limit of a shape never measured");
  m.def("small_gemm_kn", [](const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias) {
          return convs2s::small_gemm(x, w.contiguous(), bias, /*w_is_nk=*/false);
        }, "x @ w + bias on the few-row kernel, w (K, N) (for measuring)", py::arg("x"), py::arg("w"),
        py::arg("bias") = py::none());
  m.def("small_gemm_nk", [](const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias) {
          return convs2s::small_gemm(x, w.contiguous(), bias, /*w_is_nk=*/true);
        }, "x @ w.T + bias on the few-row kernel, w (N, K) (for measuring)", py::arg("x"), py::arg("w"),
        py::arg("bias") = py::none());
  m.def("fma_peak_gflops", &convs2s::fma_peak_gflops, "GFLOP/s of register-only multiply-adds on every thread, "
        "at the kernels' instruction set (the machine's compute limit)", py::arg("iters") = 20000000);
  m.def("read_peak_gbps", &convs2s::read_peak_gbps, "GB/s of one streaming read of a contiguous CPU tensor split "
        "between every thread, prefetching ahead as the int8 kernels do (the memory's read limit)", py::arg("buffer"));
  m.def("int8_dot_peak_gops", &convs2s::int8_dot_peak_gops, "GOP/s of register-only exact int8 dot products on every "
        "thread, in the instructions linear_w8a8's kernels use for activation_bits and weight_bits (0 where they "
        "have none)", py::arg("iters") = 20000000, py::arg("activation_bits") = 8, py::arg("weight_bits") = 8);
  m.def("huge_page_copy", &convs2s::huge_page_copy, "a contiguous copy of a CPU tensor on 2 MB transparent huge pages "
        "(advised; ordinary memory where the kernel grants none, or under 2 MB)", py::arg("t"));
  m.def("pack_kn_weight", &convs2s::pack_kn_weight, "a (K, N) weight in small_gemm_kn_packed's layout", py::arg("w"));
  m.def("kn_packed_width", &convs2s::kn_packed_width, "columns per packed block on this CPU's kernels");
  m.def("small_gemm_kn_packed", &convs2s::small_gemm_packed, "x @ w (+ bias) for w packed by pack_kn_weight",
        py::arg("x"), py::arg("packed"), py::arg("N"), py::arg("bias") = py::none());
  m.def("small_gemm_int8", &convs2s::small_gemm_int8_kernel,
        "the int8 few-row kernel itself, any rows up to few_rows_max (for measuring)", py::arg("x"),
        py::arg("qweight"), py::arg("scale"), py::arg("bias"));
  m.def("small_linear", &convs2s::small_linear, "x @ weight.T + bias for float32 or bf16 rows (few-row kernel or GEMM)",
        py::arg("x"), py::arg("weight"), py::arg("bias") = py::none(), py::arg("packed") = py::none());
  m.def("linear_int8", &convs2s::small_gemm_int8,
        "x @ (qweight * scale[:, None]).T + bias: float32 x, int8 (N, K) weight with a float32 scale per row",
        py::arg("x"), py::arg("qweight"), py::arg("scale"), py::arg("bias"));
  m.def("linear_w8a8", &convs2s::linear_w8a8,
        "x quantised per row to int8, times qweight (N, K) int8 with a float32 scale per row, plus bias",
        py::arg("x"), py::arg("qweight"), py::arg("scale"), py::arg("bias"), py::arg("packed") = py::none(),
        py::arg("activation_bits") = 8, py::arg("weight_bits") = 8);
  m.def("linear_w8a8_with", &convs2s::linear_w8a8_with,
        "linear_w8a8 on a named kernel (3: AMX-INT8 on a packed weight, 2: the library's int8 GEMM, 1: packed "
        "blocks, 0: reducing, -1: chosen by rows, K, the packed weight, AMX and the library's exactness; for measuring)",
        py::arg("x"), py::arg("qweight"), py::arg("scale"), py::arg("bias"), py::arg("kernel"),
        py::arg("packed") = py::none(), py::arg("activation_bits") = 8, py::arg("weight_bits") = 8);
  m.def("linear_w8a8_isa", &convs2s::linear_w8a8_isa, "the kernel linear_w8a8 runs on this CPU");
  m.def("linear_w8a8_library_exact", &convs2s::linear_w8a8_library_exact,
        "whether the math library's int8 GEMM sums exactly here (linear_w8a8 may then take it: see linear_w8a8_kernel)");
  m.def("linear_w8a8_kernel", &convs2s::linear_w8a8_kernel,
        "the kernel linear_w8a8 runs for M rows of an (N, K) int8 weight (0 reducing, 1 packed blocks, 2 the "
        "library's int8 GEMM, 3 AMX): by the measured kernel choice (form 2, or 4 for 7-bit activations), the "
        "packed weight and the CPU",
        py::arg("M"), py::arg("K"), py::arg("N"), py::arg("has_packed"), py::arg("activation_bits") = 8);
  m.def("linear_w8a8_alternative", &convs2s::linear_w8a8_alternative,
        "what a measured int8 choice runs where the packed kernel lost: 2 (the library, where exact) or 0 (reducing)");
  m.def("decoder_layers_step", &convs2s::decoder_layers_step,
        "every decoder layer of one step (folded attention) in one call: (x, attn or None, *new_states); the "
        "int8 layers' activation_bits and weight_bits per layer (0 in activation_bits: float activations)");
  m.def("small_gemm_isa", &convs2s::small_gemm_isa, "instruction set of the few-row kernels on this CPU");
  m.def("attention_forward", &convs2s::attention_forward,
        "sqrt(s) * softmax(q z^T) y over valid source steps; returns (context, p_scaled)", py::arg("q"),
        py::arg("z"), py::arg("y"), py::arg("src_lengths"), py::arg("left_pad"));
  m.def("attention_backward", &convs2s::attention_backward,
        "gradients of attention_forward: (dq, dz, dy); dp_extra is a gradient reaching p_scaled directly",
        py::arg("dctx"), py::arg("q"), py::arg("z"), py::arg("y"), py::arg("p_scaled"), py::arg("src_lengths"),
        py::arg("left_pad"), py::arg("dp_extra"));
}
