"""One decoding step of a folded attention layer in Triton: one launch per layer.

Each program owns ``BLOCK_R`` rows of one sentence (its beams) and ``BLOCK_C`` output channels.
It walks the sentence's valid source steps in ``BLOCK_S`` tiles with an online softmax (running
max and sum in fp32): the scores ``sqrt(1/2) (h . z_in + g . z + z . b_in)`` (``h . z_in`` over
the channels in ``BLOCK_K`` chunks), then ``p . y_out`` for its channel tile. The epilogue adds
``sqrt(s)``, the output bias, the layer's input and, where the layer has one, its residual, with
their ``sqrt(1/2)`` factors. A sentence's ``z_in`` and ``y_out`` are read once for all its beams.
With ``need_attn`` the programs of the first channel tile write the normalised probabilities in
a second pass over the source (zeros at padding).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...triton_common.config import acc_type, bucket, configs, dot_precision, new_empty
from ...triton_common.fits import prune_by_report
from ..attention_embsum.triton_kernels import _scores, _softmax_tile, _valid_source_range  # the attention's tiles

_CONFIGS = configs(
    gpu=[
        # a step has a few beams per sentence: one row tile of 16; the channel tile sets the parallelism.
        # Checked by `python3 -m convs2s_kernels.gpu_check` (fp32 IEEE on sm_80 spills in the first).
        dict(BLOCK_R=16, BLOCK_S=64, BLOCK_C=128, BLOCK_K=64, num_warps=4, num_stages=2),
        dict(BLOCK_R=16, BLOCK_S=32, BLOCK_C=256, BLOCK_K=64, num_warps=4, num_stages=2),
        dict(BLOCK_R=16, BLOCK_S=32, BLOCK_C=64, BLOCK_K=32, num_warps=4, num_stages=2),  # fits everywhere
    ],
    interpreter=dict(BLOCK_R=16, BLOCK_S=16, BLOCK_C=32, BLOCK_K=32),
)

SQRT_HALF = tl.constexpr(0.7071067811865476)  # a global a kernel reads must be a constexpr


@triton.jit
def _step_scores(h_ptr, z_ptr, emb_ptr, zb_ptr, b, rs, ss, R, S, C,
                 sh_b, sh_r, sh_c, sz_b, sz_s, sz_c, se_b, se_r, se_s, sb_b, sb_s,
                 ACC: tl.constexpr, PRECISION: tl.constexpr,
                 BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_K: tl.constexpr):
    """``sqrt(1/2) (h[b, rs] . z_in[b, ss] + emb[b, rs, ss] + z_bias[b, ss])``."""
    acc = _scores(h_ptr, z_ptr, b, rs, ss, R, S, C, sh_b, sh_r, sh_c, sz_b, sz_s, sz_c,
                  ACC, PRECISION, BLOCK_R, BLOCK_S, BLOCK_K)
    s_ok = ss < S
    emb = tl.load(emb_ptr + b * se_b + rs[:, None] * se_r + ss[None, :] * se_s,
                  mask=(rs < R)[:, None] & s_ok[None, :], other=0.0).to(ACC)
    zb = tl.load(zb_ptr + b * sb_b + ss * sb_s, mask=s_ok, other=0.0).to(ACC)
    return (acc + emb + zb[None, :]) * SQRT_HALF


@triton.autotune(configs=_CONFIGS, key=["S_BUCKET", "C"],
                 prune_configs_by=prune_by_report("attention_step/_attention_step_kernel"))
@triton.jit
def _attention_step_kernel(
    h_ptr, emb_ptr, zb_ptr, z_ptr, y_ptr, bo_ptr, len_ptr, res_ptr, out_ptr, attn_ptr,
    R, S, C, S_BUCKET,
    sh_b, sh_r, sh_c, se_b, se_r, se_s, sb_b, sb_s, sz_b, sz_s, sz_c, sy_b, sy_s, sy_c, sr_b, sr_r, sr_c,
    LEFT_PAD: tl.constexpr, HAS_RES: tl.constexpr, NEED_ATTN: tl.constexpr,
    ACC: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid_c = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    rs = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    cs = (pid_c * BLOCK_C + tl.arange(0, BLOCK_C)).to(tl.int64)
    r_ok = rs < R
    c_ok = cs < C
    lo, hi, length = _valid_source_range(len_ptr, b, S, LEFT_PAD)
    m_i = tl.full((BLOCK_R,), float("-inf"), dtype=ACC)
    l_i = tl.zeros((BLOCK_R,), dtype=ACC)
    acc = tl.zeros((BLOCK_R, BLOCK_C), dtype=ACC)
    # the first tile holds step lo, which is valid (length >= 1): the running max is finite from it on
    for s0 in range((lo // BLOCK_S) * BLOCK_S, hi, BLOCK_S):
        ss = (s0 + tl.arange(0, BLOCK_S)).to(tl.int64)
        valid = (ss >= lo) & (ss < hi)
        sc = _step_scores(h_ptr, z_ptr, emb_ptr, zb_ptr, b, rs, ss, R, S, C,
                          sh_b, sh_r, sh_c, sz_b, sz_s, sz_c, se_b, se_r, se_s, sb_b, sb_s,
                          ACC, PRECISION, BLOCK_R, BLOCK_S, BLOCK_K)
        p, alpha, m_i, l_i = _softmax_tile(sc, valid, m_i, l_i)
        yv = tl.load(y_ptr + b * sy_b + ss[:, None] * sy_s + cs[None, :] * sy_c,
                     mask=valid[:, None] & c_ok[None, :], other=0.0)
        acc = tl.dot(p.to(yv.dtype), yv, acc * alpha[:, None], input_precision=PRECISION, out_dtype=ACC)
    ok = r_ok[:, None] & c_ok[None, :]
    hv = tl.load(h_ptr + b * sh_b + rs[:, None] * sh_r + cs[None, :] * sh_c, mask=ok, other=0.0).to(ACC)
    bo = tl.load(bo_ptr + cs, mask=c_ok, other=0.0).to(ACC)
    out = (acc / l_i[:, None] * tl.sqrt(length.to(ACC)) + bo[None, :] + hv) * SQRT_HALF
    if HAS_RES:
        res = tl.load(res_ptr + b * sr_b + rs[:, None] * sr_r + cs[None, :] * sr_c, mask=ok, other=0.0).to(ACC)
        out = (out + res) * SQRT_HALF
    tl.store(out_ptr + (b * R + rs[:, None]) * C + cs[None, :], out.to(out_ptr.dtype.element_ty), mask=ok)
    if NEED_ATTN:
        if pid_c == 0:  # every channel tile has the same statistics; the first writes the probabilities
            lse = m_i + tl.log(l_i)
            for a0 in range(0, S, BLOCK_S):  # the whole row: zeros at padding
                ss = (a0 + tl.arange(0, BLOCK_S)).to(tl.int64)
                valid = (ss >= lo) & (ss < hi)
                sc = _step_scores(h_ptr, z_ptr, emb_ptr, zb_ptr, b, rs, ss, R, S, C,
                                  sh_b, sh_r, sh_c, sz_b, sz_s, sz_c, se_b, se_r, se_s, sb_b, sb_s,
                                  ACC, PRECISION, BLOCK_R, BLOCK_S, BLOCK_K)
                p = tl.where(valid[None, :], tl.exp(sc - lse[:, None]), 0.0)
                tl.store(attn_ptr + (b * R + rs[:, None]) * S + ss[None, :], p.to(attn_ptr.dtype.element_ty),
                         mask=r_ok[:, None] & (ss < S)[None, :])


def attention_step_triton(h, emb_scores, z_bias, z_in, y_out, b_out, src_lengths, residual=None, *,
                          left_pad=True, need_attn=False):
    """The ``attention_step`` op on the Triton backend (same contract as ``attention_step_ref``)."""
    B, R, C = h.shape
    S = z_in.shape[1]
    out = new_empty(B, R, C, dtype=h.dtype, device=h.device)
    attn = new_empty(B, R, S, dtype=h.dtype, device=h.device) if need_attn else None
    if B * R == 0:
        return out, attn
    res = residual if residual is not None else h
    grid = lambda meta: (triton.cdiv(R, meta["BLOCK_R"]), triton.cdiv(C, meta["BLOCK_C"]), B)
    _attention_step_kernel[grid](
        h, emb_scores, z_bias, z_in, y_out, b_out, src_lengths, res, out, attn if need_attn else out,
        R, S, C, bucket(S),
        *h.stride(), *emb_scores.stride(), *z_bias.stride(), *z_in.stride(), *y_out.stride(), *res.stride(),
        LEFT_PAD=left_pad, HAS_RES=residual is not None, NEED_ATTN=need_attn,
        ACC=acc_type(h.dtype), PRECISION=dot_precision(h.dtype),
    )
    return out, attn
