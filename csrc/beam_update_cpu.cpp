// The rest of a beam-search step in one call: record the finished hypotheses (EOS among each
// sentence's best ``beam`` candidates) and advance every beam to its next ``beam`` live
// candidates (fairseq's finalize_hypos and the active-hypothesis selection).
//
// The reference (convs2s_kernels.beam_update_ref) is ~30 small tensor ops whose dispatch costs
// more than their arithmetic at a few sentences per batch; here each sentence's handful of
// candidates is walked once, and the prefixes follow their parents with one gather per buffer.

#include "common.h"

#include <ATen/record_function.h>
#include <cmath>
#include <limits>
#include <vector>

namespace convs2s {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Candidates {
  at::TensorAccessor<float, 2> scores;
  at::TensorAccessor<int64_t, 2> tokens;
  at::TensorAccessor<int64_t, 2> beams;
  at::TensorAccessor<bool, 2> eos;
};

struct Finished {
  at::TensorAccessor<int64_t, 2> tokens;
  at::TensorAccessor<float, 2> pos_scores;
  at::TensorAccessor<float, 1> scores;
  at::TensorAccessor<int64_t, 1> lengths;
  at::TensorAccessor<int64_t, 1> count;
  at::TensorAccessor<bool, 1> done;
};

// Sentence b's EOS candidates among its first k, in score order, while it has fewer than k
// hypotheses: tokens and positional scores of the parent's prefix, then EOS; the score
// normalised by length ** lenpen. A sentence is done with k of them, or at max_len.
void finalize_sentence(int64_t b, int64_t k, int64_t step, int64_t eos, float denom, bool at_max_len,
                       const Candidates& c, const at::TensorAccessor<int64_t, 2>& tokens,
                       const at::TensorAccessor<float, 2>& scores, int64_t sent, Finished& f,
                       const c10::optional<at::Tensor>& attn, const c10::optional<at::Tensor>& f_attn) {
  const bool active = !f.done[sent];
  const int64_t count = f.count[sent];
  int64_t seen = 0, kept = 0;
  for (int64_t j = 0; j < k; ++j) {
    if (!c.eos[b][j]) continue;
    const int64_t slot = count + seen++;
    if (!active || slot >= k) continue;
    const int64_t dest = sent * k + slot, parent = b * k + c.beams[b][j];
    float before = 0.f;
    for (int64_t t = 0; t <= step; ++t) {
      f.tokens[dest][t] = t < step ? tokens[parent][t + 1] : eos;
      const float cumulative = t < step ? scores[parent][t] : c.scores[b][j];
      f.pos_scores[dest][t] = t == 0 ? cumulative : cumulative - before;
      before = cumulative;
    }
    f.scores[dest] = c.scores[b][j] / denom;
    f.lengths[dest] = step + 1;
    if (attn.has_value())
      f_attn->select(0, dest).narrow(1, 0, step + 1).copy_(attn->select(0, parent).narrow(1, 1, step + 1));
    ++kept;
  }
  f.count[sent] = count + kept;
  if (active && (count + kept >= k || at_max_len)) f.done[sent] = true;
}

}  // namespace

// In place on tokens (N, L+2), scores (N, L+1), attn (N, S, L+2) and the finished buffers;
// returns (parents (N,) int64: the row each new row continues, ignore (B, k) bool: which new rows
// came from EOS or ignored candidates and may not end). Candidates (B, C >= k) as
// beam_candidates returns them; sent_ids (B,) the batch rows' sentences in the finished buffers.
std::vector<at::Tensor> beam_update(const at::Tensor& cand_scores, const at::Tensor& cand_tokens,
                                    const at::Tensor& cand_beams, const at::Tensor& cand_eos, int64_t step,
                                    at::Tensor tokens, at::Tensor scores, const c10::optional<at::Tensor>& attn,
                                    const at::Tensor& ignore, const at::Tensor& sent_ids, at::Tensor f_tokens,
                                    at::Tensor f_pos_scores, at::Tensor f_scores, at::Tensor f_lengths,
                                    const c10::optional<at::Tensor>& f_attn, at::Tensor f_count, at::Tensor f_done,
                                    double lenpen, bool at_max_len, int64_t eos) {
  RECORD_FUNCTION("convs2s::beam_update", std::vector<c10::IValue>());
  CONVS2S_CHECK_CPU(tokens);
  const int64_t B = ignore.size(0), k = ignore.size(1), C = cand_scores.size(1);
  TORCH_CHECK(C >= k && cand_scores.size(0) == B && tokens.size(0) == B * k && scores.size(0) == B * k,
              "beam_update: candidates (B, C >= beam), buffers (B * beam, *)");
  TORCH_CHECK(tokens.size(1) >= step + 2 && scores.size(1) >= step + 1 && f_tokens.size(1) >= step + 1,
              "beam_update: the buffers are shorter than step ", step, " needs");
  TORCH_CHECK(attn.has_value() == f_attn.has_value(), "beam_update: attention buffers come in pairs");
  // the accessors below do not check their bounds: every size they are read at, checked here
  for (const at::Tensor* t : {&cand_tokens, &cand_beams, &cand_eos})
    TORCH_CHECK(t->dim() == 2 && t->size(0) == B && t->size(1) == C,
                "beam_update: the candidates' tokens, beams and eos_mask must be (B, C) like their scores");
  TORCH_CHECK(sent_ids.dim() == 1 && sent_ids.size(0) == B, "beam_update: sent_ids must be (B,)");
  const int64_t slots = 2 * f_count.size(0) * k;
  TORCH_CHECK(f_done.size(0) == f_count.size(0) && f_tokens.size(0) == slots && f_pos_scores.size(0) == slots &&
                  f_pos_scores.size(1) >= step + 1 && f_scores.size(0) == slots && f_lengths.size(0) == slots,
              "beam_update: the finished buffers must hold 2 x sentences x beam rows (FinishedHypotheses.empty)");
  if (attn.has_value())
    TORCH_CHECK(attn->dim() == 3 && attn->size(0) == B * k && attn->size(2) >= step + 2 && f_attn->dim() == 3 &&
                    f_attn->size(0) == slots && f_attn->size(1) == attn->size(1) && f_attn->size(2) >= step + 1,
                "beam_update: attn (B * beam, S, > step + 1) and finished.attn (2 x sentences x beam, S, > step)");
  {
    const auto parent = cand_beams.accessor<int64_t, 2>();
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < C; ++j)
        TORCH_CHECK(parent[b][j] >= 0 && parent[b][j] < k, "beam_update: cands.beams[", b, "][", j, "] = ",
                    parent[b][j], " is not a beam in [0, ", k, ")");
  }
  Candidates c{cand_scores.accessor<float, 2>(), cand_tokens.accessor<int64_t, 2>(),
               cand_beams.accessor<int64_t, 2>(), cand_eos.accessor<bool, 2>()};
  Finished f{f_tokens.accessor<int64_t, 2>(), f_pos_scores.accessor<float, 2>(), f_scores.accessor<float, 1>(),
             f_lengths.accessor<int64_t, 1>(), f_count.accessor<int64_t, 1>(), f_done.accessor<bool, 1>()};
  const auto sent = sent_ids.accessor<int64_t, 1>();
  const auto ign = ignore.accessor<bool, 2>();
  const auto tok = tokens.accessor<int64_t, 2>();
  const auto sc = scores.accessor<float, 2>();
  // as the reference: a float32 score divided by the double length ** lenpen rounded to float32
  const float denom = static_cast<float>(std::pow(static_cast<double>(step + 1), lenpen));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t s = sent[b];
    TORCH_CHECK(s >= 0 && s < f_count.size(0), "beam_update: sent_ids out of range");
    finalize_sentence(b, k, step, eos, denom, at_max_len, c, tok, sc, s, f, attn, f_attn);
  }

  // Each sentence's next beam: its first k candidates that neither end (EOS) nor are ignored,
  // in score order, then (when fewer) the others, in score order; those may not end later.
  at::Tensor parents = at::empty({B * k}, tokens.options());
  at::Tensor new_ignore = at::empty({B, k}, ignore.options());
  at::Tensor next_tokens = at::empty({B * k}, tokens.options());
  at::Tensor next_scores = at::empty({B * k}, scores.options());
  auto par = parents.accessor<int64_t, 1>();
  auto nig = new_ignore.accessor<bool, 2>();
  auto ntok = next_tokens.accessor<int64_t, 1>();
  auto nsc = next_scores.accessor<float, 1>();
  for (int64_t b = 0; b < B; ++b) {
    int64_t n = 0;
    for (int pass = 0; pass < 2 && n < k; ++pass) {
      for (int64_t j = 0; j < C && n < k; ++j) {
        const bool blocked = c.eos[b][j] || (j < k && ign[b][j]);
        if (blocked != (pass == 1)) continue;
        par[b * k + n] = b * k + c.beams[b][j];
        ntok[b * k + n] = c.tokens[b][j];
        nsc[b * k + n] = c.scores[b][j];
        nig[b][n] = blocked;
        ++n;
      }
    }
  }
  at::Tensor prefix = tokens.narrow(1, 0, step + 1);
  prefix.copy_(prefix.index_select(0, parents));
  tokens.select(1, step + 1).copy_(next_tokens);
  if (step > 0) {
    at::Tensor run = scores.narrow(1, 0, step);
    run.copy_(run.index_select(0, parents));
  }
  scores.select(1, step).copy_(next_scores);
  if (attn.has_value()) {
    at::Tensor a = attn->narrow(2, 0, step + 2);
    a.copy_(a.index_select(0, parents));
  }
  return {parents, new_ignore};
}

}  // namespace convs2s
