// Convolution (causal or centred) + bias + GLU + residual + scale on the CPU, forward and backward.
//
// The product is one matrix product (ATen's GEMM, or the few-row kernel where measured faster:
// small_gemm.h): the k shifted input rows of every output step are laid side by side (im2col,
// padding and the encoder's pad mask applied while copying), so (B*T, k*C_in) @ (k*C_in, 2C) is
// the whole convolution with the weight in fairseq's
// (k, C_in, 2C) layout, unpermuted. Everything else is one pass over memory, parallel over rows:
// the GLU epilogue (bias comes with the GEMM) and, backward, the fused GLU/scale derivative, then
// two GEMMs (weight and input gradients) and a col2im gather that needs no atomics.

#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/Dispatch.h>
#include <ATen/ops/mm.h>
#include <cmath>
#include <cstring>

#include "common.h"
#include "kernels.h"
#include "glu.h"
#include "small_gemm.h"

namespace convs2s {

namespace {

struct ConvGeometry {
  int64_t B, T, c_in, k, c_out, left;
};

ConvGeometry geometry(const at::Tensor& x, const at::Tensor& weight, bool causal) {
  const int64_t k = weight.size(0);
  return {x.size(0), x.size(1), x.size(2), k, weight.size(2) / 2, causal ? k - 1 : (k - 1) / 2};
}

// cols[b*T + t, j*C_in + c] = x[b, t + j - left, c], zero outside [0, T) and on padded steps.
template <typename scalar_t>
void im2col(const scalar_t* x, const bool* pad, const ConvGeometry& g, scalar_t* cols) {
  const int64_t width = g.k * g.c_in;
  at::parallel_for(0, g.B * g.T, 32, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t b = r / g.T, t = r % g.T;
      scalar_t* dst = cols + r * width;
      for (int64_t j = 0; j < g.k; ++j) {
        const int64_t s = t + j - g.left;
        if (s < 0 || s >= g.T || (pad && pad[b * g.T + s])) {
          std::memset(dst + j * g.c_in, 0, sizeof(scalar_t) * g.c_in);
        } else {
          std::memcpy(dst + j * g.c_in, x + (b * g.T + s) * g.c_in, sizeof(scalar_t) * g.c_in);
        }
      }
    }
  });
}

// dx[b, s, c] = sum_j dcols[b*T + s - j + left, j*C_in + c]; zero on padded steps.
template <typename scalar_t>
void col2im(const scalar_t* dcols, const bool* pad, const ConvGeometry& g, scalar_t* dx) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t width = g.k * g.c_in;
  at::parallel_for(0, g.B * g.T, 16, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> acc(g.c_in);
    for (int64_t r = begin; r < end; ++r) {
      const int64_t b = r / g.T, s = r % g.T;
      scalar_t* dst = dx + r * g.c_in;
      if (pad && pad[r]) {
        std::memset(dst, 0, sizeof(scalar_t) * g.c_in);
        continue;
      }
      std::fill(acc.begin(), acc.end(), acc_t(0));
      for (int64_t j = 0; j < g.k; ++j) {
        const int64_t t = s - j + g.left;
        if (t < 0 || t >= g.T) continue;
        const scalar_t* src = dcols + (b * g.T + t) * width + j * g.c_in;
        for (int64_t c = 0; c < g.c_in; ++c) acc[c] += static_cast<acc_t>(src[c]);
      }
      for (int64_t c = 0; c < g.c_in; ++c) dst[c] = static_cast<scalar_t>(acc[c]);
    }
  });
}

// dpre = [d * s, d * value * s * (1 - s)] with d = dout * scale and s = sigmoid(gate).
template <typename scalar_t>
void glu_backward(const scalar_t* dout, const scalar_t* pre, double scale, int64_t rows, int64_t c, scalar_t* dpre) {
  using acc_t = at::opmath_type<scalar_t>;
  const acc_t sc = static_cast<acc_t>(scale);
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const scalar_t* value = pre + r * 2 * c;
      const scalar_t* gate = value + c;
      const scalar_t* g = dout + r * c;
      scalar_t* dv = dpre + r * 2 * c;
      scalar_t* dg = dv + c;
      for (int64_t i = 0; i < c; ++i) {
        const acc_t d = static_cast<acc_t>(g[i]) * sc;
        const acc_t s = acc_t(1) / (acc_t(1) + std::exp(-static_cast<acc_t>(gate[i])));
        dv[i] = static_cast<scalar_t>(d * s);
        dg[i] = static_cast<scalar_t>(d * static_cast<acc_t>(value[i]) * s * (acc_t(1) - s));
      }
    }
  });
}

void check_inputs(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& pad_mask) {
  CONVS2S_CHECK_CPU(x);
  CONVS2S_CHECK_CPU(weight);
  CONVS2S_CHECK_DIM(x, 3);
  CONVS2S_CHECK_DIM(weight, 3);
  TORCH_CHECK(x.is_contiguous() && weight.is_contiguous(), "x and weight must be contiguous");
  TORCH_CHECK(weight.size(1) == x.size(2) && weight.size(2) % 2 == 0, "weight must be (k, C_in, 2C)");
  TORCH_CHECK(x.scalar_type() == weight.scalar_type(), "x and weight must share a dtype");
  if (pad_mask.has_value()) {
    TORCH_CHECK(pad_mask->scalar_type() == at::kBool && pad_mask->is_contiguous(), "pad_mask must be contiguous bool");
    TORCH_CHECK(pad_mask->size(0) == x.size(0) && pad_mask->size(1) == x.size(1), "pad_mask must be (B, T)");
  }
}

}  // namespace

// Returns (out (B, T, C), pre (B*T, 2C)); pre (the GLU input, bias included) is kept for backward.
std::vector<at::Tensor> conv_glu_forward(const at::Tensor& x, const at::Tensor& weight,
                                         const c10::optional<at::Tensor>& bias,
                                         const c10::optional<at::Tensor>& residual,
                                         const c10::optional<at::Tensor>& pad_mask, bool causal, double scale,
                                         const c10::optional<at::Tensor>& packed) {
  check_inputs(x, weight, pad_mask);
  const ConvGeometry g = geometry(x, weight, causal);
  if (residual.has_value()) {
    TORCH_CHECK(residual->is_contiguous() && residual->scalar_type() == x.scalar_type(),
                "residual must be contiguous with x's dtype");
  }
  const int64_t rows = g.B * g.T;
  at::Tensor cols = new_output({rows, g.k * g.c_in}, x.options());
  const bool* pad = pad_mask.has_value() ? pad_mask->data_ptr<bool>() : nullptr;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "conv_glu_im2col", [&] {
    im2col<scalar_t>(x.data_ptr<scalar_t>(), pad, g, cols.data_ptr<scalar_t>());
  });
  const at::Tensor w2 = weight.view({g.k * g.c_in, 2 * g.c_out});
  // A short batch (an encoder's sentence or two: a few dozen rows) is a few-row product against a
  // large weight, where the measured choice streams the weight once instead of packing it (the
  // packed copy where given: the kernel's whole-K register tiles, in 64-row pieces past its cap).
  at::Tensor pre = packed.has_value() ? measured_packed_product(cols, w2, *packed, bias)
                                      : measured_product(cols, w2, bias, /*w_is_nk=*/false);
  at::Tensor out = new_output({g.B, g.T, g.c_out}, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "conv_glu_epilogue", [&] {
    glu_epilogue<scalar_t>(pre.data_ptr<scalar_t>(), residual.has_value() ? residual->data_ptr<scalar_t>() : nullptr,
                           scale, rows, g.c_out, out.data_ptr<scalar_t>());
  });
  return {out, pre};
}

// Returns (dx, dweight, dbias, dresidual or undefined) for dout (B, T, C).
std::vector<at::Tensor> conv_glu_backward(const at::Tensor& dout, const at::Tensor& x, const at::Tensor& weight,
                                          const at::Tensor& pre, const c10::optional<at::Tensor>& pad_mask,
                                          bool causal, double scale, bool need_residual_grad) {
  check_inputs(x, weight, pad_mask);
  const ConvGeometry g = geometry(x, weight, causal);
  const int64_t rows = g.B * g.T;
  TORCH_CHECK(dout.is_contiguous() && pre.is_contiguous(), "dout and pre must be contiguous");
  at::Tensor dpre = new_output({rows, 2 * g.c_out}, x.options());
  at::Tensor cols = new_output({rows, g.k * g.c_in}, x.options());
  const bool* pad = pad_mask.has_value() ? pad_mask->data_ptr<bool>() : nullptr;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "conv_glu_backward_glu", [&] {
    glu_backward<scalar_t>(dout.data_ptr<scalar_t>(), pre.data_ptr<scalar_t>(), scale, rows, g.c_out,
                           dpre.data_ptr<scalar_t>());
    im2col<scalar_t>(x.data_ptr<scalar_t>(), pad, g, cols.data_ptr<scalar_t>());  // recomputed, not saved
  });
  const at::Tensor w2 = weight.view({g.k * g.c_in, 2 * g.c_out});
  at::Tensor dweight = at::mm(cols.t(), dpre).view_as(weight);
  // bias gradient summed in float32 for reduced-precision inputs
  at::Tensor dbias = dpre.sum(0, /*keepdim=*/false, at::toOpMathType(x.scalar_type())).to(x.scalar_type());
  at::Tensor dcols = at::mm(dpre, w2.t());
  at::Tensor dx = new_output(x.sizes(), x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "conv_glu_col2im", [&] {
    col2im<scalar_t>(dcols.data_ptr<scalar_t>(), pad, g, dx.data_ptr<scalar_t>());
  });
  at::Tensor dres = need_residual_grad ? dout.mul(scale) : at::Tensor();
  return {dx, dweight, dbias, dres};
}

}  // namespace convs2s
