// Every layer of one decoding step in a single call (the decoder with folded attention).
//
// At one sentence per batch a step is ~15 layers x (conv step, residual projection, attention,
// residual sum): about a hundred small operations whose Python dispatch costs as much as the
// arithmetic. This runs the same operations, through the same kernels (few-row products, the
// conv step, ATen's batched products and softmax), from C++, so the outputs equal the Python
// loop's up to nothing but the order of identical operations; except the float32 folded attention,
// which runs through the few-row kernels and a softmax loop of its own (equal within float rounding).

#include <ATen/ops/baddbmm.h>
#include <ATen/ops/bmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/glu.h>
#include <ATen/ops/softmax.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common.h"
#include "kernels.h"
#include "small_gemm.h"

namespace convs2s {

namespace {

constexpr double kSqrtHalf = 0.70710678118654752440;

// x @ w.T + b for an nn.Linear-layout weight (N, K), or int8 rows with their scale (x quantised
// per row too to x_bits, 8 or 7, where x_bits > 0; float x at 0; w_bits: the int8 weight's range,
// 8 or 7 bits (linear_w8a8's weight_bits); packed: the int8 weight in
// pack_w8a8_weight's layout, or for a float weight w.T in pack_kn_weight's, or none).
at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& scale,
                  const c10::optional<at::Tensor>& bias, int64_t x_bits, int64_t w_bits,
                  const c10::optional<at::Tensor>& packed) {
  if (scale.has_value())
    return x_bits > 0 ? linear_w8a8(x, w, *scale, bias, packed, x_bits, w_bits) : small_gemm_int8(x, w, *scale, bias);
  if (packed.has_value()) return measured_packed_product(x, w.t(), *packed, bias);  // pack_kn_weight(w.t())
  return measured_product(x, w, bias, /*w_is_nk=*/true);
}

// One conv step + GLU: the fused op for float weights (k, C_in, 2C); for int8 rows (2C, k*C_in)
// the same gather / shift / append, then the int8 product and GLU.
std::pair<at::Tensor, at::Tensor> conv_step(const at::Tensor& x, const at::Tensor& state, const at::Tensor& w,
                                            const c10::optional<at::Tensor>& scale,
                                            const c10::optional<at::Tensor>& bias,
                                            const c10::optional<at::Tensor>& parents, int64_t x_bits,
                                            int64_t w_bits, const c10::optional<at::Tensor>& packed) {
  if (!scale.has_value()) {  // packed: the float weight in pack_kn_weight's layout, or none
    auto out = conv_step_forward(x, state, w, bias, parents, packed);
    return {out[0], out[1]};
  }
  const at::Tensor window = conv_window(x, state, parents);
  const at::Tensor pre = linear(window.view({window.size(0), -1}), w, scale, bias, x_bits, w_bits, packed);
  // float32 rows: the conv kernels' GLU pass (one loop, no dispatch) instead of ATen's; bf16 keeps
  // ATen's, whose rounding the Python loop shares (the one-call step equals it exactly there)
  return {pre.scalar_type() == at::kFloat ? glu_rows(pre) : at::glu(pre, -1), window.slice(1, 1)};
}

// One layer's folded attention for float32 activations (convs2s.decoder.FoldedAttention.step),
// sentence by sentence through the few-row kernels and one loop for the masked softmax, instead of
// a dozen ATen calls (each ~10 us of dispatch and allocation around a few microseconds of work):
//   p = softmax_s(((emb + z_bias) + h . z_in) sqrt(1/2), masked), out = ((p sqrt(len)) y_out + b_out + h) sqrt(1/2).
// With a residual (N, C), the layer's residual sum too: out = (out + residual) sqrt(1/2), in the same
// loop and the same roundings as the separate sum (this file is built for baseline x86-64: no FMA
// contraction). Returns out (N, C) and, when need_attn, p (N, S).
std::pair<at::Tensor, at::Tensor> folded_attention_f32(const at::Tensor& x, const at::Tensor& emb_scores,
                                                       const at::Tensor& z_in, const at::Tensor& z_bias,
                                                       const at::Tensor& y_out, const at::Tensor& b_out,
                                                       const at::Tensor& pad_mask, const at::Tensor& src_scale,
                                                       bool need_attn, const at::Tensor& residual) {
  const int64_t N = x.size(0), C = x.size(1), B = emb_scores.size(0), beam = emb_scores.size(1),
                S = emb_scores.size(2);
  // the pointers below are read as these shapes, on the CPU
  for (const at::Tensor* t : {&z_in, &y_out})
    TORCH_CHECK(t->device().is_cpu() && t->dim() == 3 && t->size(0) == B && t->size(1) == S && t->size(2) == C,
                "decoder_layers_step: z_in and y_out must be CPU (B, S, C) = (", B, ", ", S, ", ", C, ")");
  TORCH_CHECK(z_bias.device().is_cpu() && z_bias.dim() == 2 && z_bias.size(0) == B && z_bias.size(1) == S,
              "decoder_layers_step: z_bias must be CPU (B, S)");
  TORCH_CHECK(b_out.device().is_cpu() && b_out.dim() == 1 && b_out.size(0) == C,
              "decoder_layers_step: b_out must be CPU (C,)");
  TORCH_CHECK(pad_mask.device().is_cpu() && pad_mask.dim() == 2 && pad_mask.size(0) == B && pad_mask.size(1) == S &&
                  src_scale.numel() == B,
              "decoder_layers_step: pad_mask must be (B, S) and src_scale (B,)");
  TORCH_CHECK(!residual.defined() || (residual.device().is_cpu() && residual.scalar_type() == at::kFloat &&
                                      residual.dim() == 2 && residual.size(0) == N && residual.size(1) == C),
              "decoder_layers_step: a layer's residual must be CPU float32 (N, C) = (", N, ", ", C, ")");
  const at::Tensor rc = residual.defined() ? residual.contiguous() : residual;
  const float* rp = rc.defined() ? rc.data_ptr<float>() : nullptr;
  const at::Tensor xc = x.contiguous(), ec = emb_scores.contiguous(), zc = z_in.contiguous(),
                   zb = z_bias.contiguous(), yc = y_out.contiguous(), bc = b_out.contiguous(),
                   pm = pad_mask.contiguous(), ls = src_scale.contiguous();
  at::Tensor out = at::empty({N, C}, x.options());
  at::Tensor attn = need_attn ? at::empty({N, S}, x.options()) : at::Tensor();
  const float *xp = xc.data_ptr<float>(), *ep = ec.data_ptr<float>(), *zp = zc.data_ptr<float>(),
              *zbp = zb.data_ptr<float>(), *yp = yc.data_ptr<float>(), *bp = bc.data_ptr<float>(),
              *lp = ls.data_ptr<float>();
  const bool* mp = pm.data_ptr<bool>();
  float* op = out.data_ptr<float>();
  float* ap = need_attn ? attn.data_ptr<float>() : nullptr;
  const float half = static_cast<float>(kSqrtHalf);
  at::parallel_for(0, B, 1, [&](int64_t b0, int64_t b1) {
    std::vector<float> p(beam * S);
    for (int64_t b = b0; b < b1; ++b) {
      const float* h = xp + b * beam * C;
      small_gemm_nk<float>(beam, h, C, zp + b * S * C, S, C, nullptr, p.data(), S);
      for (int64_t r = 0; r < beam; ++r) {
        float* row = p.data() + r * S;
        const float* e = ep + (b * beam + r) * S;
        float top = -std::numeric_limits<float>::infinity();
        for (int64_t s = 0; s < S; ++s) {
          float v = ((e[s] + zbp[b * S + s]) + row[s]) * half;
          if (mp[b * S + s]) v = -std::numeric_limits<float>::infinity();
          row[s] = v;
          top = std::max(top, v);
        }
        float sum = 0.f;
        for (int64_t s = 0; s < S; ++s) sum += (row[s] = std::exp(row[s] - top));
        for (int64_t s = 0; s < S; ++s) row[s] /= sum;
        if (ap) std::memcpy(ap + (b * beam + r) * S, row, S * sizeof(float));
        for (int64_t s = 0; s < S; ++s) row[s] *= lp[b];
      }
      float* o = op + b * beam * C;
      small_gemm_kn<float>(beam, p.data(), S, yp + b * S * C, S, C, bp, o, C);
      if (rp) {
        const float* r = rp + b * beam * C;
        for (int64_t i = 0; i < beam * C; ++i) o[i] = ((o[i] + h[i]) * half + r[i]) * half;
      } else {
        for (int64_t i = 0; i < beam * C; ++i) o[i] = (o[i] + h[i]) * half;
      }
    }
  });
  return {out, attn};
}

}  // namespace

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
    const std::vector<int64_t>& weight_bits) {
  const size_t L = conv_w.size();
  TORCH_CHECK(states.size() == L && activation_bits.size() == L && weight_bits.size() == L && conv_packed.size() == L && proj_packed.size() == L && conv_scale.size() == L && conv_b.size() == L && residual.size() == L &&
                  proj_w.size() == L && proj_scale.size() == L && proj_b.size() == L && z_in.size() == L &&
                  z_bias.size() == L && y_out.size() == L && b_out.size() == L,
              "decoder_layers_step: every per-layer list needs one entry per layer (", L, ")");
  CONVS2S_CHECK_CPU(x);
  TORCH_CHECK(x.dim() == 2, "decoder_layers_step: x must be (N, C)");
  const int64_t N = x.size(0), B = emb_scores.size(0), beam = emb_scores.size(1);
  TORCH_CHECK(B * beam == N, "decoder_layers_step: emb_scores is (B, beam, S) with B * beam = N rows");
  const at::Tensor mask = pad_mask.unsqueeze(1);
  const at::Tensor length_scale = src_scale.to(x.scalar_type()).view({-1, 1, 1});
  const auto acc_type = c10::promoteTypes(x.scalar_type(), at::kFloat);

  std::vector<at::Tensor> residuals{x};
  std::vector<at::Tensor> new_states;
  new_states.reserve(L);
  at::Tensor attn_sum;
  for (size_t i = 0; i < L; ++i) {
    at::Tensor res;
    if (residual[i] > 0) {
      TORCH_CHECK(residual[i] <= static_cast<int64_t>(residuals.size()), "layer ", i, ": residual reaches too far");
      res = residuals[residuals.size() - residual[i]];
      if (proj_w[i].has_value())
        res = linear(res, *proj_w[i], proj_scale[i], proj_b[i], activation_bits[i], weight_bits[i], proj_packed[i]);
    }
    auto stepped = conv_step(x, states[i], conv_w[i], conv_scale[i], conv_b[i], parents, activation_bits[i],
                             weight_bits[i], conv_packed[i]);
    x = stepped.first;
    new_states.push_back(stepped.second);
    const bool fast_attention = x.scalar_type() == at::kFloat && beam >= 1 && beam <= kSmallGemmMaxRows &&
                                emb_scores.size(2) >= 1 && z_in[i].has_value() &&
                                z_in[i]->scalar_type() == at::kFloat && y_out[i]->scalar_type() == at::kFloat &&
                                z_bias[i]->scalar_type() == at::kFloat && b_out[i]->scalar_type() == at::kFloat &&
                                emb_scores.scalar_type() == at::kFloat && pad_mask.scalar_type() == at::kBool;
    if (fast_attention) {
      auto att = folded_attention_f32(x, emb_scores, *z_in[i], *z_bias[i], *y_out[i], *b_out[i], pad_mask,
                                      length_scale.view({-1}), need_attn, res);
      x = att.first;
      res = at::Tensor();  // summed by the attention's loop
      if (need_attn) {
        const at::Tensor a = att.second.div(static_cast<double>(L));
        attn_sum = attn_sum.defined() ? attn_sum.add(a) : a;
      }
    } else if (z_in[i].has_value()) {  // folded attention (convs2s.decoder.FoldedAttention.step)
      const at::Tensor h = x.view({B, beam, -1});
      at::Tensor scores = at::baddbmm(emb_scores.add(z_bias[i]->unsqueeze(1)), h, z_in[i]->transpose(1, 2)).mul(kSqrtHalf);
      scores = scores.to(acc_type).masked_fill(mask, -std::numeric_limits<double>::infinity());
      const at::Tensor attn = at::softmax(scores, -1).to(h.scalar_type());
      const at::Tensor out = at::bmm(attn.mul(length_scale), *y_out[i]).add(*b_out[i]).add(h).mul(kSqrtHalf);
      x = out.reshape({N, -1});
      if (need_attn) {
        const at::Tensor a = attn.reshape({N, -1}).div(static_cast<double>(L));
        attn_sum = attn_sum.defined() ? attn_sum.add(a) : a;
      }
    }
    if (res.defined()) x = x.add(res).mul(kSqrtHalf);
    residuals.push_back(x);
  }
  std::vector<at::Tensor> result{x, attn_sum.defined() ? attn_sum : at::Tensor()};
  result.insert(result.end(), new_states.begin(), new_states.end());
  return result;
}

}  // namespace convs2s
