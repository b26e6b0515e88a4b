// Shared argument checks for the CPU kernels. The Python wrappers validate shapes with
// readable messages first; these guard the C++ entry points against misuse from elsewhere.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>

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

// fn(i0, i1) over [0, count) in runs of consecutive items that the threads take from a shared
// counter, each run 1 / (1.5 * threads) of the items left (at least one): long runs first, short
// ones at the end. Not a fixed share each: a virtual core may run far slower for seconds at a
// time, and a fixed split waits for it; with the first run a third of the work (two threads), a
// thread up to 2x slower still finishes its run in time. Not short runs throughout either (about
// 8 a thread): a kernel prefetches the next block only within its run, so runs of one or two
// blocks (a 1024-2048-column weight) stream with gaps
// (bench/results/kernel-decisions.md#common-parallel-runs).
// Each item is still computed whole by one thread, so results do not depend on the schedule.
// Inside a parallel region, or on one thread: one run.
template <typename F>
void parallel_runs(int64_t count, const F& fn) {
  const int64_t threads = at::get_num_threads();
  if (count <= 0) return;
  if (threads == 1 || at::in_parallel_region()) return fn(int64_t(0), count);
  std::atomic<int64_t> next{0};
  at::parallel_for(0, std::min(threads, count), 1, [&](int64_t, int64_t) {
    for (int64_t begin = next.load(); begin < count;) {
      const int64_t take = std::max<int64_t>(1, (count - begin) * 2 / (3 * threads));
      if (next.compare_exchange_weak(begin, begin + take)) {  // else begin is now the counter's value
        fn(begin, std::min(count, begin + take));
        begin = next.load();
      }
    }
  });
}

}  // namespace convs2s
