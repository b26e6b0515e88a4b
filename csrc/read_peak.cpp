// The memory's read bandwidth as a streaming kernel sees it: the bandwidth limit a roofline divides by.
//
// A tensor copy or sum is not the fastest reader: the packed int8 kernels prefetch their weight
// stream ahead into L1 on every thread. Here every thread reads its contiguous share of the buffer
// once, 64-byte lines summed into independent accumulators, asking for the lines kStreamAheadBytes
// ahead as the AVX2 int8 kernel does (stream_ahead.h); nothing is written. It reads faster than a
// copy or a sum (bench/results/kernel-decisions.md#read-peak-probe).
// The bytes past the last whole line are neither read nor counted.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels.h"
#include "stream_ahead.h"

namespace convs2s {

namespace {

constexpr int64_t kLine = 64;

// One thread's share [begin, end) of whole lines; returns a value depending on every byte read.
uint64_t read_lines(const char* begin, const char* end) {
  uint64_t acc[8] = {};
  for (const char* p = begin; p < end; p += kLine) {
    __builtin_prefetch(p + kStreamAheadBytes, 0, 3);
    uint64_t words[8];
    std::memcpy(words, p, kLine);
    for (int i = 0; i < 8; ++i) acc[i] += words[i];
  }
  uint64_t sum = 0;
  for (uint64_t a : acc) sum ^= a;
  return sum;
}

}  // namespace

double read_peak_gbps(const at::Tensor& buffer) {
  TORCH_CHECK(buffer.device().is_cpu() && buffer.is_contiguous(), "read_peak_gbps: buffer must be a contiguous CPU tensor");
  const int64_t lines = static_cast<int64_t>(buffer.nbytes()) / kLine;
  TORCH_CHECK(lines >= 1, "read_peak_gbps: buffer must hold at least ", kLine, " bytes");
  const char* base = static_cast<const char*>(buffer.data_ptr());
  const int threads = at::get_num_threads();
  std::vector<uint64_t> sums(threads, 0);
  const auto t0 = std::chrono::steady_clock::now();
  at::parallel_for(0, threads, 1, [&](int64_t t0_, int64_t t1_) {
    for (int64_t t = t0_; t < t1_; ++t) {
      const int64_t l0 = lines * t / threads, l1 = lines * (t + 1) / threads;
      sums[t] = read_lines(base + l0 * kLine, base + l1 * kLine);
    }
  });
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  uint64_t all = 0;
  for (uint64_t s : sums) all ^= s;
  // stored where the compiler must assume it is read, so the loads cannot be removed
  volatile uint64_t sink = all;
  (void)sink;
  return static_cast<double>(lines * kLine) / secs / 1e9;
}

}  // namespace convs2s
