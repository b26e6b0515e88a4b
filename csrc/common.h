// Shared argument checks for the CPU kernels. The Python wrappers validate shapes with
// readable messages first; these guard the C++ entry points against misuse from elsewhere.
#pragma once

#include <torch/extension.h>

#define CONVS2S_CHECK_CPU(t) TORCH_CHECK((t).device().is_cpu(), #t " must be a CPU tensor")
#define CONVS2S_CHECK_DIM(t, n) TORCH_CHECK((t).dim() == (n), #t " must have " #n " dimensions, got ", (t).dim())

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>

namespace convs2s {

// Every buffer a kernel must fill: at::empty, or NaN-filled when CONVS2S_KERNELS_POISON=1 (the
// tests set it), so an element a kernel forgets to write shows up as NaN. Read once per process.
inline at::Tensor new_output(at::IntArrayRef sizes, const at::TensorOptions& options) {
  static const bool poison = [] {
    const char* v = std::getenv("CONVS2S_KERNELS_POISON");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  if (poison && at::isFloatingType(c10::typeMetaToScalarType(options.dtype())))
    return at::full(sizes, std::numeric_limits<double>::quiet_NaN(), options);
  return at::empty(sizes, options);
}

// ``t`` itself when its last dimension has unit stride, else a contiguous copy: the kernels walk
// rows by their strides but read each row's channels as one run.
inline at::Tensor last_dim_contiguous(const at::Tensor& t) {
  return t.size(-1) <= 1 || t.stride(-1) == 1 ? t : t.contiguous();
}

// fn(row, c0, c1) over the columns [c0, c1) of each row of a rows x cols block, the block's
// elements shared among the threads in runs of at least kRowSpanGrain (a run may start or end
// inside a row): a decoding step has a few rows of 512-8192 channels, which a split by rows
// alone leaves to one thread.
constexpr int64_t kRowSpanGrain = 4096;

template <typename F>
void parallel_row_spans(int64_t rows, int64_t cols, const F& fn) {
  at::parallel_for(0, rows * cols, kRowSpanGrain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin / cols; r * cols < end; ++r)
      fn(r, std::max<int64_t>(begin - r * cols, 0), std::min<int64_t>(end - r * cols, cols));
  });
}

// Runs per thread that parallel_runs deals out: the packed float kernel measured 4, 8 and 16 alike
// within 3% (32 cost 6% where both vCPUs ran alike); the int8 kernel's steps alike within 1%.
constexpr int64_t kRunsPerThread = 8;

// fn(i0, i1) over [0, count) in runs of consecutive items that the threads take from a shared
// counter (about kRunsPerThread runs each), not a fixed share each: on a 2-vCPU VM (AMD EPYC
// Zen 3) one vCPU at times ran far slower, per call and for seconds at a time, and a fixed split
// waited for it (bench/results/amd-zen3-2c). Each item is still computed whole by one thread, so
// results do not depend on the schedule. Inside a parallel region, or on one thread: one run.
template <typename F>
void parallel_runs(int64_t count, const F& fn) {
  const int64_t threads = at::get_num_threads();
  if (count <= 0) return;
  if (threads == 1 || at::in_parallel_region()) return fn(int64_t(0), count);
  const int64_t run = std::max<int64_t>(1, count / (threads * kRunsPerThread));
  const int64_t runs = (count + run - 1) / run;
  std::atomic<int64_t> next{0};
  at::parallel_for(0, std::min(threads, runs), 1, [&](int64_t, int64_t) {
    for (int64_t i; (i = next.fetch_add(1)) < runs;) fn(i * run, std::min(count, (i + 1) * run));
  });
}

}  // namespace convs2s
