// The decoder's output projection and the label-smoothed cross-entropy on the CPU, forward and
// gradients in one call, a block of rows at a time.
//
// For each block the logits are made transposed, (V, rows) = weight @ x_block^T (ATen's GEMM runs
// this orientation faster than x @ weight^T: bench/results/amd-zen3-2c/training-ops.md),
// reduced to the rows' log-sum-exp, target logit and logit sum while the block is in cache, turned
// in place into d loss / d logits = softmax - eps_i - (1 - eps - eps_i) at the target (0 on ignored
// rows), and multiplied at once into the input's and the weight's gradients. The whole (N, V)
// logits never exist, nor their log-softmax or its gradient. In float32 the block's reductions and
// its gradient are three passes of the kernels below (vectorised per instruction set: a max and
// sum, a sum of exponentials, the gradient with the bias gradient's row sums) instead of ATen's
// ten-odd passes of logsumexp, sums, exp and the in-place arithmetic. In bfloat16 (bf16 autocast)
// the three products run in bf16 as autocast's F.linear would; the same fused passes read the bf16
// block as float32 lanes (the bias added in float32), write its gradient back in bf16, rounded once,
// and dw and db are summed over the blocks in float32.

#include <ATen/ops/addmm.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/full.h>
#include <ATen/ops/logsumexp.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>

#include <c10/util/BFloat16.h>

#include <cmath>
#include <cstring>
#include <type_traits>

#include "common.h"
#include "isa.h"
#include "kernels.h"
#include "library_gemm.h"
#include "vec.h"
#include "vec_exp.h"

namespace convs2s {

namespace {


// Over the vocabulary rows [v0, v1) of a (V, cols) block L, with bias[v] added to row v on the fly
// (null: none): mx[j] = max(mx[j], L[v, j]) and sm[j] += L[v, j] (with sumexp: se[j] += exp(L[v, j] -
// mx[j]) instead).
template <typename V, bool kSumExp, typename T>
CONVS2S_INLINE void column_pass(const T* L, const float* bias, int64_t v0, int64_t v1, int64_t cols, float* mx,
                                float* sm) {
  constexpr int W = Vec<V>::lanes;
  for (int64_t v = v0; v < v1; ++v) {
    const T* row = L + v * cols;
    const float bv = bias ? bias[v] : 0.f;
    int64_t j = 0;
    for (; j + W <= cols; j += W) {
      const V x = load_f32_lanes<V>(row + j) + bv, m = load_v<V>(mx + j);
      V a = load_v<V>(sm + j);
      if constexpr (kSumExp) {
        a += exp_v<V>(x - m);
      } else {
        const V mm = x > m ? x : m;
        std::memcpy(mx + j, &mm, sizeof(mm));
        a += x;
      }
      std::memcpy(sm + j, &a, sizeof(a));
    }
    for (; j < cols; ++j) {
      const float x = load_f32(row + j) + bv;
      if constexpr (kSumExp) {
        sm[j] += std::exp(x - mx[j]);
      } else {
        mx[j] = x > mx[j] ? x : mx[j];
        sm[j] += x;
      }
    }
  }
}

CONVS2S_INLINE void store_block(float* p, float g) { *p = g; }
CONVS2S_INLINE void store_block(uint16_t* p, float g) { *p = c10::BFloat16(g).x; }

// L[v, j] = (exp(L[v, j] + bias[v] - lse[j]) - eps_i) * keep[j] - (1 - eps - eps_i) where tgt[j] = v, over
// rows [v0, v1) (null bias: none; tgt -1 on ignored columns); db[v] += the row's sum. A bf16 block
// gets each gradient rounded once, after its target's term.
template <typename V, typename T>
CONVS2S_INLINE void gradient_rows(T* L, const float* bias, int64_t v0, int64_t v1, int64_t cols, const float* lse,
                                  const float* keep, const int32_t* tgt, float eps_i, float at_target, float* db) {
  using I = typename Vec<V>::i32;
  constexpr int W = Vec<V>::lanes;
  int32_t at_bits;
  std::memcpy(&at_bits, &at_target, sizeof(at_bits));
  for (int64_t v = v0; v < v1; ++v) {
    T* row = L + v * cols;
    const float bv = bias ? bias[v] : 0.f;
    V acc{};
    int64_t j = 0;
    for (; j + W <= cols; j += W) {
      V g = (exp_v<V>(load_f32_lanes<V>(row + j) + bv - load_v<V>(lse + j)) - eps_i) * load_v<V>(keep + j);
      I t;
      std::memcpy(&t, tgt + j, sizeof(t));
      const I sub = (t == static_cast<int32_t>(v)) & at_bits;
      V s;
      std::memcpy(&s, &sub, sizeof(s));
      g -= s;
      if constexpr (std::is_same_v<T, float>) {
        std::memcpy(row + j, &g, sizeof(g));
      } else {
        const auto h = __builtin_convertvector(round_bf16_bits_v<V>(g), typename Vec<V>::u16);
        std::memcpy(row + j, &h, sizeof(h));
      }
      acc += g;
    }
    float total = 0.f;
    for (int i = 0; i < W; ++i) total += acc[i];
    for (; j < cols; ++j) {
      float g = (std::exp(load_f32(row + j) + bv - lse[j]) - eps_i) * keep[j];
      if (tgt[j] == v) g -= at_target;
      store_block(row + j, g);
      total += g;
    }
    db[v] += total;
  }
}

#define CONVS2S_OUTPUT_LOSS_ISA_T(suffix, target, V, T)                                                              \
  target void max_sum_##suffix(const T* L, const float* bias, int64_t v0, int64_t v1, int64_t cols, float* mx,     \
                               float* sm) {                                                                        \
    column_pass<V, false>(L, bias, v0, v1, cols, mx, sm);                                                          \
  }                                                                                                                \
  target void sum_exp_##suffix(const T* L, const float* bias, int64_t v0, int64_t v1, int64_t cols, float* mx,     \
                               float* se) {                                                                        \
    column_pass<V, true>(L, bias, v0, v1, cols, mx, se);                                                           \
  }                                                                                                                \
  target void gradient_##suffix(T* L, const float* bias, int64_t v0, int64_t v1, int64_t cols, const float* lse,   \
                                const float* keep, const int32_t* tgt, float eps_i, float at_target, float* db) {  \
    gradient_rows<V>(L, bias, v0, v1, cols, lse, keep, tgt, eps_i, at_target, db);                                 \
  }
#define CONVS2S_OUTPUT_LOSS_ISA(suffix, target, V)          \
  CONVS2S_OUTPUT_LOSS_ISA_T(suffix, target, V, float)       \
  CONVS2S_OUTPUT_LOSS_ISA_T(bf16_##suffix, target, V, uint16_t)

#if defined(__x86_64__)
CONVS2S_OUTPUT_LOSS_ISA(avx512, __attribute__((target("avx512f"))), v16)
CONVS2S_OUTPUT_LOSS_ISA(avx2, __attribute__((target("avx2,fma"))), v8)
#endif
CONVS2S_OUTPUT_LOSS_ISA(base, , v4)

template <typename T>
struct BlockKernels {
  void (*max_sum)(const T*, const float*, int64_t, int64_t, int64_t, float*, float*);
  void (*sum_exp)(const T*, const float*, int64_t, int64_t, int64_t, float*, float*);
  void (*gradient)(T*, const float*, int64_t, int64_t, int64_t, const float*, const float*, const int32_t*, float, float,
                   float*);
};

template <typename T>
const BlockKernels<T>& block_kernels();

template <>
const BlockKernels<float>& block_kernels<float>() {
  static const BlockKernels<float> k = [] {
#if defined(__x86_64__)
    if (kernel_isa() == Isa::avx512) return BlockKernels<float>{max_sum_avx512, sum_exp_avx512, gradient_avx512};
    if (kernel_isa() == Isa::avx2) return BlockKernels<float>{max_sum_avx2, sum_exp_avx2, gradient_avx2};
#endif
    return BlockKernels<float>{max_sum_base, sum_exp_base, gradient_base};
  }();
  return k;
}

template <>
const BlockKernels<uint16_t>& block_kernels<uint16_t>() {
  static const BlockKernels<uint16_t> k = [] {
#if defined(__x86_64__)
    if (kernel_isa() == Isa::avx512)
      return BlockKernels<uint16_t>{max_sum_bf16_avx512, sum_exp_bf16_avx512, gradient_bf16_avx512};
    if (kernel_isa() == Isa::avx2) return BlockKernels<uint16_t>{max_sum_bf16_avx2, sum_exp_bf16_avx2, gradient_bf16_avx2};
#endif
    return BlockKernels<uint16_t>{max_sum_bf16_base, sum_exp_bf16_base, gradient_bf16_base};
  }();
  return k;
}

// The column statistics of one pass over the vocabulary: `shares` contiguous runs of rows, one a
// task, each with its own (cols) partial arrays, combined after (max-ed and summed). A run's sums
// come in blocks of kSumRows rows, each block summed afresh then added: two levels, so the
// rounding grows with kSumRows + rows / kSumRows terms, not with the vocabulary's size.
constexpr int64_t kSumRows = 128;

template <typename Pass>
void column_stats(int64_t v, int64_t cols, float* mx, float* acc, bool combine_max, const Pass& pass) {
  const int64_t shares = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), v / 256));
  const int64_t run = (v + shares - 1) / shares;
  std::vector<float> part_mx(shares * cols, -std::numeric_limits<float>::infinity()), part_acc(shares * cols, 0.f);
  at::parallel_for(0, shares, 1, [&](int64_t first, int64_t last) {
    std::vector<float> block(cols);
    for (int64_t id = first; id < last; ++id) {
      float* pm = part_mx.data() + id * cols;
      float* pa = part_acc.data() + id * cols;
      if (!combine_max) std::copy(mx, mx + cols, pm);
      for (int64_t b = id * run, end = std::min(v, (id + 1) * run); b < end; b += kSumRows) {
        std::fill(block.begin(), block.end(), 0.f);
        pass(b, std::min(end, b + kSumRows), pm, block.data());
        for (int64_t j = 0; j < cols; ++j) pa[j] += block[j];
      }
    }
  });
  for (int64_t j = 0; j < cols; ++j) {
    float m = part_mx[j], a = part_acc[j];
    for (int64_t id = 1; id < shares; ++id) {
      m = std::max(m, part_mx[id * cols + j]);
      a += part_acc[id * cols + j];
    }
    if (combine_max) mx[j] = m;
    acc[j] = a;
  }
}

// One block's loss terms and, with grads, its gradient in place and db's share (float32 sums; the
// block float32 or bf16 bits). The block holds W @ x^T; bias[v] (null: none) is added to its row v as
// each pass reads it, never written: ATen's addmm would first copy the bias over the whole block.
template <typename T>
void block_loss(T* L, int64_t v, int64_t cols, const float* bias, const at::Tensor& tb, int64_t ignore_index,
                double eps, double eps_i, at::Tensor& loss, at::Tensor& nll, float* db) {
  const BlockKernels<T>& k = block_kernels<T>();
  const int64_t* t = tb.data_ptr<int64_t>();
  std::vector<float> mx(cols, -std::numeric_limits<float>::infinity()), sm(cols), se(cols), lse(cols), keep(cols);
  std::vector<int32_t> tgt(cols);
  column_stats(v, cols, mx.data(), sm.data(), true,
               [&](int64_t b, int64_t e, float* pm, float* pa) { k.max_sum(L, bias, b, e, cols, pm, pa); });
  column_stats(v, cols, mx.data(), se.data(), false,
               [&](int64_t b, int64_t e, float* pm, float* pa) { k.sum_exp(L, bias, b, e, cols, pm, pa); });
  double nll_sum = 0, loss_sum = 0;
  for (int64_t j = 0; j < cols; ++j) {
    lse[j] = mx[j] + std::log(se[j]);
    keep[j] = t[j] != ignore_index ? 1.f : 0.f;
    tgt[j] = t[j] != ignore_index ? static_cast<int32_t>(t[j]) : -1;
    if (t[j] == ignore_index) continue;
    TORCH_CHECK(t[j] >= 0 && t[j] < v, "output_loss: target ", t[j], " outside the vocabulary of ", v);
    const double row_nll = double(lse[j]) - double(load_f32(L + t[j] * cols + j) + (bias ? bias[t[j]] : 0.f));
    nll_sum += row_nll;
    loss_sum += row_nll * (1.0 - eps - eps_i) + eps_i * (double(lse[j]) * double(v) - double(sm[j]));
  }
  nll.add_(nll_sum);
  loss.add_(eps > 0 ? loss_sum : nll_sum);
  if (db == nullptr) return;
  const float at_target = float(1.0 - eps - eps_i);
  at::parallel_for(0, v, 64, [&](int64_t b, int64_t e) {
    k.gradient(L, bias, b, e, cols, lse.data(), keep.data(), tgt.data(), float(eps_i), at_target, db);
  });
}

}  // namespace

std::vector<at::Tensor> output_loss_forward(const at::Tensor& x, const at::Tensor& weight,
                                            const c10::optional<at::Tensor>& bias, const at::Tensor& target, double eps,
                                            int64_t ignore_index, bool grads, int64_t block_rows, int64_t library) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1), "output_loss: x (N, C), weight (V, C)");
  TORCH_CHECK(target.dim() == 1 && target.size(0) == x.size(0), "output_loss: target (N,)");
  TORCH_CHECK(block_rows > 0, "output_loss: block_rows > 0");
  TORCH_CHECK(library == 0 || library == 1, "output_loss: library 0 (ATen) or 1 (oneDNN), got ", library);
  const at::Tensor xc = x.contiguous(), w = weight.contiguous(), t = target.to(at::kLong).contiguous();
  TORCH_CHECK(w.scalar_type() == xc.scalar_type(), "output_loss: x and weight of one dtype");
  const int64_t n = xc.size(0), v = w.size(0);
  const double eps_i = eps > 0 ? eps / double(v - 1) : 0.0;
  const bool bf16 = xc.scalar_type() == at::kBFloat16;
  const auto f64 = xc.options().dtype(at::kDouble), sums = bf16 ? xc.options().dtype(at::kFloat) : xc.options();
  at::Tensor loss = at::zeros({}, f64), nll = at::zeros({}, f64);
  at::Tensor dx, dw, db;
  const bool f32 = xc.scalar_type() == at::kFloat;
  // oneDNN's inner product for the logits (W @ x_block^T) and dw (gradient @ x_block): on AMD CPUs
  // MKL's AVX2 code ran them slower (bench/results/amd-epyc-2c/README.md, output_loss's products)
  const bool onednn = f32 && library == 1;
  TORCH_CHECK(!onednn || onednn_gemm_available(), "output_loss: this torch build has no oneDNN inner product");
  if (grads) {
    dx = at::empty_like(xc);
    // float32's first block writes dw outright (no zeroing pass, no zeros read by its product)
    dw = f32 && n > 0 ? at::empty(w.sizes(), sums) : at::zeros(w.sizes(), sums);
    db = at::zeros({v}, sums);
  }
  const int64_t most = v * std::max<int64_t>(std::min(block_rows, n), 1);
  at::Tensor buf = onednn ? at::Tensor() : at::empty({most}, xc.options());  // oneDNN writes a block of its own
  at::Tensor b = bias.has_value() ? bias->contiguous().unsqueeze(1) : at::Tensor();
  // float32 and bf16: the bias joins the fused passes in float32, added to each product as it is read
  // (ATen's addmm would first copy it over the whole block); float64 keeps addmm
  const at::Tensor bias_f32 = (f32 || bf16) && b.defined() ? b.to(at::kFloat).contiguous() : at::Tensor();
  const float* pass_bias = bias_f32.defined() ? bias_f32.data_ptr<float>() : nullptr;
  for (int64_t r0 = 0; r0 < n; r0 += block_rows) {
    const int64_t rows = std::min(n, r0 + block_rows) - r0;
    const at::Tensor xb = xc.narrow(0, r0, rows), tb = t.narrow(0, r0, rows);
    // a column per row of x
    at::Tensor logits = onednn ? gemm_with(w, xb, c10::nullopt, /*w_is_nk=*/true, GemmLibrary::onednn)
                               : buf.narrow(0, 0, v * rows).view({v, rows});
    if (!onednn) {
      if (b.defined() && !bias_f32.defined())
        at::addmm_out(logits, b, w, xb.t());
      else
        at::mm_out(logits, w, xb.t());
    }
    if (bf16) {  // the fused passes read the bf16 block as float32 lanes and write its gradient back in bf16
      block_loss(reinterpret_cast<uint16_t*>(logits.data_ptr<at::BFloat16>()), v, rows, pass_bias, tb, ignore_index,
                 eps, eps_i, loss, nll, grads ? db.data_ptr<float>() : nullptr);
      if (!grads) continue;
      at::Tensor dxb = dx.narrow(0, r0, rows);
      at::mm_out(dxb, logits.t(), w);
      dw.add_(at::mm(logits, xb));
      continue;
    }
    if (f32) {  // the fused passes
      block_loss(logits.data_ptr<float>(), v, rows, pass_bias, tb, ignore_index, eps, eps_i, loss, nll,
                 grads ? db.data_ptr<float>() : nullptr);
      if (!grads) continue;
      at::Tensor dxb = dx.narrow(0, r0, rows);
      at::mm_out(dxb, logits.t(), w);
      if (onednn) {
        at::Tensor part = gemm_with(logits, xb.t().contiguous(), c10::nullopt, /*w_is_nk=*/true, GemmLibrary::onednn);
        if (r0 == 0)
          dw = part;
        else
          dw.add_(part);
      } else if (r0 == 0) {
        at::mm_out(dw, logits, xb);
      } else {
        dw.addmm_(logits, xb);
      }
      continue;
    }
    const at::Tensor lse = at::logsumexp(logits, {0});
    const at::Tensor keep = tb.ne(ignore_index);
    const at::Tensor safe = tb.masked_fill(keep.logical_not(), 0);  // an ignored row's target may be any id
    const at::Tensor at_target = safe.mul(rows).add_(at::arange(rows, t.options()));  // flat (target, column)
    const at::Tensor flat = logits.view({-1});
    const at::Tensor nll_rows = lse.sub(flat.index_select(0, at_target)).mul_(keep);
    nll.add_(nll_rows.sum(at::kDouble));
    if (eps > 0)
      loss.add_(nll_rows.mul(1.0 - eps - eps_i)
                    .add_(lse.mul(double(v)).sub_(logits.sum(0)).mul_(keep), eps_i)
                    .sum(at::kDouble));
    if (!grads) continue;
    logits.sub_(lse).exp_();
    if (eps_i > 0) logits.sub_(eps_i);
    flat.index_add_(0, at_target, at::full({rows}, -(1.0 - eps - eps_i), xc.options()));
    logits.mul_(keep);
    at::Tensor dxb = dx.narrow(0, r0, rows);
    at::mm_out(dxb, logits.t(), w);
    dw.addmm_(logits, xb);
    db.add_(logits.sum(1));
  }
  if (!(eps > 0) && !f32 && !bf16) loss.copy_(nll);
  if (!grads) return {loss, nll};
  if (bf16) return {loss, nll, dx, dw.to(at::kBFloat16), db.to(at::kBFloat16)};
  return {loss, nll, dx, dw, db};
}

}  // namespace convs2s
