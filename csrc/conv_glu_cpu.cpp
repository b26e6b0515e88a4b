// Convolution (causal or centred) + bias + GLU + residual + scale on the CPU, forward and backward.
//
// The product is one matrix product (ATen's GEMM, or the few-row kernel where measured faster:
// small_gemm.h): the k shifted input rows of every output step are laid side by side (im2col,
// padding and the encoder's pad mask applied while copying), so (B*T, k*C_in) @ (k*C_in, 2C) is
// the whole convolution with the weight in fairseq's
// (k, C_in, 2C) layout, unpermuted. Everything else is one pass over memory, parallel over rows:
// the GLU epilogue (bias comes with the GEMM) and, backward, the fused GLU/scale derivative, then
// two GEMMs (weight and input gradients) and a col2im gather that needs no atomics.
//
// In training (the caller asks with winograd = m), a width-3 convolution is instead Winograd's
// minimal filtering F(m, 3) along time: each tile of m output steps is alpha = m + 2 batched
// products of (tiles, C_in) @ (C_in, 2C) on transformed inputs and weights, 3m / (m + 2) times fewer
// multiply-adds than im2col's (1.5x for m = 2, 2x for m = 4), the three products of forward and
// backward alike; the transforms are passes over memory.

#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/Dispatch.h>
#include <ATen/ops/bmm.h>
#include <ATen/ops/mm.h>
#include <ATen/record_function.h>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "common.h"
#include "kernels.h"
#include "glu.h"
#include "lincomb.h"
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

// One row of the GLU derivative: dv = d * s, dg = d * value * s * (1 - s) with d = dout * scale and
// s = sigmoid(gate) over c channels; dres = d unless null (the residual's gradient, same pass).
template <typename scalar_t>
inline void glu_backward_row(const scalar_t* g, const scalar_t* value, const scalar_t* gate,
                             at::opmath_type<scalar_t> sc, int64_t c, scalar_t* dv, scalar_t* dg, scalar_t* dr) {
  using acc_t = at::opmath_type<scalar_t>;
  if constexpr (std::is_same_v<scalar_t, float>) {
    glu_backward_span_f32(g, value, gate, sc, c, dv, dg, dr);  // vectorised, a polynomial exp
  } else if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {  // widened, the float32 span, rounded back
    float* buf = bf16_scratch(6 * c);
    float *gf = buf, *vf = buf + c, *tf = buf + 2 * c, *dvf = buf + 3 * c, *dgf = buf + 4 * c;
    float* drf = dr ? buf + 5 * c : nullptr;
    bf16_to_f32(g, c, gf);
    bf16_to_f32(value, c, vf);
    bf16_to_f32(gate, c, tf);
    glu_backward_span_f32(gf, vf, tf, sc, c, dvf, dgf, drf);
    f32_to_bf16(dvf, c, dv);
    f32_to_bf16(dgf, c, dg);
    if (dr) f32_to_bf16(drf, c, dr);
  } else {
    for (int64_t i = 0; i < c; ++i) {
      const acc_t d = static_cast<acc_t>(g[i]) * sc;
      const acc_t s = acc_t(1) / (acc_t(1) + std::exp(-static_cast<acc_t>(gate[i])));
      dv[i] = static_cast<scalar_t>(d * s);
      dg[i] = static_cast<scalar_t>(d * static_cast<acc_t>(value[i]) * s * (acc_t(1) - s));
      if (dr) dr[i] = static_cast<scalar_t>(d);
    }
  }
}

// dpre = [d * s, d * value * s * (1 - s)] with d = dout * scale and s = sigmoid(gate); dres = d
// where asked (the residual's gradient, written in the same pass).
template <typename scalar_t>
void glu_backward(const scalar_t* dout, const scalar_t* pre, double scale, int64_t rows, int64_t c, scalar_t* dpre,
                  scalar_t* dres) {
  using acc_t = at::opmath_type<scalar_t>;
  const acc_t sc = static_cast<acc_t>(scale);
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const scalar_t* value = pre + r * 2 * c;
      scalar_t* dv = dpre + r * 2 * c;
      glu_backward_row<scalar_t>(dout + r * c, value, value + c, sc, c, dv, dv + c, dres ? dres + r * c : nullptr);
    }
  });
}

// One row of the GLU epilogue: out = (value * sigmoid(gate) + res) * scale over c channels (res may be null).
template <typename scalar_t>
inline void glu_row(const scalar_t* value, const scalar_t* gate, const scalar_t* res, at::opmath_type<scalar_t> sc,
                    int64_t c, scalar_t* out) {
  using acc_t = at::opmath_type<scalar_t>;
  if constexpr (std::is_same_v<scalar_t, float>) {
    glu_span_f32(value, gate, res, sc, c, out);
  } else {
    for (int64_t i = 0; i < c; ++i) {
      acc_t v = static_cast<acc_t>(value[i]) / (acc_t(1) + std::exp(-static_cast<acc_t>(gate[i])));
      if (res) v += static_cast<acc_t>(res[i]);
      out[i] = static_cast<scalar_t>(v * sc);
    }
  }
}

// dst = (init or 0) + sum_j coef[j] * src[j] over n channels: lincomb_f32 for float32, the
// same order of terms in scalar_t otherwise.
template <typename scalar_t>
void combine(int terms, const scalar_t* coef, const scalar_t* const* src, const scalar_t* init, int64_t n,
             scalar_t* dst) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    lincomb_f32(terms, coef, src, init, n, dst);
  } else {
    for (int64_t c = 0; c < n; ++c) {
      scalar_t acc = init ? init[c] : scalar_t(0);
      for (int j = 0; j < terms; ++j) acc += coef[j] * src[j][c];
      dst[c] = acc;
    }
  }
}

// Winograd F(m, 3) (Lavin & Gray 2016; the points 0, +-1, +-2 and infinity): y = AT [(G g) . (BT d)]
// for d, alpha = m + 2 input steps, and g, the 3 taps: y_i = sum_j d_{i+j} g_j.
template <int M>
struct Winograd;
template <>
struct Winograd<2> {
  static constexpr int alpha = 4;
  static constexpr double BT[4][4] = {{1, 0, -1, 0}, {0, 1, 1, 0}, {0, -1, 1, 0}, {0, 1, 0, -1}};
  static constexpr double G[4][3] = {{1, 0, 0}, {0.5, 0.5, 0.5}, {0.5, -0.5, 0.5}, {0, 0, 1}};
  static constexpr double AT[2][4] = {{1, 1, 1, 0}, {0, 1, -1, -1}};
};
template <>
struct Winograd<4> {
  static constexpr int alpha = 6;
  static constexpr double BT[6][6] = {{4, 0, -5, 0, 1, 0},  {0, -4, -4, 1, 1, 0}, {0, 4, -4, -1, 1, 0},
                                      {0, -2, -1, 2, 1, 0}, {0, 2, -1, -2, 1, 0}, {0, 4, 0, -5, 0, 1}};
  static constexpr double G[6][3] = {{1. / 4, 0, 0},           {-1. / 6, -1. / 6, -1. / 6}, {-1. / 6, 1. / 6, -1. / 6},
                                     {1. / 24, 1. / 12, 1. / 6}, {1. / 24, -1. / 12, 1. / 6}, {0, 0, 1}};
  static constexpr double AT[4][6] = {{1, 1, 1, 1, 1, 0}, {0, 1, -1, 2, -2, 0}, {0, 1, 1, 4, 4, 0}, {0, 1, -1, 8, -8, 1}};
};

// V[p, b*nt + n, c] = sum_q BT[p][q] x[b, n*m + q - left, c], zero outside [0, T) and on padded steps.
template <int M, typename scalar_t>
void winograd_inputs(const scalar_t* x, const bool* pad, const ConvGeometry& g, int64_t nt, scalar_t* V) {
  RECORD_FUNCTION("convs2s::winograd_inputs", std::vector<c10::IValue>());
  using W = Winograd<M>;
  const int64_t tiles = g.B * nt, C = g.c_in;
  at::parallel_for(0, tiles, 8, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t b = r / nt, t0 = (r % nt) * M;
      const scalar_t* d[W::alpha];
      for (int q = 0; q < W::alpha; ++q) {
        const int64_t s = t0 + q - g.left;
        d[q] = (s < 0 || s >= g.T || (pad && pad[b * g.T + s])) ? nullptr : x + (b * g.T + s) * C;
      }
      for (int p = 0; p < W::alpha; ++p) {
        scalar_t coef[W::alpha];
        const scalar_t* src[W::alpha];
        int terms = 0;
        for (int q = 0; q < W::alpha; ++q) {
          if (W::BT[p][q] == 0 || d[q] == nullptr) continue;
          coef[terms] = static_cast<scalar_t>(W::BT[p][q]);
          src[terms++] = d[q];
        }
        combine<scalar_t>(terms, coef, src, nullptr, C, V + (p * tiles + r) * C);
      }
    }
  });
}

// pre[b*T + n*m + i] = sum_p AT[i][p] Mt[p, b*nt + n] + bias, for the steps inside [0, T), and
// each step's GLU epilogue out = (value * sigmoid(gate) + residual) * scale while its row is in cache.
template <int M, typename scalar_t>
void winograd_outputs(const scalar_t* Mt, const scalar_t* bias, const scalar_t* res, double scale,
                      const ConvGeometry& g, int64_t nt, scalar_t* pre, scalar_t* out) {
  RECORD_FUNCTION("convs2s::winograd_outputs", std::vector<c10::IValue>());
  using W = Winograd<M>;
  const int64_t tiles = g.B * nt, C = g.c_out, N = 2 * C;
  const auto sc = static_cast<at::opmath_type<scalar_t>>(scale);
  at::parallel_for(0, tiles, 8, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t b = r / nt, t0 = (r % nt) * M;
      for (int i = 0; i < M && t0 + i < g.T; ++i) {
        scalar_t coef[W::alpha];
        const scalar_t* src[W::alpha];
        int terms = 0;
        for (int p = 0; p < W::alpha; ++p) {
          if (W::AT[i][p] == 0) continue;
          coef[terms] = static_cast<scalar_t>(W::AT[i][p]);
          src[terms++] = Mt + (p * tiles + r) * N;
        }
        const int64_t row = b * g.T + t0 + i;
        scalar_t* pr = pre + row * N;
        combine<scalar_t>(terms, coef, src, bias, N, pr);
        glu_row<scalar_t>(pr, pr + C, res ? res + row * C : nullptr, sc, C, out + row * C);
      }
    }
  });
}

// dMt[p, b*nt + n] = sum_i AT[i][p] dpre[b*T + n*m + i] (the steps inside [0, T): the outputs'
// transpose), each tile's dpre rows made from dout and pre by the GLU's derivative in a buffer of
// the tile's own (dpre never goes to memory), with dres (where asked) and the bias gradient's sum
// (per thread, then over the threads in order).
template <int M, typename scalar_t>
void winograd_glu_output_grads(const scalar_t* dout, const scalar_t* pre, double scale, const ConvGeometry& g,
                               int64_t nt, scalar_t* dMt, scalar_t* dres, scalar_t* dbias) {
  RECORD_FUNCTION("convs2s::winograd_glu_output_grads", std::vector<c10::IValue>());
  using W = Winograd<M>;
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t tiles = g.B * nt, C = g.c_out, N = 2 * C;
  const acc_t sc = static_cast<acc_t>(scale);
  const int threads = at::get_num_threads();
  std::vector<acc_t> partial(static_cast<size_t>(threads) * N, acc_t(0));
  at::parallel_for(0, tiles, 8, [&](int64_t begin, int64_t end) {
    acc_t* part = partial.data() + static_cast<int64_t>(at::get_thread_num()) * N;
    std::vector<scalar_t> local(M * N);
    for (int64_t r = begin; r < end; ++r) {
      const int64_t b = r / nt, t0 = (r % nt) * M;
      const int steps = static_cast<int>(std::min<int64_t>(M, g.T - t0));
      for (int i = 0; i < steps; ++i) {
        const int64_t row = b * g.T + t0 + i;
        const scalar_t* value = pre + row * N;
        scalar_t* dv = local.data() + i * N;
        glu_backward_row<scalar_t>(dout + row * C, value, value + C, sc, C, dv, dv + C,
                                   dres ? dres + row * C : nullptr);
        for (int64_t n = 0; n < N; ++n) part[n] += static_cast<acc_t>(dv[n]);
      }
      for (int p = 0; p < W::alpha; ++p) {
        scalar_t coef[M];
        const scalar_t* src[M];
        int terms = 0;
        for (int i = 0; i < steps; ++i) {
          if (W::AT[i][p] == 0) continue;
          coef[terms] = static_cast<scalar_t>(W::AT[i][p]);
          src[terms++] = local.data() + i * N;
        }
        combine<scalar_t>(terms, coef, src, nullptr, N, dMt + (p * tiles + r) * N);
      }
    }
  });
  for (int64_t n = 0; n < N; ++n) {
    acc_t total = 0;
    for (int t = 0; t < threads; ++t) total += partial[static_cast<size_t>(t) * N + n];
    dbias[n] = static_cast<scalar_t>(total);
  }
}

// dx[b, s] = sum over the tiles n and points q with n*m + q - left = s of sum_p BT[p][q] dV[p, b*nt + n]:
// the inputs' transpose, a gather per step (no atomics); zero on padded steps.
template <int M, typename scalar_t>
void winograd_input_grads(const scalar_t* dV, const bool* pad, const ConvGeometry& g, int64_t nt, scalar_t* dx) {
  RECORD_FUNCTION("convs2s::winograd_input_grads", std::vector<c10::IValue>());
  using W = Winograd<M>;
  static_assert(W::alpha * W::alpha <= kLincombMaxTerms, "lincomb's terms");
  const int64_t tiles = g.B * nt, C = g.c_in;
  at::parallel_for(0, g.B * g.T, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t b = r / g.T, s = r % g.T;
      scalar_t* dst = dx + r * C;
      if (pad && pad[r]) {
        std::fill(dst, dst + C, scalar_t(0));
        continue;
      }
      scalar_t coef[W::alpha * W::alpha];
      const scalar_t* src[W::alpha * W::alpha];
      int terms = 0;
      for (int q = 0; q < W::alpha; ++q) {
        const int64_t t0 = s + g.left - q;
        if (t0 < 0 || t0 % M != 0 || t0 / M >= nt) continue;
        const int64_t tile = b * nt + t0 / M;
        for (int p = 0; p < W::alpha; ++p) {
          if (W::BT[p][q] == 0) continue;
          coef[terms] = static_cast<scalar_t>(W::BT[p][q]);
          src[terms++] = dV + (p * tiles + tile) * C;
        }
      }
      combine<scalar_t>(terms, coef, src, nullptr, C, dst);
    }
  });
}

// U[p] = sum_j G[p][j] w[j] over the n = C_in * 2C weights of each tap (weight_grads: dw[j] =
// sum_p G[p][j] dU[p]), in chunks that stay in L1 across the alpha (or 3) rows they write. ATen's
// GEMM ran these K = 3 and K = 6 products at a tenth of memory speed
// (bench/results/amd-zen3-2c/training-ops.md, "The Winograd weight transform").
constexpr int64_t kWeightChunk = 1024;

// dst[o] = sum_i coef(o, i) src[i] for Out rows of n elements from In rows, zero terms skipped.
template <int Out, int In, typename scalar_t, typename Coef>
void weight_rows_lincomb(const scalar_t* src, int64_t n, scalar_t* dst, const Coef& coef) {
  at::parallel_for(0, (n + kWeightChunk - 1) / kWeightChunk, 4, [&](int64_t begin, int64_t end) {
    for (int64_t chunk = begin; chunk < end; ++chunk) {
      const int64_t c0 = chunk * kWeightChunk, len = std::min(n, c0 + kWeightChunk) - c0;
      for (int o = 0; o < Out; ++o) {
        scalar_t coefs[In];
        const scalar_t* rows[In];
        int terms = 0;
        for (int i = 0; i < In; ++i) {
          if (coef(o, i) == 0) continue;
          coefs[terms] = static_cast<scalar_t>(coef(o, i));
          rows[terms++] = src + i * n + c0;
        }
        combine<scalar_t>(terms, coefs, rows, nullptr, len, dst + o * n + c0);
      }
    }
  });
}

template <int M, typename scalar_t>
void winograd_weights(const scalar_t* w, int64_t n, scalar_t* U) {
  RECORD_FUNCTION("convs2s::winograd_weights", std::vector<c10::IValue>());
  using W = Winograd<M>;
  weight_rows_lincomb<W::alpha, 3>(w, n, U, [](int p, int j) { return W::G[p][j]; });
}

template <int M, typename scalar_t>
void winograd_weight_grads(const scalar_t* dU, int64_t n, scalar_t* dw) {
  RECORD_FUNCTION("convs2s::winograd_weight_grads", std::vector<c10::IValue>());
  using W = Winograd<M>;
  weight_rows_lincomb<3, W::alpha>(dU, n, dw, [](int j, int p) { return W::G[p][j]; });
}

// The (alpha, C_in, 2C) transformed weight U = G @ weight.
template <int M>
at::Tensor winograd_u(const at::Tensor& weight) {
  using W = Winograd<M>;
  const int64_t n = weight.size(1) * weight.size(2);
  at::Tensor U = new_output({W::alpha, weight.size(1), weight.size(2)}, weight.options());
  AT_DISPATCH_FLOATING_TYPES(weight.scalar_type(), "conv_glu_winograd_weights", [&] {
    winograd_weights<M, scalar_t>(weight.data_ptr<scalar_t>(), n, U.data_ptr<scalar_t>());
  });
  return U;
}

// (pre, out): the convolution's GLU input (bias included, kept for backward) and the layer's output.
template <int M>
std::vector<at::Tensor> winograd_forward(const at::Tensor& x, const at::Tensor& weight,
                                         const c10::optional<at::Tensor>& bias,
                                         const c10::optional<at::Tensor>& residual, double scale, const bool* pad,
                                         const ConvGeometry& g) {
  using W = Winograd<M>;
  const int64_t nt = (g.T + M - 1) / M, tiles = g.B * nt;
  at::Tensor V = new_output({W::alpha, tiles, g.c_in}, x.options());
  const at::Tensor U = winograd_u<M>(weight);
  at::Tensor pre = new_output({g.B * g.T, 2 * g.c_out}, x.options());
  at::Tensor out = new_output({g.B, g.T, g.c_out}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "conv_glu_winograd_inputs", [&] {
    winograd_inputs<M, scalar_t>(x.data_ptr<scalar_t>(), pad, g, nt, V.data_ptr<scalar_t>());
  });
  const at::Tensor Mt = at::bmm(V, U);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "conv_glu_winograd_outputs", [&] {
    winograd_outputs<M, scalar_t>(Mt.data_ptr<scalar_t>(), bias.has_value() ? bias->data_ptr<scalar_t>() : nullptr,
                                  residual.has_value() ? residual->data_ptr<scalar_t>() : nullptr, scale, g, nt,
                                  pre.data_ptr<scalar_t>(), out.data_ptr<scalar_t>());
  });
  return {pre, out};
}

// (dx, dweight, dbias, dres or undefined) from dout: the GLU's derivative fused into the outputs' transpose.
template <int M>
std::vector<at::Tensor> winograd_backward(const at::Tensor& dout, const at::Tensor& pre, double scale,
                                          bool need_residual_grad, const at::Tensor& x, const at::Tensor& weight,
                                          const bool* pad, const ConvGeometry& g) {
  using W = Winograd<M>;
  const int64_t nt = (g.T + M - 1) / M, tiles = g.B * nt;
  const at::Tensor U = winograd_u<M>(weight);
  at::Tensor V = new_output({W::alpha, tiles, g.c_in}, x.options());
  at::Tensor dMt = new_output({W::alpha, tiles, 2 * g.c_out}, x.options());
  at::Tensor dres = need_residual_grad ? new_output(dout.sizes(), dout.options()) : at::Tensor();
  at::Tensor dbias = new_output({2 * g.c_out}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "conv_glu_winograd_grads", [&] {
    winograd_inputs<M, scalar_t>(x.data_ptr<scalar_t>(), pad, g, nt, V.data_ptr<scalar_t>());  // recomputed
    winograd_glu_output_grads<M, scalar_t>(dout.data_ptr<scalar_t>(), pre.data_ptr<scalar_t>(), scale, g, nt,
                                           dMt.data_ptr<scalar_t>(),
                                           need_residual_grad ? dres.data_ptr<scalar_t>() : nullptr,
                                           dbias.data_ptr<scalar_t>());
  });
  const at::Tensor dU = at::bmm(V.transpose(1, 2), dMt);
  at::Tensor dweight = new_output(weight.sizes(), weight.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "conv_glu_winograd_weight_grads", [&] {
    winograd_weight_grads<M, scalar_t>(dU.data_ptr<scalar_t>(), weight.size(1) * weight.size(2),
                                       dweight.data_ptr<scalar_t>());
  });
  const at::Tensor dV = at::bmm(dMt, U.transpose(1, 2));
  at::Tensor dx = new_output(x.sizes(), x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "conv_glu_winograd_input_grads", [&] {
    winograd_input_grads<M, scalar_t>(dV.data_ptr<scalar_t>(), pad, g, nt, dx.data_ptr<scalar_t>());
  });
  return {dx, dweight, dbias, dres};
}

void check_winograd(int64_t winograd, const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK(winograd == 0 || winograd == 2 || winograd == 4, "winograd must be 0, 2 or 4, got ", winograd);
  TORCH_CHECK(winograd == 0 || (weight.size(0) == 3 && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble)),
              "winograd needs a width-3 convolution in float32 or float64");
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
                                         const c10::optional<at::Tensor>& packed, int64_t winograd) {
  check_inputs(x, weight, pad_mask);
  check_winograd(winograd, x, weight);
  const ConvGeometry g = geometry(x, weight, causal);
  if (residual.has_value()) {
    TORCH_CHECK(residual->is_contiguous() && residual->scalar_type() == x.scalar_type(),
                "residual must be contiguous with x's dtype");
  }
  const int64_t rows = g.B * g.T;
  const bool* pad = pad_mask.has_value() ? pad_mask->data_ptr<bool>() : nullptr;
  if (winograd != 0) {
    auto pre_out = winograd == 2 ? winograd_forward<2>(x, weight, bias, residual, scale, pad, g)
                                 : winograd_forward<4>(x, weight, bias, residual, scale, pad, g);
    return {pre_out[1], pre_out[0]};
  }
  at::Tensor cols = new_output({rows, g.k * g.c_in}, x.options());
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
                                          bool causal, double scale, bool need_residual_grad, int64_t winograd) {
  check_inputs(x, weight, pad_mask);
  check_winograd(winograd, x, weight);
  const ConvGeometry g = geometry(x, weight, causal);
  const int64_t rows = g.B * g.T;
  TORCH_CHECK(dout.is_contiguous() && pre.is_contiguous(), "dout and pre must be contiguous");
  const bool* pad = pad_mask.has_value() ? pad_mask->data_ptr<bool>() : nullptr;
  if (winograd != 0)
    return winograd == 2 ? winograd_backward<2>(dout, pre, scale, need_residual_grad, x, weight, pad, g)
                         : winograd_backward<4>(dout, pre, scale, need_residual_grad, x, weight, pad, g);
  at::Tensor dpre = new_output({rows, 2 * g.c_out}, x.options());
  at::Tensor dres = need_residual_grad ? new_output(dout.sizes(), dout.options()) : at::Tensor();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "conv_glu_backward_glu", [&] {
    glu_backward<scalar_t>(dout.data_ptr<scalar_t>(), pre.data_ptr<scalar_t>(), scale, rows, g.c_out,
                           dpre.data_ptr<scalar_t>(), need_residual_grad ? dres.data_ptr<scalar_t>() : nullptr);
  });
  // bias gradient summed in float32 for reduced-precision inputs
  at::Tensor dbias = dpre.sum(0, /*keepdim=*/false, at::toOpMathType(x.scalar_type())).to(x.scalar_type());
  at::Tensor cols = new_output({rows, g.k * g.c_in}, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "conv_glu_im2col", [&] {
    im2col<scalar_t>(x.data_ptr<scalar_t>(), pad, g, cols.data_ptr<scalar_t>());  // recomputed, not saved
  });
  const at::Tensor w2 = weight.view({g.k * g.c_in, 2 * g.c_out});
  at::Tensor dweight = at::mm(cols.t(), dpre).view_as(weight);
  at::Tensor dcols = at::mm(dpre, w2.t());
  at::Tensor dx = new_output(x.sizes(), x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "conv_glu_col2im", [&] {
    col2im<scalar_t>(dcols.data_ptr<scalar_t>(), pad, g, dx.data_ptr<scalar_t>());
  });
  return {dx, dweight, dbias, dres};
}

}  // namespace convs2s
