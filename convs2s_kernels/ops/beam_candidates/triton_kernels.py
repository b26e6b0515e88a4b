"""A beam-search step's choice of continuations in Triton: two launches.

``_row_candidates_kernel``: one program per live row. A first pass over the row's logits keeps
an online max and sum of ``exp`` per lane (in fp32); a second computes each entry's log-probability
under the search's rules plus the row's running score and keeps, per lane, the best ``C`` entries
seen (``C`` slots in registers: an entry replaces the lane's worst when it ranks above it), but
only in chunks holding an entry at or above a floor of the row's ``C``-th best score (the ``C``-th
largest of the lanes' maxima, known after the first pass), which most chunks of a large
vocabulary do not. The lanes' lists are then merged into the row's best ``C``. Ranks are (score descending, token
ascending): exact, whatever the lane count, since a row's best ``C`` are each among their lane's.

``_merge_candidates_kernel``: one program per sentence takes the best ``C`` of its live rows' lists
(score descending, then beam, then token) and writes the op's four outputs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...triton_common.config import INTERPRET, new_empty
from ..device_step import is_device_step, is_first_step
from .reference import BeamCandidates

NEG_INF = tl.constexpr(float("-inf"))
INT32_MAX = tl.constexpr(2147483647)
SENTINEL = tl.constexpr(1 << 30)  # empty slots' tokens: above every token, below INT32_MAX (lanes past V)
FLAT_NONE = tl.constexpr(1 << 62)  # a merged entry already taken (or a padding slot)

# lanes of a row program: one lane a thread on GPUs; under the interpreter as wide as the row (numpy)
GPU_LANES, GPU_WARPS, INTERPRETER_LANES = 128, 4, 8192


@triton.jit
def _row_stats(base, s_lv, V, pad, unk, eos, LANES: tl.constexpr):
    """Pass 1 over a row: its max and log of the sum of exp (online per lane, in fp32), whether it
    is all -inf after the rules (a NaN or +inf anywhere: log_softmax gives NaN everywhere, which
    nan_to_num makes -inf), and each lane's max over the tokens no rule touches."""
    lanes = tl.arange(0, LANES)
    m = tl.full((LANES,), float("-inf"), tl.float32)
    m_plain = tl.full((LANES,), float("-inf"), tl.float32)
    s = tl.zeros((LANES,), tl.float32)
    bad = tl.zeros((LANES,), tl.int32)
    for v0 in range(0, V, LANES):
        cols = v0 + lanes
        x = tl.load(base + cols * s_lv, mask=cols < V, other=float("-inf")).to(tl.float32)
        odd = (x != x) | (x == float("inf"))
        bad = bad | odd.to(tl.int32)
        x = tl.where(odd, float("-inf"), x)
        new_m = tl.maximum(m, x)
        live = new_m != float("-inf")
        s = tl.where(live, s * tl.exp(m - new_m) + tl.exp(x - new_m), 0.0)
        m = new_m
        m_plain = tl.maximum(m_plain, tl.where((cols == pad) | (cols == unk) | (cols == eos), float("-inf"), x))
    row_max = tl.max(m, axis=0)
    total = tl.sum(tl.where(m != float("-inf"), s * tl.exp(m - row_max), 0.0), axis=0)
    bad_row = (tl.max(bad, axis=0) > 0) | (row_max == float("-inf"))
    return row_max, tl.log(total), bad_row, m_plain


@triton.jit
def _floor_logit(m_plain, C: tl.constexpr):
    """A floor of a row's C-th best logit: the C-th largest lane maximum among the plain tokens
    (ties removed together, which only lowers it): C distinct entries are at least as good."""
    floor_x = tl.max(m_plain, axis=0)
    for j in tl.static_range(C - 1):
        m_plain = tl.where(m_plain == floor_x, float("-inf"), m_plain)
        floor_x = tl.max(m_plain, axis=0)
    return floor_x


@triton.jit
def _eos_rules(step, max_len, min_len, forced_ptr, row, s_forced, HAS_FORCED: tl.constexpr):
    """search_rules_ref's step rules for a row: (EOS may not end it here, only EOS may)."""
    below_max = step < max_len
    no_eos = (step < min_len) & below_max
    only_eos = step >= max_len
    if HAS_FORCED:
        forced = tl.load(forced_ptr + row * s_forced)
        no_eos = no_eos | ((step < forced) & below_max)
        only_eos = only_eos | ((step == forced) & below_max)
    return no_eos, only_eos


@triton.jit
def _lane_lists(base, s_lv, V, row_max, log_sum, bad_row, no_eos, only_eos, prev, floor, unkpen, pad, eos, unk,
                C: tl.constexpr, C_PAD: tl.constexpr, LANES: tl.constexpr, FIRST: tl.constexpr):
    """Pass 2: each lane's best C (score desc, token asc) of the row's scores under the rules.
    Empty slots are (-inf, SENTINEL + slot); padding slots past C (+inf, INT32_MAX) are never a
    lane's worst. Chunks with nothing at or above ``floor`` (most of a large vocabulary) leave the
    lists as they are."""
    lanes = tl.arange(0, LANES)
    slot = tl.arange(0, C_PAD)
    zeros2 = tl.zeros((LANES, C_PAD), tl.int32)
    top_v = tl.where(slot[None, :] < C, float("-inf"), float("inf")) + zeros2.to(tl.float32)
    top_i = tl.where(slot[None, :] < C, SENTINEL + slot[None, :], INT32_MAX) + zeros2
    for v0 in range(0, V, LANES):
        cols = v0 + lanes
        in_row = cols < V
        x = tl.load(base + cols * s_lv, mask=in_row, other=float("-inf")).to(tl.float32)
        lp = (x - row_max) - log_sum
        lp = tl.where(cols == unk, lp - unkpen, lp)
        lp = tl.where((cols == pad) | (lp != lp) | bad_row, float("-inf"), lp)
        is_eos = cols == eos
        lp = tl.where((is_eos & no_eos) | ((cols != eos) & only_eos), float("-inf"), lp)
        if not FIRST:
            lp = lp + prev
            lp = tl.where(lp != lp, float("-inf"), lp)  # a NaN running score ranks last (never in a search)
        lp = tl.where(in_row, lp, float("-inf"))
        idx = tl.where(in_row, cols, INT32_MAX)
        maybe = in_row & ((lp >= floor) | (cols == pad) | (cols == unk) | is_eos)
        if tl.max(maybe.to(tl.int32), axis=0) > 0:
            worst = tl.min(top_v, axis=1)
            worst_i = tl.max(tl.where(top_v == worst[:, None], top_i, -1), axis=1)
            take = maybe & ((lp > worst) | ((lp == worst) & (idx < worst_i)))
            hit = (top_i == worst_i[:, None]) & take[:, None]
            top_v = tl.where(hit, lp[:, None], top_v)
            top_i = tl.where(hit, idx[:, None], top_i)
    return tl.where(slot[None, :] < C, top_v, float("-inf")), top_i


@triton.jit
def _write_best(top_v, top_i, out_v, out_i, C: tl.constexpr):
    """The best C of the lanes' lists, best first (score desc, token asc)."""
    for j in tl.static_range(C):
        best = tl.max(tl.max(top_v, axis=1), axis=0)
        best_i = tl.min(tl.min(tl.where(top_v == best, top_i, INT32_MAX), axis=1), axis=0)
        tl.store(out_v + j, best)
        tl.store(out_i + j, best_i)
        taken = top_i == best_i
        top_v = tl.where(taken, float("-inf"), top_v)
        top_i = tl.where(taken, INT32_MAX, top_i)


@triton.jit(do_not_specialize=["step_value"])
def _row_candidates_kernel(
    logits_ptr, prev_ptr, forced_ptr, step_ptr, cand_v_ptr, cand_i_ptr,
    V, beam, step_value, max_len, min_len, unkpen, pad, eos, unk,
    s_ln, s_lv, s_prev, s_forced,
    C: tl.constexpr, C_PAD: tl.constexpr, LANES: tl.constexpr,
    FIRST: tl.constexpr, HAS_FORCED: tl.constexpr, DEVICE_STEP: tl.constexpr,
):
    pid = tl.program_id(0)
    if FIRST:
        row = pid.to(tl.int64) * beam  # step 0: a sentence's first beam only
    else:
        row = pid.to(tl.int64)
    base = logits_ptr + row * s_ln
    row_max, log_sum, bad_row, m_plain = _row_stats(base, s_lv, V, pad, unk, eos, LANES)
    floor_x = _floor_logit(m_plain, C)
    if DEVICE_STEP:
        step = tl.load(step_ptr)
    else:
        step = step_value
    no_eos, only_eos = _eos_rules(step, max_len, min_len, forced_ptr, row, s_forced, HAS_FORCED)
    if FIRST:
        prev = 0.0
    else:
        prev = tl.load(prev_ptr + row * s_prev).to(tl.float32)
    # below the floor's own score (computed as an entry's: the score is monotone in the logit for
    # plain tokens) nothing makes the row's best C; no floor when the row is all -inf or only EOS
    # may end it (the -inf fillers then rank by token)
    floor = (floor_x - row_max) - log_sum
    if not FIRST:
        floor = floor + prev
    floor = tl.where(bad_row | only_eos | (floor != floor), float("-inf"), floor)
    top_v, top_i = _lane_lists(base, s_lv, V, row_max, log_sum, bad_row, no_eos, only_eos, prev, floor, unkpen,
                               pad, eos, unk, C, C_PAD, LANES, FIRST)
    _write_best(top_v, top_i, cand_v_ptr + pid.to(tl.int64) * C_PAD, cand_i_ptr + pid.to(tl.int64) * C_PAD, C)


@triton.jit
def _merge_candidates_kernel(
    cand_v_ptr, cand_i_ptr, ignore_ptr, scores_ptr, tokens_ptr, beams_ptr, eos_ptr,
    V, beam, live, eos, s_ig_b, s_ig_k,
    C: tl.constexpr, C_PAD: tl.constexpr, LIVE_PAD: tl.constexpr, HAS_IGNORE: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    r = tl.arange(0, LIVE_PAD)[:, None]
    j = tl.arange(0, C_PAD)[None, :]
    ok = (r < live) & (j < C)
    at = (b * live + r) * C_PAD + j
    v = tl.load(cand_v_ptr + at, mask=ok, other=float("-inf"))
    tok = tl.load(cand_i_ptr + at, mask=ok, other=SENTINEL)
    # a row's unfilled slots (fewer than C tokens) rank after every real entry of every row
    flat = tl.where(ok & (tok < SENTINEL), r.to(tl.int64) * V + tok, FLAT_NONE)
    v = tl.where(flat == FLAT_NONE, float("-inf"), v)
    for c in tl.static_range(C):
        best = tl.max(tl.max(v, axis=1), axis=0)
        best_flat = tl.min(tl.min(tl.where(v == best, flat, FLAT_NONE), axis=1), axis=0)
        best_flat = tl.where(best_flat == FLAT_NONE, 0, best_flat)  # unreachable (C <= live * V - 1): in bounds
        token = best_flat % V
        ends = (token == eos) & (best != float("-inf"))
        if HAS_IGNORE:
            ignored = tl.load(ignore_ptr + b * s_ig_b + c * s_ig_k, mask=c < beam, other=0)
            ends = ends & (ignored == 0)
        out = b * C + c
        tl.store(scores_ptr + out, best)
        tl.store(tokens_ptr + out, token)
        tl.store(beams_ptr + out, best_flat // V)
        tl.store(eos_ptr + out, ends.to(tl.uint8))
        taken = flat == best_flat
        v = tl.where(taken, float("-inf"), v)
        flat = tl.where(taken, FLAT_NONE, flat)


def _pad(n: int) -> int:
    return max(2, triton.next_power_of_2(n))


def beam_candidates_triton(logits, prev_scores, *, beam, step, max_len, min_len=1, unkpen=0.0, forced_len=None,
                           ignore=None, pad=1, eos=2, unk=3):
    """The ``beam_candidates`` op on the Triton backend (same contract as ``beam_candidates_ref``)."""
    N, V = logits.shape
    B = N // beam
    device = logits.device
    first = is_first_step(step)
    live = 1 if first else beam
    C = min(2 * beam, live * V - 1)
    C_PAD = _pad(C)
    scores = new_empty(B, C, dtype=torch.float32, device=device)
    tokens = torch.empty(B, C, dtype=torch.int64, device=device)
    beams = torch.empty(B, C, dtype=torch.int64, device=device)
    eos_mask = torch.empty(B, C, dtype=torch.bool, device=device)
    if B == 0:
        return BeamCandidates(scores, tokens, beams, eos_mask)
    cand_v = new_empty(B * live, C_PAD, dtype=torch.float32, device=device)
    cand_i = torch.empty(B * live, C_PAD, dtype=torch.int32, device=device)
    on_device = is_device_step(step)
    lanes = min(INTERPRETER_LANES, triton.next_power_of_2(V)) if INTERPRET else GPU_LANES
    prev = logits if first else prev_scores  # not read at step 0
    forced = forced_len if forced_len is not None else logits
    _row_candidates_kernel[(B * live,)](
        logits, prev, forced, step if on_device else logits, cand_v, cand_i,
        V, beam, 0 if on_device else step, max_len, min_len, float(unkpen), pad, eos, unk,
        logits.stride(0), logits.stride(1), 0 if first else prev.stride(0),
        forced_len.stride(0) if forced_len is not None else 0,
        C=C, C_PAD=C_PAD, LANES=lanes, FIRST=first, HAS_FORCED=forced_len is not None, DEVICE_STEP=on_device,
        num_warps=GPU_WARPS,
    )
    ig = ignore.view(torch.uint8) if ignore is not None else eos_mask.view(torch.uint8)
    _merge_candidates_kernel[(B,)](
        cand_v, cand_i, ig, scores, tokens, beams, eos_mask.view(torch.uint8),
        V, beam, live, eos, ig.stride(0) if ignore is not None else 0, ig.stride(1) if ignore is not None else 0,
        C=C, C_PAD=C_PAD, LIVE_PAD=_pad(live), HAS_IGNORE=ignore is not None, num_warps=1,
    )
    return BeamCandidates(scores, tokens, beams, eos_mask)
