// pybind11 module convs2s_kernels._C: the private entry points of the CPU kernels.
// The public, validated API is convs2s_kernels.ops; call these only through it.

#include "common.h"

namespace convs2s {
std::vector<at::Tensor> conv_step_forward(const at::Tensor& x_t, const at::Tensor& state,
                                          const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                                          const c10::optional<at::Tensor>& beam_index);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "convs2s fused CPU kernels (private; use convs2s_kernels.ops)";
  m.def("conv_step_forward", &convs2s::conv_step_forward,
        "reorder + shift + append + causal conv step + GLU; returns (out, new_state)",
        py::arg("x_t"), py::arg("state"), py::arg("weight"), py::arg("bias") = py::none(),
        py::arg("beam_index") = py::none());
}
