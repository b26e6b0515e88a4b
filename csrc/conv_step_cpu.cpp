// Incremental decoding step of a causal convolution + GLU on the CPU.
//
// One call per layer per step: gather each row's parent state (beam reorder), shift it,
// append the new input into a fresh window buffer, multiply the (N, k*C_in) window by the
// linearised (k*C_in, 2C) weight through ATen's GEMM (MKL / oneDNN), and apply GLU in one
// pass. The new state is a view of the window buffer, so the input state is never written
// (parents repeat across beams, which makes an in-place update a race).

#include <ATen/Parallel.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <cmath>
#include <cstring>

#include "common.h"
#include "kernels.h"
#include "glu.h"
#include "small_gemm.h"

namespace convs2s {

namespace {

template <typename scalar_t>
void gather_shift_append(const at::Tensor& x_t, const at::Tensor& state, const int64_t* parent,
                         at::Tensor& window) {
  const int64_t rows = window.size(0), k = window.size(1), c_in = window.size(2);
  const scalar_t* x = x_t.data_ptr<scalar_t>();
  const scalar_t* s = state.data_ptr<scalar_t>();
  scalar_t* w = window.data_ptr<scalar_t>();
  const int64_t xs0 = x_t.stride(0), ss0 = state.stride(0), ss1 = state.stride(1);
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const int64_t src = parent ? parent[n] : n;
      scalar_t* dst = w + n * k * c_in;
      for (int64_t j = 0; j < k - 1; ++j) {
        std::memcpy(dst + j * c_in, s + src * ss0 + j * ss1, sizeof(scalar_t) * c_in);
      }
      std::memcpy(dst + (k - 1) * c_in, x + n * xs0, sizeof(scalar_t) * c_in);
    }
  });
}

}  // namespace

at::Tensor conv_window(const at::Tensor& x_t_in, const at::Tensor& state_in,
                       const c10::optional<at::Tensor>& beam_index) {
  CONVS2S_CHECK_CPU(x_t_in);
  CONVS2S_CHECK_CPU(state_in);
  CONVS2S_CHECK_DIM(x_t_in, 2);
  CONVS2S_CHECK_DIM(state_in, 3);
  const at::Tensor x_t = last_dim_contiguous(x_t_in);
  const at::Tensor state = last_dim_contiguous(state_in);
  const int64_t rows = x_t.size(0), c_in = x_t.size(1), k = state.size(1) + 1;
  TORCH_CHECK(state.size(2) == c_in && state.scalar_type() == x_t.scalar_type(),
              "state must be (N_prev, k-1, C_in) in x_t's dtype");
  at::Tensor parent;
  const int64_t* parent_ptr = nullptr;
  if (beam_index.has_value()) {
    parent = beam_index->to(at::kLong).contiguous();
    TORCH_CHECK(parent.dim() == 1 && parent.size(0) == rows, "beam_index must be (N,)");
    parent_ptr = parent.data_ptr<int64_t>();
    // rows are copied by these indices: a host loop over N integers, against reading out of bounds
    for (int64_t n = 0; n < rows; ++n)
      TORCH_CHECK(parent_ptr[n] >= 0 && parent_ptr[n] < state.size(0), "beam_index values must lie in [0, ",
                  state.size(0) - 1, "], got ", parent_ptr[n]);
  } else {
    TORCH_CHECK(state.size(0) == rows, "state rows must equal x_t rows without beam_index");
  }
  at::Tensor window = new_output({rows, k, c_in}, x_t.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x_t.scalar_type(), "conv_step_gather", [&] {
    gather_shift_append<scalar_t>(x_t, state, parent_ptr, window);
  });
  return window;
}

std::vector<at::Tensor> conv_step_forward(const at::Tensor& x_t, const at::Tensor& state,
                                          const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                                          const c10::optional<at::Tensor>& beam_index,
                                          const c10::optional<at::Tensor>& packed) {
  CONVS2S_CHECK_CPU(weight);
  CONVS2S_CHECK_DIM(weight, 3);
  TORCH_CHECK(weight.is_contiguous(), "weight must be contiguous (k, C_in, 2C)");
  CONVS2S_CHECK_DIM(x_t, 2);
  CONVS2S_CHECK_DIM(state, 3);
  const int64_t rows = x_t.size(0), c_in = x_t.size(1);
  const int64_t k = weight.size(0), c2 = weight.size(2);
  TORCH_CHECK(weight.size(1) == c_in && c2 % 2 == 0, "weight must be (k, C_in, 2C)");
  TORCH_CHECK(state.size(1) == k - 1 && state.size(2) == c_in, "state must be (N_prev, k-1, C_in)");
  const at::Tensor window = conv_window(x_t, state, beam_index);

  const at::Tensor flat = window.view({rows, k * c_in});
  const at::Tensor w2 = weight.view({k * c_in, c2});
  const at::Tensor pre = packed.has_value() ? measured_packed_product(flat, w2, *packed, bias)
                                            : measured_product(flat, w2, bias, /*w_is_nk=*/false);
  return {glu_rows(pre), window.narrow(1, 1, k - 1)};
}

at::Tensor glu_rows(const at::Tensor& pre_in) {
  const at::Tensor pre = pre_in.contiguous();
  const int64_t rows = pre.size(0), c = pre.size(1) / 2;
  at::Tensor out = new_output({rows, c}, pre.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, pre.scalar_type(), "conv_step_glu", [&] {
    glu_epilogue<scalar_t>(pre.data_ptr<scalar_t>(), nullptr, 1.0, rows, c, out.data_ptr<scalar_t>());
  });
  return out;
}

}  // namespace convs2s
