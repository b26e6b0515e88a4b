"""Attention with the embedding sum in Triton, forward and backward.

Forward (``_attention_fwd_kernel``) is flash-attention style: each program owns ``BLOCK_T``
queries of one sentence and ``BLOCK_E`` output channels, walks the source in ``BLOCK_S`` tiles
with an online softmax (running max and sum in fp32), reading keys ``z`` and values ``y`` tile
by tile; only the valid source range ``[S - s, S)`` (left padding) or ``[0, s)`` is visited.
The embedding dimension (256-768 in the paper's models) is tiled twice: ``BLOCK_D`` chunks for
the score reduction, ``BLOCK_E`` for the output. It writes the context scaled by ``sqrt(s)``
and the log-sum-exp of every query; ``_attention_probs_kernel`` recomputes the attention
probabilities from it when they are asked for (alignment).

Backward, where a sentence's queries and sources are at most 64 each (32 with IEEE fp32 products;
the paper's training batches: 25 tokens): ``_attention_bwd_fused_kernel``, one program per sentence, holds its
``T x S`` probabilities ``P`` (recomputed from the log-sum-exp) and ``dS = P * (dP - D)`` in
registers, ``D = dc . c`` summed on the way, then walks the embedding once more for
``dq = dS z``, ``dz = dS^T q`` and ``dy = sqrt(s) P^T dc``: one launch instead of ten, no
``T x S`` tensor in memory. Longer ones: ``_attention_bwd_ds_kernel`` writes ``P`` and ``dS``
per tile, and the three products run as one small batched GEMM kernel (``_bmm_kernel``) each.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...triton_common.config import acc_type, bucket, configs, dot_precision, new_empty
from ...triton_common.fits import prune_by_report

# Checked by `python3 -m convs2s_kernels.gpu_check` for sm_80 and sm_90 (shared memory, spills,
# compile time); the autotuners drop, per device and dtype, the configs its report says break the
# rule there (convs2s_kernels/triton_common/fits.py).
_FWD_CONFIGS = configs(
    gpu=[
        dict(BLOCK_T=64, BLOCK_S=64, BLOCK_E=128, BLOCK_D=64, num_warps=8, num_stages=2),  # w4 spilled in fp32
        dict(BLOCK_T=32, BLOCK_S=32, BLOCK_E=256, BLOCK_D=64, num_warps=4, num_stages=2),
        dict(BLOCK_T=16, BLOCK_S=64, BLOCK_E=128, BLOCK_D=64, num_warps=4, num_stages=2),  # decoding: T = 1
        dict(BLOCK_T=64, BLOCK_S=32, BLOCK_E=64, BLOCK_D=32, num_warps=4, num_stages=3),  # D = 64 spilled on sm_80
    ],
    interpreter=dict(BLOCK_T=16, BLOCK_S=16, BLOCK_E=64, BLOCK_D=64),
)
_TILE_CONFIGS = configs(
    gpu=[
        dict(BLOCK_T=64, BLOCK_S=64, BLOCK_D=64, num_warps=8, num_stages=2),  # w4 spilled in fp32 on sm_80
        dict(BLOCK_T=32, BLOCK_S=32, BLOCK_D=64, num_warps=4, num_stages=3),
        dict(BLOCK_T=16, BLOCK_S=64, BLOCK_D=32, num_warps=4, num_stages=2),  # D = 64 spilled (dS, fp32, sm_90)
    ],
    interpreter=dict(BLOCK_T=16, BLOCK_S=16, BLOCK_D=64),
)
# the fused backward: the whole sentence's T x S tile, embedding chunks of BLOCK_D


def fused_max(dtype: torch.dtype) -> int:
    """The longest queries and sources the one-launch backward takes: 64 on tensor cores, 32 with
    IEEE fp32 products (an FMA loop: every config spilled at 64 x 64 on sm_80 and sm_90)."""
    return 32 if dtype in (torch.float32, torch.float64) and dot_precision(dtype) == "ieee" else 64


_FUSED_CONFIGS = configs(
    gpu=[dict(BLOCK_D=64, num_warps=4, num_stages=2), dict(BLOCK_D=32, num_warps=4, num_stages=2),
         dict(BLOCK_D=64, num_warps=8, num_stages=2)],
    interpreter=dict(BLOCK_D=64),
)
_BMM_CONFIGS = configs(
    gpu=[  # 4 warps spilled in fp32 (IEEE or TF32, depending on the transposes)
        dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, num_warps=8, num_stages=3),
        dict(BLOCK_M=32, BLOCK_N=128, BLOCK_K=32, num_warps=8, num_stages=3),
        dict(BLOCK_M=16, BLOCK_N=128, BLOCK_K=32, num_warps=8, num_stages=2),
    ],
    interpreter=dict(BLOCK_M=32, BLOCK_N=64, BLOCK_K=32),
)


@triton.jit
def _valid_source_range(len_ptr, b, S, LEFT_PAD: tl.constexpr):
    """[lo, hi) of the unpadded source steps of sentence ``b``, and its length."""
    length = tl.load(len_ptr + b).to(tl.int64)
    if LEFT_PAD:
        lo = S - length
        hi = lo + length
    else:
        lo = length - length
        hi = length
    return lo, hi, length


@triton.jit
def _scores(q_ptr, z_ptr, b, ts, ss, T, S, E, sq_b, sq_t, sq_e, sz_b, sz_s, sz_e,
            ACC: tl.constexpr, PRECISION: tl.constexpr,
            BLOCK_T: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    """``q[b, ts] . z[b, ss]`` over the whole embedding, in ``BLOCK_D`` chunks."""
    acc = tl.zeros((BLOCK_T, BLOCK_S), dtype=ACC)
    t_ok = ts < T
    s_ok = ss < S
    for d0 in range(0, E, BLOCK_D):
        ds = d0 + tl.arange(0, BLOCK_D)
        d_ok = ds < E
        qd = tl.load(q_ptr + b * sq_b + ts[:, None] * sq_t + ds[None, :] * sq_e,
                     mask=t_ok[:, None] & d_ok[None, :], other=0.0)
        zd = tl.load(z_ptr + b * sz_b + ds[:, None] * sz_e + ss[None, :] * sz_s,
                     mask=d_ok[:, None] & s_ok[None, :], other=0.0)
        acc = tl.dot(qd, zd, acc, input_precision=PRECISION, out_dtype=ACC)
    return acc


@triton.jit
def _softmax_tile(sc, valid, m_i, l_i):
    """One source tile of an online softmax (its scores ``sc``, padding where not ``valid``) ->
    ``(p, alpha, m, l)``: ``exp(sc - m)``, the factor earlier sums scale by, the running max and sum."""
    sc = tl.where(valid[None, :], sc, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(sc, axis=1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(sc - m_new[:, None])
    return p, alpha, m_new, l_i * alpha + tl.sum(p, axis=1)


@triton.jit
def _probabilities(q_ptr, z_ptr, len_ptr, lse_ptr, b, ts, ss, T, S, E,
                   sq_b, sq_t, sq_e, sz_b, sz_s, sz_e, LEFT_PAD: tl.constexpr,
                   ACC: tl.constexpr, PRECISION: tl.constexpr,
                   BLOCK_T: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    """Attention probabilities of queries ``ts`` over sources ``ss``, recomputed from the saved
    log-sum-exp (zero at padding), and the sentence's source length."""
    lo, hi, length = _valid_source_range(len_ptr, b, S, LEFT_PAD)
    valid = (ss >= lo) & (ss < hi)
    sc = _scores(q_ptr, z_ptr, b, ts, ss, T, S, E, sq_b, sq_t, sq_e, sz_b, sz_s, sz_e,
                 ACC, PRECISION, BLOCK_T, BLOCK_S, BLOCK_D)
    lse = tl.load(lse_ptr + b * T + ts, mask=ts < T, other=0.0)
    return tl.where(valid[None, :], tl.exp(sc - lse[:, None]), 0.0), length


@triton.autotune(configs=_FWD_CONFIGS, key=["S_BUCKET", "E"],
                 prune_configs_by=prune_by_report("attention_embsum/_attention_fwd_kernel"))
@triton.jit
def _attention_fwd_kernel(
    q_ptr, z_ptr, y_ptr, len_ptr, out_ptr, lse_ptr,
    T, S, E, S_BUCKET,
    sq_b, sq_t, sq_e, sz_b, sz_s, sz_e, sy_b, sy_s, sy_e, so_b, so_t, so_e,
    LEFT_PAD: tl.constexpr, ACC: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_D: tl.constexpr,
):
    pid_t = tl.program_id(0)
    pid_e = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    ts = (pid_t * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    es = (pid_e * BLOCK_E + tl.arange(0, BLOCK_E)).to(tl.int64)
    t_ok = ts < T
    e_ok = es < E
    lo, hi, length = _valid_source_range(len_ptr, b, S, LEFT_PAD)

    m_i = tl.full((BLOCK_T,), float("-inf"), dtype=ACC)
    l_i = tl.zeros((BLOCK_T,), dtype=ACC)
    acc = tl.zeros((BLOCK_T, BLOCK_E), dtype=ACC)
    # The first tile visited holds step lo, which is valid (s >= 1), so the running max is finite
    # from the first tile on and fully padded tiles are never visited.
    for s0 in range((lo // BLOCK_S) * BLOCK_S, hi, BLOCK_S):
        ss = (s0 + tl.arange(0, BLOCK_S)).to(tl.int64)
        valid = (ss >= lo) & (ss < hi)
        sc = _scores(q_ptr, z_ptr, b, ts, ss, T, S, E, sq_b, sq_t, sq_e, sz_b, sz_s, sz_e,
                     ACC, PRECISION, BLOCK_T, BLOCK_S, BLOCK_D)
        p, alpha, m_i, l_i = _softmax_tile(sc, valid, m_i, l_i)
        yv = tl.load(y_ptr + b * sy_b + ss[:, None] * sy_s + es[None, :] * sy_e,
                     mask=valid[:, None] & e_ok[None, :], other=0.0)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(yv.dtype), yv, acc, input_precision=PRECISION, out_dtype=ACC)
    ctx = acc / l_i[:, None] * tl.sqrt(length.to(ACC))
    tl.store(out_ptr + b * so_b + ts[:, None] * so_t + es[None, :] * so_e, ctx.to(out_ptr.dtype.element_ty),
             mask=t_ok[:, None] & e_ok[None, :])
    # every E tile computes the same statistics; the first one records them
    if pid_e == 0:
        tl.store(lse_ptr + b * T + ts, m_i + tl.log(l_i), mask=t_ok)


@triton.autotune(configs=_TILE_CONFIGS, key=["S_BUCKET", "E"],
                 prune_configs_by=prune_by_report("attention_embsum/_attention_probs_kernel"))
@triton.jit
def _attention_probs_kernel(
    q_ptr, z_ptr, len_ptr, lse_ptr, attn_ptr,
    T, S, E, S_BUCKET,
    sq_b, sq_t, sq_e, sz_b, sz_s, sz_e,
    LEFT_PAD: tl.constexpr, ACC: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """Attention probabilities ``exp(q.z - lse)`` (zero at padding), written ``(B, T, S)``."""
    b = tl.program_id(2).to(tl.int64)
    ts = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    ss = (tl.program_id(1) * BLOCK_S + tl.arange(0, BLOCK_S)).to(tl.int64)
    t_ok = ts < T
    p, _ = _probabilities(q_ptr, z_ptr, len_ptr, lse_ptr, b, ts, ss, T, S, E,
                               sq_b, sq_t, sq_e, sz_b, sz_s, sz_e, LEFT_PAD, ACC, PRECISION,
                               BLOCK_T, BLOCK_S, BLOCK_D)
    tl.store(attn_ptr + (b * T + ts[:, None]) * S + ss[None, :], p.to(attn_ptr.dtype.element_ty),
             mask=t_ok[:, None] & (ss < S)[None, :])


@triton.autotune(configs=_TILE_CONFIGS, key=["S_BUCKET", "E"],
                 prune_configs_by=prune_by_report("attention_embsum/_attention_bwd_ds_kernel"))
@triton.jit
def _attention_bwd_ds_kernel(
    q_ptr, z_ptr, y_ptr, len_ptr, lse_ptr, delta_ptr, dctx_ptr, dattn_ptr, p_ptr, ds_ptr,
    T, S, E, S_BUCKET,
    sq_b, sq_t, sq_e, sz_b, sz_s, sz_e, sy_b, sy_s, sy_e, sd_b, sd_t, sd_e,
    LEFT_PAD: tl.constexpr, HAS_DATTN: tl.constexpr,
    ACC: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """``P`` and ``dS = P * (sqrt(s) dc . y - D [+ dA])`` of one (query tile, source tile)."""
    b = tl.program_id(2).to(tl.int64)
    ts = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    ss = (tl.program_id(1) * BLOCK_S + tl.arange(0, BLOCK_S)).to(tl.int64)
    t_ok = ts < T
    s_ok = ss < S
    p, length = _probabilities(q_ptr, z_ptr, len_ptr, lse_ptr, b, ts, ss, T, S, E,
                               sq_b, sq_t, sq_e, sz_b, sz_s, sz_e, LEFT_PAD, ACC, PRECISION,
                               BLOCK_T, BLOCK_S, BLOCK_D)
    # dP = dc . y over the embedding (the sqrt(s) factor is applied once below)
    dp = _scores(dctx_ptr, y_ptr, b, ts, ss, T, S, E, sd_b, sd_t, sd_e, sy_b, sy_s, sy_e,
                 ACC, PRECISION, BLOCK_T, BLOCK_S, BLOCK_D)
    delta = tl.load(delta_ptr + b * T + ts, mask=t_ok, other=0.0)
    grad_p = dp * tl.sqrt(length.to(ACC)) - delta[:, None]
    tile = (b * T + ts[:, None]) * S + ss[None, :]
    ok = t_ok[:, None] & s_ok[None, :]
    if HAS_DATTN:
        grad_p += tl.load(dattn_ptr + tile, mask=ok, other=0.0).to(ACC)
    tl.store(p_ptr + tile, p.to(p_ptr.dtype.element_ty), mask=ok)
    tl.store(ds_ptr + tile, (p * grad_p).to(ds_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _row_dot(a_ptr, c_ptr, b, ts, T, E, sa_b, sa_t, sa_e, sc_b, sc_t, sc_e,
             ACC: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    """``sum_e a[b, t, e] c[b, t, e]`` for the queries ``ts``."""
    acc = tl.zeros((BLOCK_T,), dtype=ACC)
    t_ok = ts < T
    for d0 in range(0, E, BLOCK_D):
        ds = d0 + tl.arange(0, BLOCK_D)
        ok = t_ok[:, None] & (ds < E)[None, :]
        a = tl.load(a_ptr + b * sa_b + ts[:, None] * sa_t + ds[None, :] * sa_e, mask=ok, other=0.0)
        c = tl.load(c_ptr + b * sc_b + ts[:, None] * sc_t + ds[None, :] * sc_e, mask=ok, other=0.0)
        acc += tl.sum(a.to(ACC) * c.to(ACC), axis=1)
    return acc


@triton.jit
def _fused_store(dst_ptr, b, rows, n_rows, cols, E, sd_b, sd_r, sd_e, val):
    ok = (rows < n_rows)[:, None] & (cols < E)[None, :]
    tl.store(dst_ptr + b * sd_b + rows[:, None] * sd_r + cols[None, :] * sd_e, val.to(dst_ptr.dtype.element_ty), mask=ok)


@triton.autotune(configs=_FUSED_CONFIGS, key=["BLOCK_T", "BLOCK_S", "E"],
                 prune_configs_by=prune_by_report("attention_embsum/_attention_bwd_fused_kernel"))
@triton.jit
def _attention_bwd_fused_kernel(
    q_ptr, z_ptr, y_ptr, len_ptr, lse_ptr, c_ptr, dctx_ptr, dattn_ptr, dq_ptr, dz_ptr, dy_ptr,
    T, S, E,
    sq_b, sq_t, sq_e, sz_b, sz_s, sz_e, sy_b, sy_s, sy_e, sc_b, sc_t, sc_e, sd_b, sd_t, sd_e,
    LEFT_PAD: tl.constexpr, HAS_DATTN: tl.constexpr, NEED_DQ: tl.constexpr, NEED_DZ: tl.constexpr,
    NEED_DY: tl.constexpr, ACC: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """The whole backward of sentence ``b``: ``P``, ``dS`` in registers, then ``dq``, ``dz``, ``dy``
    (outputs contiguous ``(B, T, E)`` / ``(B, S, E)``)."""
    b = tl.program_id(0).to(tl.int64)
    ts = tl.arange(0, BLOCK_T).to(tl.int64)
    ss = tl.arange(0, BLOCK_S).to(tl.int64)
    p, length = _probabilities(q_ptr, z_ptr, len_ptr, lse_ptr, b, ts, ss, T, S, E,
                               sq_b, sq_t, sq_e, sz_b, sz_s, sz_e, LEFT_PAD, ACC, PRECISION,
                               BLOCK_T, BLOCK_S, BLOCK_D)
    scale = tl.sqrt(length.to(ACC))
    dp = _scores(dctx_ptr, y_ptr, b, ts, ss, T, S, E, sd_b, sd_t, sd_e, sy_b, sy_s, sy_e,
                 ACC, PRECISION, BLOCK_T, BLOCK_S, BLOCK_D) * scale
    delta = _row_dot(dctx_ptr, c_ptr, b, ts, T, E, sd_b, sd_t, sd_e, sc_b, sc_t, sc_e, ACC, BLOCK_T, BLOCK_D)
    lo, hi, _ = _valid_source_range(len_ptr, b, S, LEFT_PAD)
    keep = (ts < T)[:, None] & ((ss >= lo) & (ss < hi))[None, :]
    if HAS_DATTN:  # the probabilities' own gradient: dP += dA, D += dA . P
        da = tl.load(dattn_ptr + (b * T + ts[:, None]) * S + ss[None, :], mask=keep, other=0.0).to(ACC)
        dp += da
        delta += tl.sum(da * p, axis=1)
    # padding lanes (a query past T, a source step outside the sentence) contribute nothing, even
    # where the padding holds inf or NaN; the products' operands in the input dtype, once
    ds = tl.where(keep, p * (dp - delta[:, None]), 0.0).to(q_ptr.dtype.element_ty)
    pt = tl.trans(tl.where(keep, p, 0.0).to(q_ptr.dtype.element_ty))
    dst = tl.trans(ds)
    for d0 in range(0, E, BLOCK_D):
        dd = (d0 + tl.arange(0, BLOCK_D)).to(tl.int64)
        d_ok = (dd < E)[None, :]
        if NEED_DQ:
            zd = tl.load(z_ptr + b * sz_b + ss[:, None] * sz_s + dd[None, :] * sz_e, mask=(ss < S)[:, None] & d_ok, other=0.0)
            _fused_store(dq_ptr, b, ts, T, dd, E, T * E, E, 1,
                         tl.dot(ds, zd, input_precision=PRECISION, out_dtype=ACC))
        if NEED_DZ:
            qd = tl.load(q_ptr + b * sq_b + ts[:, None] * sq_t + dd[None, :] * sq_e, mask=(ts < T)[:, None] & d_ok, other=0.0)
            _fused_store(dz_ptr, b, ss, S, dd, E, S * E, E, 1,
                         tl.dot(dst, qd, input_precision=PRECISION, out_dtype=ACC))
        if NEED_DY:
            dc = tl.load(dctx_ptr + b * sd_b + ts[:, None] * sd_t + dd[None, :] * sd_e,
                         mask=(ts < T)[:, None] & d_ok, other=0.0)
            _fused_store(dy_ptr, b, ss, S, dd, E, S * E, E, 1,
                         tl.dot(pt, dc, input_precision=PRECISION, out_dtype=ACC) * scale)


@triton.autotune(configs=_BMM_CONFIGS, key=["M_BUCKET", "N_BUCKET", "K_BUCKET"],
                 prune_configs_by=prune_by_report("attention_embsum/_bmm_kernel"))
@triton.jit
def _bmm_kernel(
    a_ptr, b_ptr, c_ptr, alpha_ptr, M, N, K, M_BUCKET, N_BUCKET, K_BUCKET,
    sa_b, sa_m, sa_k, sb_b, sb_k, sb_n, sc_b, sc_m, sc_n,
    HAS_ALPHA: tl.constexpr, ACC: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """``c[i] = alpha[i] * a[i] @ b[i]``; transposes are strides."""
    i = tl.program_id(2).to(tl.int64)
    ms = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    ns = (tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    m_ok = ms < M
    n_ok = ns < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        a = tl.load(a_ptr + i * sa_b + ms[:, None] * sa_m + ks[None, :] * sa_k, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        bt = tl.load(b_ptr + i * sb_b + ks[:, None] * sb_k + ns[None, :] * sb_n, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        acc = tl.dot(a, bt, acc, input_precision=PRECISION, out_dtype=ACC)
    if HAS_ALPHA:
        acc = acc * tl.load(alpha_ptr + i).to(ACC)
    tl.store(c_ptr + i * sc_b + ms[:, None] * sc_m + ns[None, :] * sc_n, acc.to(c_ptr.dtype.element_ty),
             mask=m_ok[:, None] & n_ok[None, :])


def _bmm(a: torch.Tensor, b: torch.Tensor, alpha=None) -> torch.Tensor:
    nb, M, K = a.shape
    N = b.shape[2]
    c = new_empty(nb, M, N, dtype=a.dtype, device=a.device)
    grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]), triton.cdiv(N, meta["BLOCK_N"]), nb)
    _bmm_kernel[grid](a, b, c, alpha if alpha is not None else a, M, N, K, bucket(M), bucket(N), bucket(K),
                      *a.stride(), *b.stride(), *c.stride(),
                      HAS_ALPHA=alpha is not None, ACC=acc_type(a.dtype), PRECISION=dot_precision(a.dtype))
    return c


def _lengths_arg(src_lengths, q, S: int) -> torch.Tensor:
    """The kernels always read a length per sentence; no lengths means every row is S long."""
    if src_lengths is not None:
        return src_lengths
    return torch.full((q.shape[0],), S, dtype=torch.int64, device=q.device)


def attention_forward(q, z, y, src_lengths, left_pad: bool, return_attn: bool):
    """``(context, attn or None, lse)``."""
    B, T, E = q.shape
    S = z.shape[1]
    out = new_empty(B, T, E, dtype=q.dtype, device=q.device)
    lse = new_empty(B, T, dtype=torch.float64 if q.dtype == torch.float64 else torch.float32, device=q.device)
    attn = None
    if B * T == 0:
        return out, (new_empty(B, T, S, dtype=q.dtype, device=q.device) if return_attn else None), lse
    lens = _lengths_arg(src_lengths, q, S)
    flags = dict(LEFT_PAD=left_pad, ACC=acc_type(q.dtype), PRECISION=dot_precision(q.dtype))
    grid = lambda meta: (triton.cdiv(T, meta["BLOCK_T"]), triton.cdiv(E, meta["BLOCK_E"]), B)
    _attention_fwd_kernel[grid](q, z, y, lens, out, lse, T, S, E, bucket(S),
                                *q.stride(), *z.stride(), *y.stride(), *out.stride(), **flags)
    if return_attn:
        attn = new_empty(B, T, S, dtype=q.dtype, device=q.device)
        grid_p = lambda meta: (triton.cdiv(T, meta["BLOCK_T"]), triton.cdiv(S, meta["BLOCK_S"]), B)
        _attention_probs_kernel[grid_p](q, z, lens, lse, attn, T, S, E, bucket(S), *q.stride(), *z.stride(), **flags)
    return out, attn, lse


def _fused_backward(dctx, dattn, q, z, y, lens, left_pad, ctx_out, lse, needs):
    """``(dq, dz, dy)`` (None where not needed) by the one-launch backward (T, S <= :func:`fused_max`)."""
    B, T, E = q.shape
    S = z.shape[1]
    outs = [new_empty(*shape, dtype=q.dtype, device=q.device) if need else None
            for need, shape in zip(needs, ((B, T, E), (B, S, E), (B, S, E)))]
    dattn_c = dattn.contiguous() if dattn is not None else q
    _attention_bwd_fused_kernel[(B,)](
        q, z, y, lens, lse, ctx_out, dctx, dattn_c, *(o if o is not None else q for o in outs), T, S, E,
        *q.stride(), *z.stride(), *y.stride(), *ctx_out.stride(), *dctx.stride(),
        LEFT_PAD=left_pad, HAS_DATTN=dattn is not None, NEED_DQ=bool(needs[0]), NEED_DZ=bool(needs[1]),
        NEED_DY=bool(needs[2]), ACC=acc_type(q.dtype), PRECISION=dot_precision(q.dtype),
        BLOCK_T=bucket(T), BLOCK_S=bucket(S),
    )
    return tuple(outs)


def attention_backward(dctx, dattn, q, z, y, src_lengths, left_pad, ctx_out, attn, lse, needs):
    B, T, E = q.shape
    S = z.shape[1]
    if B * T == 0 or S == 0:
        zeros = (torch.zeros_like(q), torch.zeros_like(z), torch.zeros_like(y))
        return tuple(g if need else None for g, need in zip(zeros, needs))
    if max(T, S) <= fused_max(q.dtype):
        return _fused_backward(dctx, dattn, q, z, y, _lengths_arg(src_lengths, q, S), left_pad, ctx_out, lse, needs)
    acc_dtype = lse.dtype
    # D_i = sum_j P_ij dP_ij = dc_i . c_i (+ sum_j A_ij dA_ij when the probabilities get a gradient)
    delta = (dctx.to(acc_dtype) * ctx_out.to(acc_dtype)).sum(-1)
    if dattn is not None:
        delta = delta + (dattn.to(acc_dtype) * attn.to(acc_dtype)).sum(-1)
    lens = _lengths_arg(src_lengths, q, S)
    p = new_empty(B, T, S, dtype=q.dtype, device=q.device)
    ds = new_empty(B, T, S, dtype=q.dtype, device=q.device)
    dattn_c = dattn.contiguous() if dattn is not None else p
    grid = lambda meta: (triton.cdiv(T, meta["BLOCK_T"]), triton.cdiv(S, meta["BLOCK_S"]), B)
    _attention_bwd_ds_kernel[grid](
        q, z, y, lens, lse, delta, dctx, dattn_c, p, ds, T, S, E, bucket(S),
        *q.stride(), *z.stride(), *y.stride(), *dctx.stride(),
        LEFT_PAD=left_pad, HAS_DATTN=dattn is not None,
        ACC=acc_type(q.dtype), PRECISION=dot_precision(q.dtype),
    )
    dq = _bmm(ds, z) if needs[0] else None
    dz = _bmm(ds.transpose(1, 2), q) if needs[1] else None
    dy = None
    if needs[2]:
        if src_lengths is None:
            scale = torch.full((B,), float(S), dtype=acc_dtype, device=q.device).sqrt()
        else:
            scale = src_lengths.to(acc_dtype).sqrt()
        dy = _bmm(p.transpose(1, 2), dctx, scale)
    return dq, dz, dy


class AttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, z, y, src_lengths, left_pad, return_attn):
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None: no zeros to read
        out, attn, lse = attention_forward(q, z, y, src_lengths, left_pad, return_attn)
        ctx.save_for_backward(q, z, y, src_lengths, out, attn, lse)
        ctx.left_pad = left_pad
        return (out, attn) if return_attn else out

    @staticmethod
    def backward(ctx, dctx, dattn=None):
        q, z, y, src_lengths, out, attn, lse = ctx.saved_tensors
        if dctx is None:  # only the probabilities were used
            dctx = torch.zeros_like(out)
        dq, dz, dy = attention_backward(dctx, dattn, q, z, y, src_lengths, ctx.left_pad, out, attn, lse,
                                        ctx.needs_input_grad[:3])
        return dq, dz, dy, None, None, None


def attention_embsum_triton(q, z, y, src_lengths=None, *, left_pad=True, return_attn=False):
    """The ``attention_embsum`` op on the Triton backend (same contract as ``attention_embsum_ref``);
    inference skips the autograd Function (its bookkeeping is host time on every call)."""
    if torch.is_grad_enabled() and (q.requires_grad or z.requires_grad or y.requires_grad):
        return AttentionFunction.apply(q, z, y, src_lengths, left_pad, return_attn)
    out, attn, _ = attention_forward(q, z, y, src_lengths, left_pad, return_attn)
    return (out, attn) if return_attn else out
