// One Nesterov step over every parameter at once (fairseq's NAG = torch's SGD(nesterov=True)):
//   g = grad * grad_scale + weight_decay * p;  buf = momentum * buf + g;  p -= lr * (g + momentum * buf)
// in one pass over (p, grad, buf): torch's step makes four passes after the trainer's own
// normalising and clipping passes, here folded into grad_scale. The elements of all tensors are
// one range shared among the threads.

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <vector>

#include "common.h"
#include "kernels.h"

namespace convs2s {

namespace {

template <typename scalar_t>
void nag_span(scalar_t* __restrict p, const scalar_t* __restrict grad, scalar_t* __restrict buf, int64_t n, double lr,
              double momentum, double weight_decay, double grad_scale) {
  const scalar_t lr_ = static_cast<scalar_t>(lr), m = static_cast<scalar_t>(momentum),
                 wd = static_cast<scalar_t>(weight_decay), gs = static_cast<scalar_t>(grad_scale);
  for (int64_t i = 0; i < n; ++i) {
    const scalar_t g = (grad ? grad[i] * gs : scalar_t(0)) + wd * p[i];
    const scalar_t b = m * buf[i] + g;
    buf[i] = b;
    p[i] -= lr_ * (g + m * b);
  }
}

}  // namespace

void nag_step(const std::vector<at::Tensor>& params, const std::vector<c10::optional<at::Tensor>>& grads,
              const std::vector<at::Tensor>& bufs, double lr, double momentum, double weight_decay,
              double grad_scale) {
  RECORD_FUNCTION("convs2s::nag_step", std::vector<c10::IValue>());  // a pass the profiler would not see
  TORCH_CHECK(params.size() == grads.size() && params.size() == bufs.size(),
              "nag_step: params, grads and momentum buffers must be lists of one length");
  if (params.empty()) return;
  const auto dtype = params[0].scalar_type();
  std::vector<int64_t> starts{0};
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i];
    CONVS2S_CHECK_CPU(p);
    TORCH_CHECK(p.scalar_type() == dtype && p.is_contiguous(), "nag_step: parameters must be contiguous, of one dtype");
    TORCH_CHECK(bufs[i].scalar_type() == dtype && bufs[i].is_contiguous() && bufs[i].numel() == p.numel(),
                "nag_step: each momentum buffer must be contiguous, like its parameter");
    if (grads[i].has_value())
      TORCH_CHECK(grads[i]->scalar_type() == dtype && grads[i]->is_contiguous() && grads[i]->numel() == p.numel(),
                  "nag_step: each gradient must be contiguous, like its parameter");
    starts.push_back(starts.back() + p.numel());
  }
  AT_DISPATCH_FLOATING_TYPES(dtype, "nag_step", [&] {
    at::parallel_for(0, starts.back(), 1 << 15, [&](int64_t begin, int64_t end) {
      // the first tensor holding `begin`, then tensor by tensor to `end`
      size_t i = std::upper_bound(starts.begin(), starts.end(), begin) - starts.begin() - 1;
      for (; i < params.size() && starts[i] < end; ++i) {
        const int64_t lo = std::max(begin, starts[i]) - starts[i], hi = std::min(end, starts[i + 1]) - starts[i];
        if (hi <= lo) continue;
        const scalar_t* g = grads[i].has_value() ? grads[i]->data_ptr<scalar_t>() + lo : nullptr;
        nag_span<scalar_t>(params[i].data_ptr<scalar_t>() + lo, g, bufs[i].data_ptr<scalar_t>() + lo, hi - lo, lr,
                           momentum, weight_decay, grad_scale);
      }
    });
  });
}

}  // namespace convs2s
