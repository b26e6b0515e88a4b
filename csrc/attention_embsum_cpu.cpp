// ConvS2S attention with the embedding sum on the CPU, forward and backward:
//   p = softmax(q z^T) over the valid source steps,  c = sqrt(s) * p y.
//
// The two products are batched GEMMs through ATen (MKL / oneDNN). The masked softmax runs in
// (at least) float32 in one pass per (b, t) row and writes the probabilities already multiplied by sqrt(s)
// (the paper's m * sqrt(1/m)), so the context needs no extra pass; backward fuses the scale and
// the softmax derivative into one pass the same way.

#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/Dispatch.h>
#include <ATen/ops/bmm.h>
#include <algorithm>
#include <cmath>
#include <limits>

#include "common.h"
#include "kernels.h"

namespace convs2s {

namespace {

// fn(r, lo, hi) for every (b, t) row r of B x T, in parallel: [lo, hi) its sentence's valid source steps.
template <typename F>
void for_each_row(const int64_t* lengths, int64_t B, int64_t T, int64_t S, bool left_pad, const F& fn) {
  at::parallel_for(0, B * T, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t len = lengths ? lengths[r / T] : S;
      fn(r, left_pad ? S - len : 0, left_pad ? S : len);
    }
  });
}

template <typename scalar_t>
void masked_softmax_scaled(const scalar_t* scores, const int64_t* lengths, int64_t B, int64_t T, int64_t S,
                           bool left_pad, scalar_t* p_scaled) {
  using acc_t = at::opmath_type<scalar_t>;  // float32 for reduced precision, double for double
  for_each_row(lengths, B, T, S, left_pad, [&](int64_t r, int64_t lo, int64_t hi) {
    const scalar_t* row = scores + r * S;
    scalar_t* out = p_scaled + r * S;
    acc_t mx = -std::numeric_limits<acc_t>::infinity();
    for (int64_t s = lo; s < hi; ++s) mx = std::max(mx, static_cast<acc_t>(row[s]));
    acc_t sum = 0;
    for (int64_t s = lo; s < hi; ++s) sum += std::exp(static_cast<acc_t>(row[s]) - mx);
    const acc_t factor = std::sqrt(static_cast<acc_t>(hi - lo)) / sum;
    for (int64_t s = 0; s < S; ++s) {
      out[s] = (s < lo || s >= hi) ? scalar_t(0)
                                   : static_cast<scalar_t>(std::exp(static_cast<acc_t>(row[s]) - mx) * factor);
    }
  });
}

// Softmax derivative through the scale: with p = p_scaled / sqrt(n) and dp = dp_scaled * sqrt(n)
// (n valid steps), dscores = p * (dp - sum_s p dp), and sum_s p dp = sum_s p_scaled dp_scaled.
template <typename scalar_t>
void softmax_scaled_backward(const scalar_t* p_scaled, const scalar_t* dp_scaled, const int64_t* lengths, int64_t B,
                             int64_t T, int64_t S, bool left_pad, scalar_t* dscores) {
  using acc_t = at::opmath_type<scalar_t>;  // float32 for reduced precision, double for double
  for_each_row(lengths, B, T, S, left_pad, [&](int64_t r, int64_t lo, int64_t hi) {
    const acc_t n = static_cast<acc_t>(hi - lo);
    const scalar_t* ps = p_scaled + r * S;
    const scalar_t* dps = dp_scaled + r * S;
    scalar_t* out = dscores + r * S;
    acc_t dot = 0;
    for (int64_t s = lo; s < hi; ++s) dot += static_cast<acc_t>(ps[s]) * static_cast<acc_t>(dps[s]);
    const acc_t root = std::sqrt(n);
    for (int64_t s = 0; s < S; ++s) {
      if (s < lo || s >= hi) {
        out[s] = scalar_t(0);
      } else {
        const acc_t p = static_cast<acc_t>(ps[s]) / root;
        out[s] = static_cast<scalar_t>(p * (static_cast<acc_t>(dps[s]) * root - dot));
      }
    }
  });
}

const int64_t* lengths_ptr(const c10::optional<at::Tensor>& src_lengths, at::Tensor& holder, int64_t B, int64_t S) {
  if (!src_lengths.has_value()) return nullptr;
  holder = src_lengths->to(at::kLong).contiguous();
  TORCH_CHECK(holder.dim() == 1 && holder.size(0) == B, "src_lengths must be (B,)");
  TORCH_CHECK(holder.min().item<int64_t>() >= 1 && holder.max().item<int64_t>() <= S,
              "src_lengths must lie in [1, S]");
  return holder.data_ptr<int64_t>();
}

}  // namespace

// Returns (context (B, T, E), p_scaled (B, T, S)): p_scaled = sqrt(s) * softmax, kept for backward.
std::vector<at::Tensor> attention_forward(const at::Tensor& q, const at::Tensor& z, const at::Tensor& y,
                                          const c10::optional<at::Tensor>& src_lengths, bool left_pad) {
  CONVS2S_CHECK_CPU(q);
  CONVS2S_CHECK_DIM(q, 3);
  CONVS2S_CHECK_DIM(z, 3);
  CONVS2S_CHECK_DIM(y, 3);
  const int64_t B = q.size(0), T = q.size(1), S = z.size(1);
  TORCH_CHECK(z.size(0) == B && y.sizes() == z.sizes() && z.size(2) == q.size(2), "q (B,T,E), z and y (B,S,E)");
  at::Tensor holder;
  const int64_t* lengths = lengths_ptr(src_lengths, holder, B, S);
  const at::Tensor scores = at::bmm(q, z.transpose(1, 2)).contiguous();
  at::Tensor p_scaled = new_output({B, T, S}, q.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "attention_softmax", [&] {
    masked_softmax_scaled<scalar_t>(scores.data_ptr<scalar_t>(), lengths, B, T, S, left_pad,
                                    p_scaled.data_ptr<scalar_t>());
  });
  return {at::bmm(p_scaled, y), p_scaled};
}

// Returns (dq, dz, dy).
std::vector<at::Tensor> attention_backward(const at::Tensor& dctx, const at::Tensor& q, const at::Tensor& z,
                                           const at::Tensor& y, const at::Tensor& p_scaled,
                                           const c10::optional<at::Tensor>& src_lengths, bool left_pad,
                                           const c10::optional<at::Tensor>& dp_extra) {
  const int64_t B = q.size(0), T = q.size(1), S = z.size(1);
  at::Tensor holder;
  const int64_t* lengths = lengths_ptr(src_lengths, holder, B, S);
  at::Tensor dp_scaled = at::bmm(dctx, y.transpose(1, 2));
  if (dp_extra.has_value() && dp_extra->defined()) {
    TORCH_CHECK(dp_extra->sizes() == dp_scaled.sizes(), "dp_extra must have shape (B, T, S)");
    dp_scaled.add_(*dp_extra);  // the probabilities' own gradient (alignment losses)
  }
  dp_scaled = dp_scaled.contiguous();
  at::Tensor dy = at::bmm(p_scaled.transpose(1, 2), dctx);
  at::Tensor dscores = new_output({B, T, S}, q.options());
  TORCH_CHECK(p_scaled.is_contiguous(), "p_scaled must be contiguous");
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "attention_softmax_backward", [&] {
    softmax_scaled_backward<scalar_t>(p_scaled.data_ptr<scalar_t>(), dp_scaled.data_ptr<scalar_t>(), lengths, B, T,
                                      S, left_pad, dscores.data_ptr<scalar_t>());
  });
  return {at::bmm(dscores, z), at::bmm(dscores.transpose(1, 2), q), dy};
}

}  // namespace convs2s
