// Dropout on the CPU with its mask a hash of (seed, element index) instead of a stored or drawn
// tensor: torch's bernoulli_ draws from a sequential Mersenne twister (bench/results/amd-zen3-2c/
// training-ops.md), this is a few multiplies and shifts per element in parallel, and backward
// recomputes the same mask from the seed (nothing saved).
//
// keep(i) = fmix32(i * 0x9E3779B1 + seed_lo ^ seed_hi) >= threshold, with murmur3's finaliser:
// for a fixed seed, distinct indices below 2^32 give distinct hashes (both steps are bijections).
// The reference (convs2s_kernels/ops/dropout/reference.py) computes the same bits in int64 ops.

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty_like.h>
#include <cstdint>

#include "common.h"
#include "kernels.h"

namespace convs2s {

namespace {

inline uint32_t fmix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return h;
}

}  // namespace

at::Tensor dropout_apply(const at::Tensor& x, double p, int64_t seed) {
  TORCH_CHECK(p >= 0.0 && p < 1.0, "dropout: p must lie in [0, 1)");
  TORCH_CHECK(x.numel() <= (int64_t(1) << 32), "dropout: at most 2^32 elements per call");
  const at::Tensor xc = x.contiguous();
  at::Tensor out = at::empty_like(xc);
  const uint64_t s = static_cast<uint64_t>(seed);
  const uint32_t mix = static_cast<uint32_t>(s) ^ static_cast<uint32_t>(s >> 32);
  // keep when the hash is at least p * 2^32 (rounded down): P(keep) = 1 - p within 2^-32
  const uint64_t threshold = static_cast<uint64_t>(p * 4294967296.0);
  const int64_t n = xc.numel();
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, xc.scalar_type(), "dropout_apply", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const acc_t scale = acc_t(1.0 / (1.0 - p));
    const scalar_t* src = xc.data_ptr<scalar_t>();
    scalar_t* dst = out.data_ptr<scalar_t>();
    at::parallel_for(0, n, 16384, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const uint32_t h = fmix32(static_cast<uint32_t>(i) * 0x9E3779B1u + mix);
        dst[i] = h >= threshold ? scalar_t(acc_t(src[i]) * scale) : scalar_t(0);
      }
    });
  });
  return out;
}

}  // namespace convs2s
