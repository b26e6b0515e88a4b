"""The rest of a beam-search step in Triton: one launch, one program per sentence of the batch.

A program reads its sentence's ``C`` candidates and, as ``beam_update_ref`` does:

1. records the EOS candidates among the first ``beam`` (in score order, while the sentence has
   fewer than ``beam`` hypotheses and is not done) into its slots of the finished buffers: the
   parent's tokens and per-token scores, the length-normalised score, the attention;
2. counts them and marks the sentence done (``beam`` hypotheses, or the last step);
3. takes the first ``beam`` candidates that neither end nor are ignored (then the others, in
   order) as the next beams: their parents, tokens and running scores, and the next ``ignore``;
4. moves the prefixes (tokens, running scores, attention) to follow the parents, in place.

The parents of a sentence's rows are rows of the same sentence, so a program owns everything it
reads and writes; a block barrier separates the reads of the sentence's rows from their rewrite.
Only the columns a step has written are touched, with an int step or a step on the device.
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from ..._checks import check_index
from ..device_step import is_device_step

RANK_NONE = tl.constexpr(1 << 30)  # a padding candidate's rank key: after every real one


@triton.jit
def _record_finished(b, k, step, at_max, denom, eos, S,
                     cs_ptr, cb_ptr, ce_ptr, s_cs_b, s_cs_j, s_cb_b, s_cb_j, s_ce_b, s_ce_j,
                     tok_ptr, sc_ptr, attn_ptr, s_tok_n, s_tok_l, s_sc_n, s_sc_l, s_a_n, s_a_s, s_a_l,
                     sid_ptr, s_sid, ft_ptr, fp_ptr, fs_ptr, fl_ptr, fa_ptr, fc_ptr, fd_ptr,
                     s_ft_n, s_ft_l, s_fp_n, s_fp_l, s_fa_n, s_fa_s, s_fa_l,
                     K_PAD: tl.constexpr, BLOCK_L: tl.constexpr, HAS_ATTN: tl.constexpr):
    """Steps 1 and 2: the EOS among the first ``k`` candidates into the sentence's free slots (in
    the candidates' order) with their parents' prefixes; the sentence's count and done flag."""
    jk = tl.arange(0, K_PAD)
    k_ok = jk < k
    sent = tl.load(sid_ptr + b * s_sid)
    done_flag = tl.load(fd_ptr + sent)
    open_ = (done_flag + tl.zeros((K_PAD,), tl.uint8)) == 0  # as a vector: the interpreter's scalar & vector is uint8
    count0 = tl.load(fc_ptr + sent)
    e_score = tl.load(cs_ptr + b * s_cs_b + jk * s_cs_j, mask=k_ok, other=float("-inf")).to(tl.float32)
    e_parent = b * k + tl.load(cb_ptr + b * s_cb_b + jk * s_cb_j, mask=k_ok, other=0)
    ends = tl.load(ce_ptr + b * s_ce_b + jk * s_ce_j, mask=k_ok, other=0) != 0
    before = tl.sum(tl.where(jk[None, :] <= jk[:, None], ends.to(tl.int64)[None, :], 0), axis=1)
    slot = count0 + before - 1
    keep = ends & (slot < k) & open_
    dest = sent * k + slot
    for l0 in range(0, step + 1, BLOCK_L):
        cols = l0 + tl.arange(0, BLOCK_L)
        upto = keep[:, None] & (cols <= step)[None, :]
        prefix = keep[:, None] & (cols < step)[None, :]
        t = tl.load(tok_ptr + e_parent[:, None] * s_tok_n + (cols[None, :] + 1) * s_tok_l, mask=prefix, other=eos)
        tl.store(ft_ptr + dest[:, None] * s_ft_n + cols[None, :] * s_ft_l, t, mask=upto)
        cur = tl.load(sc_ptr + e_parent[:, None] * s_sc_n + cols[None, :] * s_sc_l, mask=prefix, other=0.0)
        cur = tl.where((cols == step)[None, :], e_score[:, None], cur)
        prv = tl.load(sc_ptr + e_parent[:, None] * s_sc_n + (cols[None, :] - 1) * s_sc_l,
                      mask=keep[:, None] & ((cols >= 1) & (cols <= step))[None, :], other=0.0)
        pos = tl.where((cols >= 1)[None, :], cur - prv, cur)
        tl.store(fp_ptr + dest[:, None] * s_fp_n + cols[None, :] * s_fp_l, pos, mask=upto)
        if HAS_ATTN:
            for s in range(0, S):
                a = tl.load(attn_ptr + e_parent[:, None] * s_a_n + s * s_a_s + (cols[None, :] + 1) * s_a_l,
                            mask=upto)
                tl.store(fa_ptr + dest[:, None] * s_fa_n + s * s_fa_s + cols[None, :] * s_fa_l, a, mask=upto)
    tl.store(fs_ptr + dest, tl.math.div_rn(e_score, denom), mask=keep)
    tl.store(fl_ptr + dest, (step + 1).to(tl.int64) + tl.zeros((K_PAD,), tl.int64), mask=keep)
    count = count0 + tl.sum(keep.to(tl.int64), axis=0)
    tl.store(fc_ptr + sent, count)
    tl.store(fd_ptr + sent, ((done_flag != 0) | (count >= k) | at_max).to(tl.uint8))


@triton.jit
def _next_beams(b, k, C, cs_ptr, ct_ptr, cb_ptr, ce_ptr, ig_ptr, par_ptr, nig_ptr,
                s_cs_b, s_cs_j, s_ct_b, s_ct_j, s_cb_b, s_cb_j, s_ce_b, s_ce_j, s_ig_b, s_ig_k,
                K_PAD: tl.constexpr, C_PAD: tl.constexpr):
    """Step 3: the first ``k`` candidates that neither end nor are ignored (then the others), in
    score order: their parents and the next ignore mask stored; their tokens, scores and parents."""
    jc = tl.arange(0, C_PAD)
    c_ok = jc < C
    cs = tl.load(cs_ptr + b * s_cs_b + jc * s_cs_j, mask=c_ok, other=float("-inf")).to(tl.float32)
    ct = tl.load(ct_ptr + b * s_ct_b + jc * s_ct_j, mask=c_ok, other=0)
    cb = tl.load(cb_ptr + b * s_cb_b + jc * s_cb_j, mask=c_ok, other=0)
    ce = tl.load(ce_ptr + b * s_ce_b + jc * s_ce_j, mask=c_ok, other=0) != 0
    ig = tl.load(ig_ptr + b * s_ig_b + jc * s_ig_k, mask=jc < k, other=0) != 0
    blocked = ce | ig
    key = tl.where(c_ok, blocked.to(tl.int32) * C_PAD + jc, RANK_NONE)
    rank = tl.sum((key[None, :] < key[:, None]).to(tl.int32), axis=1)
    jk = tl.arange(0, K_PAD)
    k_ok = jk < k
    pick = (rank[None, :] == jk[:, None]) & c_ok[None, :]  # (K_PAD, C_PAD): new beam r <- candidate
    new_tok = tl.sum(tl.where(pick, ct[None, :], 0), axis=1)
    new_score = tl.sum(tl.where(pick, cs[None, :], 0.0), axis=1)  # one pick a row: -inf and NaN kept as they are
    new_parent = b * k + tl.sum(tl.where(pick, cb[None, :], 0), axis=1)
    new_blocked = tl.sum(tl.where(pick, blocked.to(tl.int32)[None, :], 0), axis=1) > 0
    tl.store(par_ptr + b * k + jk, new_parent, mask=k_ok)
    tl.store(nig_ptr + b * k + jk, new_blocked.to(tl.uint8), mask=k_ok)
    return new_tok, new_score, new_parent


@triton.jit
def _follow_parents(b, k, step, S, new_tok, new_score, new_parent, tok_ptr, sc_ptr, attn_ptr,
                    s_tok_n, s_tok_l, s_sc_n, s_sc_l, s_a_n, s_a_s, s_a_l,
                    K_PAD: tl.constexpr, BLOCK_L: tl.constexpr, HAS_ATTN: tl.constexpr):
    """Step 4: the prefixes (tokens, running scores, attention) gathered by parent in place, each
    chunk read whole before it is written; then the new token and running score appended."""
    jk = tl.arange(0, K_PAD)
    k_ok = jk < k
    rows = b * k + jk
    for l0 in range(0, step + 2, BLOCK_L):
        cols = l0 + tl.arange(0, BLOCK_L)
        t_ok = k_ok[:, None] & (cols <= step)[None, :]
        s_ok = k_ok[:, None] & (cols < step)[None, :]
        t = tl.load(tok_ptr + new_parent[:, None] * s_tok_n + cols[None, :] * s_tok_l, mask=t_ok)
        sv = tl.load(sc_ptr + new_parent[:, None] * s_sc_n + cols[None, :] * s_sc_l, mask=s_ok)
        tl.debug_barrier()
        tl.store(tok_ptr + rows[:, None] * s_tok_n + cols[None, :] * s_tok_l, t, mask=t_ok)
        tl.store(sc_ptr + rows[:, None] * s_sc_n + cols[None, :] * s_sc_l, sv, mask=s_ok)
        if HAS_ATTN:
            a_ok = k_ok[:, None] & (cols <= step + 1)[None, :]
            for s in range(0, S):
                a = tl.load(attn_ptr + new_parent[:, None] * s_a_n + s * s_a_s + cols[None, :] * s_a_l, mask=a_ok)
                tl.debug_barrier()
                tl.store(attn_ptr + rows[:, None] * s_a_n + s * s_a_s + cols[None, :] * s_a_l, a, mask=a_ok)
    tl.store(tok_ptr + rows * s_tok_n + (step + 1) * s_tok_l, new_tok, mask=k_ok)
    tl.store(sc_ptr + rows * s_sc_n + step * s_sc_l, new_score, mask=k_ok)


@triton.jit(do_not_specialize=["step_value", "at_max_value"])  # a 1 would become a constant
def _beam_update_kernel(
    cs_ptr, ct_ptr, cb_ptr, ce_ptr, tok_ptr, sc_ptr, attn_ptr, ig_ptr, sid_ptr,
    ft_ptr, fp_ptr, fs_ptr, fl_ptr, fa_ptr, fc_ptr, fd_ptr, par_ptr, nig_ptr, step_ptr, at_max_ptr,
    step_value, at_max_value, denom_value, lenpen_hi, lenpen_lo, last_step, S, k, C, eos,
    s_cs_b, s_cs_j, s_ct_b, s_ct_j, s_cb_b, s_cb_j, s_ce_b, s_ce_j,
    s_tok_n, s_tok_l, s_sc_n, s_sc_l, s_a_n, s_a_s, s_a_l, s_ig_b, s_ig_k, s_sid,
    s_ft_n, s_ft_l, s_fp_n, s_fp_l, s_fa_n, s_fa_s, s_fa_l,
    K_PAD: tl.constexpr, C_PAD: tl.constexpr, BLOCK_L: tl.constexpr,
    HAS_ATTN: tl.constexpr, DEVICE_STEP: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    if DEVICE_STEP:
        # a replay past the buffers' last step repeats its columns rather than write past them
        step = tl.minimum(tl.load(step_ptr), last_step)
        at_max = tl.load(at_max_ptr) != 0
        # (step + 1) ** lenpen in double, then fp32, as the reference's tensor step computes it
        lenpen = tl.cast(lenpen_hi, tl.float64) + tl.cast(lenpen_lo, tl.float64)  # fp32 arguments: the double in two parts
        denom = tl.exp(lenpen * tl.log((step + 1).to(tl.float64))).to(tl.float32)
    else:
        step = step_value
        at_max = at_max_value != 0
        denom = denom_value
    _record_finished(b, k, step, at_max, denom, eos, S, cs_ptr, cb_ptr, ce_ptr, s_cs_b, s_cs_j, s_cb_b, s_cb_j,
                     s_ce_b, s_ce_j, tok_ptr, sc_ptr, attn_ptr, s_tok_n, s_tok_l, s_sc_n, s_sc_l, s_a_n, s_a_s, s_a_l,
                     sid_ptr, s_sid, ft_ptr, fp_ptr, fs_ptr, fl_ptr, fa_ptr, fc_ptr, fd_ptr,
                     s_ft_n, s_ft_l, s_fp_n, s_fp_l, s_fa_n, s_fa_s, s_fa_l, K_PAD, BLOCK_L, HAS_ATTN)
    new_tok, new_score, new_parent = _next_beams(b, k, C, cs_ptr, ct_ptr, cb_ptr, ce_ptr, ig_ptr, par_ptr, nig_ptr,
                                                 s_cs_b, s_cs_j, s_ct_b, s_ct_j, s_cb_b, s_cb_j, s_ce_b, s_ce_j,
                                                 s_ig_b, s_ig_k, K_PAD, C_PAD)
    tl.debug_barrier()  # the finished records read the rows the prefixes now overwrite
    _follow_parents(b, k, step, S, new_tok, new_score, new_parent, tok_ptr, sc_ptr, attn_ptr,
                    s_tok_n, s_tok_l, s_sc_n, s_sc_l, s_a_n, s_a_s, s_a_l, K_PAD, BLOCK_L, HAS_ATTN)


def _two_floats(x: float):
    """``x`` as fp32 ``hi + lo`` (a kernel's float arguments are fp32): within 2**-48 of the double."""
    hi = float(np.float32(x))
    return hi, float(np.float32(x - hi))


def _pad(n: int) -> int:
    return max(2, triton.next_power_of_2(n))


def beam_update_triton(cands, step, tokens, scores, ignore, sent_ids, finished, *, lenpen=1.0, at_max_len=False,
                       attn=None, eos=2):
    """The ``beam_update`` op on the Triton backend (same contract as ``beam_update_ref``)."""
    B, k = ignore.shape
    C = cands.scores.shape[1]
    device = tokens.device
    parents = torch.empty(B * k, dtype=torch.int64, device=device)
    new_ignore = torch.empty(B, k, dtype=torch.bool, device=device)
    if B == 0:
        return parents, new_ignore
    on_device = is_device_step(step)
    f = finished
    # the rows the kernel reads and writes by index: checked on a CPU (the interpreter), as the ops'
    # index inputs are (a check on a GPU would wait for it)
    check_index("cands.beams", cands.beams.reshape(-1), B * C, device, low=0, high=k - 1)
    check_index("sent_ids", sent_ids, B, device, low=0, high=f.count.shape[0] - 1)
    fa = f.attn if attn is not None else scores
    a = attn if attn is not None else scores
    a_strides = (a.stride(0), a.stride(1), a.stride(2)) if attn is not None else (0, 0, 0)
    fa_strides = (fa.stride(0), fa.stride(1), fa.stride(2)) if attn is not None else (0, 0, 0)
    _beam_update_kernel[(B,)](
        cands.scores, cands.tokens, cands.beams, cands.eos_mask.view(torch.uint8), tokens, scores, a,
        ignore.view(torch.uint8), sent_ids,
        f.tokens, f.pos_scores, f.scores, f.lengths, fa, f.count, f.done.view(torch.uint8),
        parents, new_ignore.view(torch.uint8),
        step if on_device else parents, at_max_len.view(torch.uint8) if on_device else parents,
        0 if on_device else step, 0 if on_device else int(bool(at_max_len)),
        1.0 if on_device else float((step + 1) ** lenpen), *_two_floats(lenpen), scores.shape[1] - 1,
        attn.shape[1] if attn is not None else 0, k, C, eos,
        *cands.scores.stride(), *cands.tokens.stride(), *cands.beams.stride(), *cands.eos_mask.stride(),
        *tokens.stride(), *scores.stride(), *a_strides, *ignore.stride(), sent_ids.stride(0),
        *f.tokens.stride(), *f.pos_scores.stride(), *fa_strides,
        K_PAD=_pad(k), C_PAD=_pad(C), BLOCK_L=32, HAS_ATTN=attn is not None, DEVICE_STEP=on_device,
        num_warps=4,
    )
    return parents, new_ignore
