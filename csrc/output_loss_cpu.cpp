// The decoder's output projection and the label-smoothed cross-entropy on the CPU, forward and
// gradients in one call, a block of rows at a time.
//
// For each block the logits are made transposed, (V, rows) = weight @ x_block^T (ATen's GEMM runs
// this orientation faster than x @ weight^T: bench/results/amd-zen3-2c/training-ops.md),
// reduced to the rows' log-sum-exp, target logit and logit sum while the block is in cache, turned
// in place into d loss / d logits = softmax - eps_i - (1 - eps - eps_i) at the target (0 on ignored
// rows), and multiplied at once into the input's and the weight's gradients. The whole (N, V)
// logits never exist, nor their log-softmax or its gradient.

#include <ATen/ops/addmm.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/full.h>
#include <ATen/ops/logsumexp.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>

#include "common.h"
#include "kernels.h"

namespace convs2s {

std::vector<at::Tensor> output_loss_forward(const at::Tensor& x, const at::Tensor& weight,
                                            const c10::optional<at::Tensor>& bias, const at::Tensor& target, double eps,
                                            int64_t ignore_index, bool grads, int64_t block_rows) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1), "output_loss: x (N, C), weight (V, C)");
  TORCH_CHECK(target.dim() == 1 && target.size(0) == x.size(0), "output_loss: target (N,)");
  TORCH_CHECK(block_rows > 0, "output_loss: block_rows > 0");
  const at::Tensor xc = x.contiguous(), w = weight.contiguous(), t = target.to(at::kLong).contiguous();
  const int64_t n = xc.size(0), v = w.size(0);
  const double eps_i = eps > 0 ? eps / double(v - 1) : 0.0;
  const auto f64 = xc.options().dtype(at::kDouble);
  at::Tensor loss = at::zeros({}, f64), nll = at::zeros({}, f64);
  at::Tensor dx, dw, db;
  if (grads) {
    dx = at::empty_like(xc);
    dw = at::zeros_like(w);
    db = at::zeros({v}, xc.options());
  }
  at::Tensor buf = at::empty({v * std::max<int64_t>(std::min(block_rows, n), 1)}, xc.options());
  at::Tensor b = bias.has_value() ? bias->contiguous().unsqueeze(1) : at::Tensor();
  for (int64_t r0 = 0; r0 < n; r0 += block_rows) {
    const int64_t rows = std::min(n, r0 + block_rows) - r0;
    const at::Tensor xb = xc.narrow(0, r0, rows), tb = t.narrow(0, r0, rows);
    at::Tensor logits = buf.narrow(0, 0, v * rows).view({v, rows});  // a column per row of x
    if (b.defined())
      at::addmm_out(logits, b, w, xb.t());
    else
      at::mm_out(logits, w, xb.t());
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
  if (!(eps > 0)) loss.copy_(nll);
  if (!grads) return {loss, nll};
  return {loss, nll, dx, dw, db};
}

}  // namespace convs2s
