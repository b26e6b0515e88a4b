// One beam-search step's candidates in one call: log-softmax, the search's rules, the running
// scores, and the top 2 * beam continuations of every sentence (fairseq's BeamSearch.step).
//
// The Python composition (convs2s_kernels.beam_candidates_ref) makes a dozen passes over the
// (rows, V) scores and ends in torch.topk, which copies (value, index) pairs of the whole
// beam * V row and partially sorts them: ~0.15 ms per 40k entries, more than the arithmetic of a
// small model's step. Here the log-softmax is ATen's (so the values are the reference's, bit for
// bit), then one read-only pass per row keeps a sorted list of its best 2 * beam entries: a block
// of 16 entries whose largest cannot beat the list's last is skipped after one vector max.
// Rows run in parallel; each sentence then merges its beams' lists (a sentence's best 2 * beam
// over all its beams are among the union of its rows' best 2 * beam).

#include "common.h"

#include <ATen/Parallel.h>
#include <ATen/ops/log_softmax.h>
#include <ATen/record_function.h>
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace convs2s {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int64_t kBlock = 16;

struct Candidate {
  float score;
  int64_t flat;  // beam * V + token
};

// Higher score first; among equal scores the lower flat index (the scan order), so results do
// not depend on how rows are split across threads.
inline bool ranks_before(const Candidate& a, const Candidate& b) {
  return a.score > b.score || (a.score == b.score && a.flat < b.flat);
}

// The best ``cap`` candidates seen so far, sorted; a new one enters by insertion (cap is small).
class TopList {
 public:
  TopList(Candidate* items, int64_t cap) : items_(items), cap_(cap) {}
  bool full() const { return count_ == cap_; }
  float last() const { return items_[cap_ - 1].score; }
  int64_t count() const { return count_; }
  // Entries arrive in increasing flat order, so a later equal score never displaces the last.
  void offer(float score, int64_t flat) {
    if (full() && !(score > last())) return;
    int64_t i = full() ? cap_ - 1 : count_++;
    const Candidate c{score, flat};
    for (; i > 0 && ranks_before(c, items_[i - 1]); --i) items_[i] = items_[i - 1];
    items_[i] = c;
  }

 private:
  Candidate* items_;
  int64_t cap_;
  int64_t count_ = 0;
};

typedef float v4 __attribute__((vector_size(16)));

// The largest of 16 floats (NaNs ignored unless all are NaN; the rules map NaN to -inf anyway,
// and a block whose max does not beat the list holds nothing that could).
inline float block_max(const float* p) {
  v4 a, b, c, d;
  __builtin_memcpy(&a, p, 16);
  __builtin_memcpy(&b, p + 4, 16);
  __builtin_memcpy(&c, p + 8, 16);
  __builtin_memcpy(&d, p + 12, 16);
  a = a > b ? a : b;
  c = c > d ? c : d;
  a = a > c ? a : c;
  float m = a[0];
  for (int i = 1; i < 4; ++i) m = a[i] > m ? a[i] : m;
  return m;
}

// What the search's rules leave of a row (convs2s_kernels.beam_candidates_ref, in its order):
// NaN -> -inf, PAD -inf, UNK - unkpen, then either EOS alone (at max_len, or at a forced length)
// or EOS forbidden (before min_len, or before a forced length).
struct RowRules {
  int64_t pad, eos, unk;
  float unkpen;
  bool only_eos;
  bool no_eos;
  bool add_prev;
  float prev;

  float rule(const float* x, int64_t v) const {
    float s = x[v];
    if (s != s) s = kNegInf;
    if (v == pad) {
      s = kNegInf;
    } else if (v == unk) {
      s = s - unkpen;
    }
    if (only_eos && v != eos) s = kNegInf;
    if (no_eos && v == eos) s = kNegInf;
    return add_prev ? s + prev : s;
  }
  bool special(int64_t lo, int64_t hi) const {
    return (pad >= lo && pad < hi) || (eos >= lo && eos < hi) || (unk >= lo && unk < hi);
  }
};

// A row's best entries into ``list`` (flat = beam * V + v).
void scan_row(const float* x, int64_t V, int64_t beam_offset, const RowRules& r, TopList& list) {
  int64_t v = 0;
  if (r.only_eos) {  // every other entry is -inf: the first ones fill the list, EOS competes
    for (; v < V; ++v) {
      if (v == r.eos || !list.full()) list.offer(r.rule(x, v), beam_offset + v);
      else if (v > r.eos) break;
    }
    return;
  }
  for (; v < V && !list.full(); ++v) list.offer(r.rule(x, v), beam_offset + v);
  for (; v + kBlock <= V; v += kBlock) {
    if (!r.special(v, v + kBlock)) {
      const float m = block_max(x + v);
      // adding the row's constant is monotone in float arithmetic: max + prev bounds every sum
      if (!((r.add_prev ? m + r.prev : m) > list.last())) continue;
    }
    for (int64_t j = v; j < v + kBlock; ++j) list.offer(r.rule(x, j), beam_offset + j);
  }
  for (; v < V; ++v) list.offer(r.rule(x, v), beam_offset + v);
}

struct SearchStep {
  int64_t step, max_len, min_len, pad, eos, unk;
  float unkpen;
};

RowRules row_rules(const SearchStep& s, const int64_t* forced, const float* prev, int64_t row) {
  RowRules r{s.pad, s.eos, s.unk, s.unkpen, false, false, prev != nullptr, prev ? prev[row] : 0.f};
  if (s.step >= s.max_len) {
    r.only_eos = true;
    return r;
  }
  r.no_eos = s.step < s.min_len;
  if (forced != nullptr) {
    if (s.step < forced[row]) r.no_eos = true;
    if (s.step == forced[row]) r.only_eos = true;  // EOS keeps what the min-length rule left it
  }
  return r;
}

}  // namespace

// logits (N, V) float32/bf16, N = B * beam (a sentence's beams adjacent); prev_scores (N,) the
// rows' running scores (None at step 0, where only each sentence's first beam is live);
// forced_len (N,) int64 or None; ignore (B, beam) bool or None -> (scores (B, C) float32,
// tokens (B, C) int64, beams (B, C) int64, eos_mask (B, C) bool), C = min(2 * beam, live * V - 1).
std::vector<at::Tensor> beam_candidates(const at::Tensor& logits, const c10::optional<at::Tensor>& prev_scores,
                                        int64_t beam, int64_t step, int64_t max_len, int64_t min_len, double unkpen,
                                        const c10::optional<at::Tensor>& forced_len,
                                        const c10::optional<at::Tensor>& ignore, int64_t pad, int64_t eos,
                                        int64_t unk) {
  RECORD_FUNCTION("convs2s::beam_candidates", std::vector<c10::IValue>());
  CONVS2S_CHECK_CPU(logits);
  CONVS2S_CHECK_DIM(logits, 2);
  const int64_t N = logits.size(0), V = logits.size(1);
  TORCH_CHECK(beam >= 1 && N % beam == 0, "beam_candidates: rows must be sentences x beam");
  const int64_t B = N / beam;
  const int64_t live = step == 0 ? 1 : beam;
  const int64_t C = std::min<int64_t>(2 * beam, live * V - 1);
  TORCH_CHECK(C >= 1, "beam_candidates: the vocabulary is too small for beam ", beam);
  const at::Tensor lp = at::log_softmax(logits.to(at::kFloat), -1).contiguous();
  at::Tensor prev, forced;
  if (step > 0) {
    TORCH_CHECK(prev_scores.has_value() && prev_scores->numel() == N, "beam_candidates: prev_scores (N,) needed after step 0");
    prev = prev_scores->to(at::kFloat).contiguous();
  }
  if (forced_len.has_value()) {
    TORCH_CHECK(forced_len->numel() == N, "beam_candidates: forced_len must be (N,)");
    forced = forced_len->to(at::kLong).contiguous();
  }
  const SearchStep s{step, max_len, min_len, pad, eos, unk, static_cast<float>(unkpen)};
  const float* x = lp.data_ptr<float>();
  const float* pv = prev.defined() ? prev.data_ptr<float>() : nullptr;
  const int64_t* fv = forced.defined() ? forced.data_ptr<int64_t>() : nullptr;

  // every live row's own best C, then each sentence's best C of its rows' lists
  std::vector<Candidate> lists(B * live * C);
  std::vector<int64_t> counts(B * live);
  at::parallel_for(0, B * live, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t b = i / live, j = i % live, row = b * beam + j;
      TopList list(lists.data() + i * C, C);
      scan_row(x + row * V, V, j * V, row_rules(s, fv, pv, row), list);
      counts[i] = list.count();
    }
  });
  const auto f32 = logits.options().dtype(at::kFloat);
  at::Tensor scores = at::empty({B, C}, f32);
  at::Tensor tokens = at::empty({B, C}, f32.dtype(at::kLong));
  at::Tensor beams = at::empty({B, C}, f32.dtype(at::kLong));
  at::Tensor eos_mask = at::empty({B, C}, f32.dtype(at::kBool));
  const bool* ign = nullptr;
  at::Tensor ignore_c;
  if (ignore.has_value()) {
    TORCH_CHECK(ignore->numel() == B * beam, "beam_candidates: ignore must be (B, beam)");
    ignore_c = ignore->to(at::kBool).contiguous();
    ign = ignore_c.data_ptr<bool>();
  }
  float* out_score = scores.data_ptr<float>();
  int64_t* out_token = tokens.data_ptr<int64_t>();
  int64_t* out_beam = beams.data_ptr<int64_t>();
  bool* out_eos = eos_mask.data_ptr<bool>();
  std::vector<Candidate> merged;
  for (int64_t b = 0; b < B; ++b) {
    merged.clear();
    for (int64_t j = 0; j < live; ++j) {
      const Candidate* l = lists.data() + (b * live + j) * C;
      merged.insert(merged.end(), l, l + counts[b * live + j]);
    }
    std::partial_sort(merged.begin(), merged.begin() + C, merged.end(), ranks_before);
    for (int64_t c = 0; c < C; ++c) {
      const Candidate& m = merged[c];
      const int64_t o = b * C + c;
      out_score[o] = m.score;
      out_token[o] = m.flat % V;
      out_beam[o] = m.flat / V;
      const bool ignored = ign != nullptr && c < beam && ign[b * beam + c];
      out_eos[o] = out_token[o] == eos && m.score != kNegInf && !ignored;
    }
  }
  return {scores, tokens, beams, eos_mask};
}

}  // namespace convs2s
