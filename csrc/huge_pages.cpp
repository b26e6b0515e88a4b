// Huge pages for streamed weights (huge_pages.h).
//
// A decoding step reads every weight of the decoder once (381 MB for fconv_wmt_en_fr) and nothing
// stays in cache between steps. On 4 KB pages that stream crosses a page every 4 KB: a TLB miss
// and a hardware prefetcher that stops at the boundary. On 2 MB pages the stream reads faster and
// steadier from run to run (bench/results/kernel-decisions.md#huge-pages-streamed-weights).

#include "huge_pages.h"
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>

#include <cstdint>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace convs2s {

namespace {
constexpr size_t kHugePage = size_t(2) << 20;
}

at::Tensor huge_page_empty(at::IntArrayRef sizes, at::ScalarType dtype) {
  const auto options = at::TensorOptions().dtype(dtype).device(at::kCPU);
  int64_t numel = 1;
  for (const int64_t s : sizes) numel *= s;
  const size_t bytes = size_t(numel) * c10::elementSize(dtype);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (bytes >= kHugePage) {
    // map a huge page more than needed, then start at the first 2 MB boundary inside
    const size_t length = (bytes + kHugePage - 1) / kHugePage * kHugePage + kHugePage;
    void* base = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base != MAP_FAILED) {
      const uintptr_t aligned = (reinterpret_cast<uintptr_t>(base) + kHugePage - 1) & ~(uintptr_t(kHugePage) - 1);
      madvise(reinterpret_cast<void*>(aligned), length - (aligned - reinterpret_cast<uintptr_t>(base)),
              MADV_HUGEPAGE);  // advice only: without huge pages the memory is ordinary
      return at::from_blob(
          reinterpret_cast<void*>(aligned), sizes, [base, length](void*) { munmap(base, length); }, options);
    }
  }
#endif
  return at::empty(sizes, options);
}

at::Tensor huge_page_copy(const at::Tensor& t) {
  TORCH_CHECK(t.device().is_cpu(), "huge_page_copy takes a CPU tensor");
  at::Tensor out = huge_page_empty(t.sizes(), t.scalar_type());
  out.copy_(t);
  return out;
}

}  // namespace convs2s
