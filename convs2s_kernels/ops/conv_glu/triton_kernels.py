"""Convolution + GLU in Triton, forward and backward.

The convolution is a GEMM over the ``M = B*T`` output rows and the ``C`` output channels; its
reduction runs over the ``k`` taps and ``C_in``, each tap a time-shifted load of ``x`` (no im2col
in memory). Every program keeps two fp32 accumulators side by side, value columns ``n`` and gate
columns ``C + n``, so bias, GLU, residual and scale happen in registers and only ``C`` outputs
are written. Encoder padding is folded into the loads (padded input steps read as zeros).

Training saves the pre-activations ``pre (M, 2C)`` (value and gate, bias included) from the
forward's registers, as autograd saves a convolution's output for GLU: recomputing them in the
backward cost a third GEMM there, against cuDNN's two (the H100 run that measured it:
``shared/notes/gpu_h100.md``). Backward:

* ``_conv_glu_bwd_glu_kernel``, elementwise: the pre-activation gradient ``dpre (M, 2C)`` from
  ``pre`` and the output gradient, plus per-row-tile partial sums of it for the bias gradient;
* ``_conv_glu_bwd_dx_kernel``: ``dx[t'] = sum_j dpre[t' + left - j] @ W[j]^T`` (a GEMM with the
  taps as shifted loads again), zero at padded steps;
* ``_conv_glu_bwd_dw_kernel``: ``dW[j] = x_j^T @ dpre``, written at once where its tiles fill the
  GPU, else with the rows split into chunks whose fp32 partials are summed afterwards:
  deterministic, no atomics.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .reference import conv_padding
from ...triton_common.config import acc_type, configs, dot_precision, new_empty
from ...triton_common.fits import prune_by_report
from ...triton_common.glu import _add_glu_bias, _glu_tap_dot


def _tiles(*entries):
    """``(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages)`` per GPU config."""
    return [dict(BLOCK_M=m, BLOCK_N=n, BLOCK_K=k, num_warps=w, num_stages=st) for m, n, k, w, st in entries]


# Every config below passes `python3 -m convs2s_kernels.gpu_check` (shared memory within the
# target, no spills, compile <= 20 s) for some dtype on sm_80 and sm_90; the autotuners drop, per
# device and dtype, those its report (convs2s_kernels/gpu_check_report.json) says break the rule
# there (fp32 with IEEE products, an FMA loop, keeps only the small-K tiles on an A100).
# The forward holds two accumulators (value and gate): half the tile of a GEMM. Dropped (when the
# backward recomputed them in a kernel of the same shape): 128x64x32 w4 s4 and 128x128x32 w8 s3 spilled,
# 64x128x64 w4 s3 needed 240 KB on sm_90 with TF32 and compiled in 21 s in fp32 IEEE
_GLU_CONFIGS = configs(
    gpu=_tiles((128, 64, 32, 8, 4), (64, 64, 32, 4, 4), (32, 64, 64, 4, 4), (64, 32, 16, 4, 3), (32, 32, 32, 4, 3)),
    interpreter=dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64),
)
# dx and dW: one accumulator. Dropped: 64x128x64 w4 s3 (spilled in fp32), 32x64x64 w4 s4 (dW
# spilled on sm_90)
_GEMM_CONFIGS = configs(
    gpu=_tiles((128, 64, 32, 4, 4), (64, 64, 32, 4, 4), (128, 128, 32, 8, 3), (32, 64, 32, 4, 4), (64, 64, 16, 4, 3)),
    interpreter=dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64),
)
# the weight gradient's smallest (input channels, output columns) tile: the most programs it can have
_SMALLEST_TILE = min(((c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]) for c in _GEMM_CONFIGS), key=lambda t: t[0] * t[1])
# The GLU backward is elementwise (no reduction loop): wide row tiles, 16-byte loads along channels.
_ELEMENTWISE_CONFIGS = configs(
    gpu=[dict(BLOCK_M=32, BLOCK_N=128, num_warps=4, num_stages=1), dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=1),
         dict(BLOCK_M=16, BLOCK_N=256, num_warps=4, num_stages=1)],
    interpreter=dict(BLOCK_M=64, BLOCK_N=64),
)
# the GLU backward writes one partial bias row per row tile: its smallest BLOCK_M bounds their number
_MIN_BLOCK_M = min(c.kwargs["BLOCK_M"] for c in _ELEMENTWISE_CONFIGS)


@triton.jit
def _preactivations(x_ptr, w_ptr, bias_ptr, mask_ptr, rows, cols, M, T, C_in, C,
                    sx_b, sx_t, sx_c, sw_k, sw_i, sw_o, sm_b, sm_t,
                    K_W: tl.constexpr, PAD_LEFT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr,
                    ACC: tl.constexpr, PRECISION: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Value and gate pre-activations (bias included) of output rows ``rows`` x channels ``cols``."""
    b = rows // T
    t = rows % T
    acc_v = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC)
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC)
    col_ok = cols < C
    for j in tl.static_range(K_W):
        t_in = t + (j - PAD_LEFT)
        row_ok = (rows < M) & (t_in >= 0) & (t_in < T)
        if HAS_MASK:
            padded = tl.load(mask_ptr + b * sm_b + t_in * sm_t, mask=row_ok, other=1)
            row_ok = row_ok & (padded == 0)
        x_row = x_ptr + b * sx_b + t_in * sx_t
        w_tap = w_ptr + j * sw_k
        for k0 in range(0, C_in, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < C_in
            xt = tl.load(x_row[:, None] + ks[None, :] * sx_c, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            acc_v, acc_g = _glu_tap_dot(xt, w_tap, ks, k_ok, cols, col_ok, C, sw_i, sw_o, acc_v, acc_g,
                                        ACC, PRECISION)
    if HAS_BIAS:
        acc_v, acc_g = _add_glu_bias(acc_v, acc_g, bias_ptr, cols, col_ok, C, ACC)
    return acc_v, acc_g


@triton.autotune(configs=_GLU_CONFIGS, key=["C_in", "C", "K_W"],
                 prune_configs_by=prune_by_report("conv_glu/_conv_glu_fwd_kernel"))
@triton.jit
def _conv_glu_fwd_kernel(
    x_ptr, w_ptr, bias_ptr, res_ptr, mask_ptr, out_ptr, pre_ptr,
    M, T, C_in, C, scale,
    sx_b, sx_t, sx_c, sw_k, sw_i, sw_o, sr_b, sr_t, sr_c, sm_b, sm_t, so_b, so_t, so_c,
    K_W: tl.constexpr, PAD_LEFT: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, HAS_MASK: tl.constexpr, SAVE_PRE: tl.constexpr,
    ACC: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    rows = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = (tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    v, g = _preactivations(x_ptr, w_ptr, bias_ptr, mask_ptr, rows, cols, M, T, C_in, C,
                           sx_b, sx_t, sx_c, sw_k, sw_i, sw_o, sm_b, sm_t,
                           K_W, PAD_LEFT, HAS_BIAS, HAS_MASK, ACC, PRECISION, BLOCK_M, BLOCK_N, BLOCK_K)
    col_ok = cols < C
    b = rows // T
    t = rows % T
    ok = (rows < M)[:, None] & col_ok[None, :]
    if SAVE_PRE:  # training: the backward's GLU derivative reads these instead of a second GEMM
        pre_rows = pre_ptr + rows[:, None] * (2 * C)
        tl.store(pre_rows + cols[None, :], v.to(pre_ptr.dtype.element_ty), mask=ok)
        tl.store(pre_rows + C + cols[None, :], g.to(pre_ptr.dtype.element_ty), mask=ok)
    out = v / (1.0 + tl.exp(-g))
    if HAS_RES:
        out += tl.load(res_ptr + (b * sr_b + t * sr_t)[:, None] + cols[None, :] * sr_c, mask=ok, other=0.0).to(ACC)
    out = out * scale
    tl.store(out_ptr + (b * so_b + t * so_t)[:, None] + cols[None, :] * so_c, out.to(out_ptr.dtype.element_ty), mask=ok)


@triton.autotune(configs=_ELEMENTWISE_CONFIGS, key=["C"],
                 prune_configs_by=prune_by_report("conv_glu/_conv_glu_bwd_glu_kernel"))
@triton.jit
def _conv_glu_bwd_glu_kernel(
    pre_ptr, dout_ptr, dpre_ptr, dbias_part_ptr,
    M, T, C, scale,
    sd_b, sd_t, sd_c,
    ACC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """``dpre = d GLU(pre) * scale * dout`` for a tile of rows x value channels (and their gates)."""
    pid_m = tl.program_id(0).to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    cols = (tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    col_ok = cols < C
    ok = (rows < M)[:, None] & col_ok[None, :]
    two_c = 2 * C
    pre_rows = pre_ptr + rows[:, None] * two_c
    v = tl.load(pre_rows + cols[None, :], mask=ok, other=0.0).to(ACC)
    g = tl.load(pre_rows + C + cols[None, :], mask=ok, other=0.0).to(ACC)
    b = rows // T
    t = rows % T
    grad = tl.load(dout_ptr + (b * sd_b + t * sd_t)[:, None] + cols[None, :] * sd_c, mask=ok, other=0.0).to(ACC)
    grad = grad * scale
    sig = 1.0 / (1.0 + tl.exp(-g))
    dv = grad * sig
    dg = grad * v * sig * (1.0 - sig)
    dpre_rows = dpre_ptr + rows[:, None] * two_c
    tl.store(dpre_rows + cols[None, :], dv.to(dpre_ptr.dtype.element_ty), mask=ok)
    tl.store(dpre_rows + C + cols[None, :], dg.to(dpre_ptr.dtype.element_ty), mask=ok)
    # rows beyond M loaded grad = 0, so they add nothing to the column sums
    part = dbias_part_ptr + pid_m * two_c
    tl.store(part + cols, tl.sum(dv, axis=0), mask=col_ok)
    tl.store(part + C + cols, tl.sum(dg, axis=0), mask=col_ok)


@triton.autotune(configs=_GEMM_CONFIGS, key=["C_in", "C", "K_W"],
                 prune_configs_by=prune_by_report("conv_glu/_conv_glu_bwd_dx_kernel"))
@triton.jit
def _conv_glu_bwd_dx_kernel(
    dpre_ptr, w_ptr, mask_ptr, dx_ptr,
    M, T, C_in, C,
    sw_k, sw_i, sw_o, sm_b, sm_t,
    K_W: tl.constexpr, PAD_LEFT: tl.constexpr, HAS_MASK: tl.constexpr,
    ACC: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """dx rows ``(b, t')`` x input channels: sum over taps j and the 2C pre-activation columns."""
    rows = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    chans = (tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    b = rows // T
    t_in = rows % T
    chan_ok = chans < C_in
    two_c = 2 * C
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC)
    for j in tl.static_range(K_W):
        t_out = t_in + (PAD_LEFT - j)  # the output step that read input t_in through tap j
        row_ok = (rows < M) & (t_out >= 0) & (t_out < T)
        d_row = dpre_ptr + (b * T + t_out) * two_c
        w_tap = w_ptr + j * sw_k + chans[None, :] * sw_i
        for n0 in range(0, two_c, BLOCK_K):
            ns = n0 + tl.arange(0, BLOCK_K)
            n_ok = ns < two_c
            d = tl.load(d_row[:, None] + ns[None, :], mask=row_ok[:, None] & n_ok[None, :], other=0.0)
            wt = tl.load(w_tap + ns[:, None] * sw_o, mask=n_ok[:, None] & chan_ok[None, :], other=0.0)
            acc = tl.dot(d, wt, acc, input_precision=PRECISION, out_dtype=ACC)
    keep = rows < M
    if HAS_MASK:
        padded = tl.load(mask_ptr + b * sm_b + t_in * sm_t, mask=keep, other=1)
        acc = tl.where((padded == 0)[:, None], acc, 0.0)
    ok = keep[:, None] & chan_ok[None, :]
    tl.store(dx_ptr + rows[:, None] * C_in + chans[None, :], acc.to(dx_ptr.dtype.element_ty), mask=ok)


@triton.autotune(configs=_GEMM_CONFIGS, key=["C_in", "C", "K_W"],
                 prune_configs_by=prune_by_report("conv_glu/_conv_glu_bwd_dw_kernel"))
@triton.jit
def _conv_glu_bwd_dw_kernel(
    x_ptr, mask_ptr, dpre_ptr, dw_part_ptr,
    M, T, C_in, C, rows_per_split,
    sx_b, sx_t, sx_c, sm_b, sm_t,
    K_W: tl.constexpr, PAD_LEFT: tl.constexpr, HAS_MASK: tl.constexpr,
    ACC: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """``dW[j, ci, n]`` over one chunk of rows (a partial when there are several); BLOCK_M tiles
    input channels here."""
    n_ci_tiles = tl.cdiv(C_in, BLOCK_M)
    j = tl.program_id(0) // n_ci_tiles
    chans = ((tl.program_id(0) % n_ci_tiles) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    ns = (tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    split = tl.program_id(2)
    two_c = 2 * C
    chan_ok = chans < C_in
    n_ok = ns < two_c
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC)
    row_start = split * rows_per_split
    row_end = tl.minimum(row_start + rows_per_split, M)
    for m0 in range(row_start, row_end, BLOCK_K):
        rows = (m0 + tl.arange(0, BLOCK_K)).to(tl.int64)
        b = rows // T
        t_in = rows % T + (j - PAD_LEFT)
        row_ok = (rows < row_end) & (t_in >= 0) & (t_in < T)
        if HAS_MASK:
            padded = tl.load(mask_ptr + b * sm_b + t_in * sm_t, mask=row_ok, other=1)
            row_ok = row_ok & (padded == 0)
        # x_j^T tile: input channels x rows
        xt = tl.load(x_ptr + chans[:, None] * sx_c + (b * sx_b + t_in * sx_t)[None, :],
                     mask=chan_ok[:, None] & row_ok[None, :], other=0.0)
        d = tl.load(dpre_ptr + rows[:, None] * two_c + ns[None, :],
                    mask=(rows < row_end)[:, None] & n_ok[None, :], other=0.0)
        acc = tl.dot(xt, d, acc, input_precision=PRECISION, out_dtype=ACC)
    out = dw_part_ptr + ((split * K_W + j) * C_in + chans[:, None]) * two_c + ns[None, :]
    tl.store(out, acc.to(dw_part_ptr.dtype.element_ty), mask=chan_ok[:, None] & n_ok[None, :])


def _mask_arg(pad_mask: Optional[torch.Tensor], x: torch.Tensor):
    """(pointer tensor, stride_b, stride_t) for the kernels; a dummy when there is no mask."""
    if pad_mask is None:
        return x, 0, 0
    m = pad_mask.view(torch.uint8)
    return m, m.stride(0), m.stride(1)


def _dw_splits(M: int, k: int, C_in: int, c2: int, device: torch.device) -> int:
    """Row chunks of the weight gradient. One, when its (tap, input channel, output channel) tiles
    can fill the GPU (the autotuner then picks among the tiles): dW is written at once in the input
    dtype. More only where even the smallest tile leaves multiprocessors idle, since each chunk adds
    an fp32 partial of dW to write and sum (at the paper's k = 3, C = 512 the four chunks used
    before wrote and read 50 MB beside a 12.6 GFLOP product)."""
    if device.type != "cuda":
        return 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    most = k * triton.cdiv(C_in, _SMALLEST_TILE[0]) * triton.cdiv(c2, _SMALLEST_TILE[1])  # programs
    return max(1, min(32, triton.cdiv(sms, most), M // 512))


def conv_glu_weight_grad(x, pad_mask, dpre, k: int, causal: bool, splits: int) -> torch.Tensor:
    """``dW (k, C_in, 2C)`` from ``x`` and ``dpre (B*T, 2C)``, its rows in ``splits`` chunks: one
    writes dW directly; several write fp32 partials (no atomics: deterministic) summed after."""
    B, T, C_in = x.shape
    M, c2 = dpre.shape
    mask, sm_b, sm_t = _mask_arg(pad_mask, x)
    part_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    out = new_empty(splits, k, C_in, c2, dtype=x.dtype if splits == 1 else part_dtype, device=x.device)
    grid = lambda meta: (k * triton.cdiv(C_in, meta["BLOCK_M"]), triton.cdiv(c2, meta["BLOCK_N"]), splits)
    _conv_glu_bwd_dw_kernel[grid](
        x, mask, dpre, out, M, T, C_in, c2 // 2, triton.cdiv(M, splits), *x.stride(), sm_b, sm_t,
        K_W=k, PAD_LEFT=conv_padding(k, causal)[0], HAS_MASK=pad_mask is not None,
        ACC=acc_type(x.dtype), PRECISION=dot_precision(x.dtype),
    )
    return out[0] if splits == 1 else out.sum(0).to(x.dtype)


def conv_glu_forward(x, weight, bias, residual, pad_mask, causal: bool, scale: float, save_pre: bool = False):
    """The output ``(B, T, C)``; with ``save_pre``, ``(output, pre (B*T, 2C))``: the value and gate
    pre-activations the backward reads (:func:`conv_glu_backward`)."""
    B, T, C_in = x.shape
    k, _, c2 = weight.shape
    C = c2 // 2
    M = B * T
    out = new_empty(B, T, C, dtype=x.dtype, device=x.device)
    pre = new_empty(M, c2, dtype=x.dtype, device=x.device) if save_pre else None
    if M > 0:
        mask, sm_b, sm_t = _mask_arg(pad_mask, x)
        res = residual if residual is not None else out
        grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]), triton.cdiv(C, meta["BLOCK_N"]))
        _conv_glu_fwd_kernel[grid](
            x, weight, bias if bias is not None else x, res, mask, out, pre if save_pre else out,
            M, T, C_in, C, float(scale),
            *x.stride(), *weight.stride(), *res.stride(), sm_b, sm_t, *out.stride(),
            K_W=k, PAD_LEFT=conv_padding(k, causal)[0],
            HAS_BIAS=bias is not None, HAS_RES=residual is not None, HAS_MASK=pad_mask is not None, SAVE_PRE=save_pre,
            ACC=acc_type(x.dtype), PRECISION=dot_precision(x.dtype),
        )
    return (out, pre) if save_pre else out


def conv_glu_backward(grad_out, pre, x, weight, pad_mask, causal: bool, scale: float, needs,
                      dw_splits: Optional[int] = None):
    """Gradients ``(dx, dweight, dbias, dresidual)`` from the forward's saved ``pre``; ``needs``
    says which are wanted (None otherwise; dbias only with a bias); ``dw_splits``: the weight
    gradient's row chunks (None: :func:`_dw_splits`)."""
    B, T, C_in = x.shape
    k, _, c2 = weight.shape
    C = c2 // 2
    M = B * T
    acc = acc_type(x.dtype)
    prec = dot_precision(x.dtype)
    pad_left = conv_padding(k, causal)[0]
    mask, sm_b, sm_t = _mask_arg(pad_mask, x)
    has_mask = pad_mask is not None
    part_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    if M == 0:  # no rows: every gradient is zero (and a grid of zero programs cannot launch)
        zeros = (torch.zeros_like(x), torch.zeros_like(weight), weight.new_zeros(c2), grad_out * scale)
        return tuple(g if need else None for g, need in zip(zeros, needs))

    dpre = new_empty(M, c2, dtype=x.dtype, device=x.device)
    # one partial bias row per row tile; the smallest BLOCK_M of any config bounds their number
    dbias_part = new_empty(triton.cdiv(M, _MIN_BLOCK_M), c2, dtype=part_dtype, device=x.device)
    grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]), triton.cdiv(C, meta["BLOCK_N"]))
    _conv_glu_bwd_glu_kernel[grid](pre, grad_out, dpre, dbias_part, M, T, C, float(scale), *grad_out.stride(), ACC=acc)
    n_tiles = triton.cdiv(M, _conv_glu_bwd_glu_kernel.best_config.kwargs["BLOCK_M"])

    dx = dw = db = dres = None
    if needs[0]:
        dx = new_empty(B, T, C_in, dtype=x.dtype, device=x.device)
        grid_dx = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]), triton.cdiv(C_in, meta["BLOCK_N"]))
        _conv_glu_bwd_dx_kernel[grid_dx](
            dpre, weight, mask, dx, M, T, C_in, C, *weight.stride(), sm_b, sm_t,
            K_W=k, PAD_LEFT=pad_left, HAS_MASK=has_mask, ACC=acc, PRECISION=prec,
        )
    if needs[1]:
        splits = dw_splits if dw_splits is not None else _dw_splits(M, k, C_in, c2, x.device)
        dw = conv_glu_weight_grad(x, pad_mask, dpre, k, causal, max(1, min(splits, M)))
    if needs[2]:
        db = dbias_part[:n_tiles].sum(0).to(x.dtype)
    if needs[3]:
        dres = grad_out * scale
    return dx, dw, db, dres


class ConvGLUFunction(torch.autograd.Function):
    """Autograd wrapper: forward and backward both run the Triton kernels; saves the pre-activations."""

    @staticmethod
    def forward(ctx, x, weight, bias, residual, pad_mask, causal, scale):
        scale = 1.0 if scale is None else float(scale)
        out, pre = conv_glu_forward(x, weight, bias, residual, pad_mask, causal, scale, save_pre=True)
        ctx.save_for_backward(pre, x, weight, pad_mask)
        ctx.causal, ctx.scale, ctx.has_residual, ctx.has_bias = causal, scale, residual is not None, bias is not None
        return out

    @staticmethod
    def backward(ctx, grad_out):
        pre, x, weight, pad_mask = ctx.saved_tensors
        needs = (ctx.needs_input_grad[0], ctx.needs_input_grad[1],
                 ctx.has_bias and ctx.needs_input_grad[2], ctx.has_residual and ctx.needs_input_grad[3])
        dx, dw, db, dres = conv_glu_backward(grad_out, pre, x, weight, pad_mask, ctx.causal, ctx.scale, needs)
        return dx, dw, db, dres, None, None, None


def conv_glu_triton(x, weight, bias=None, *, causal, residual=None, scale=None, pad_mask=None):
    """The ``conv_glu`` op on the Triton backend (same contract as ``conv_glu_ref``); inference
    skips the autograd Function (its bookkeeping is host time on every call)."""
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias, residual)):
        return ConvGLUFunction.apply(x, weight, bias, residual, pad_mask, causal, scale)
    return conv_glu_forward(x, weight, bias, residual, pad_mask, causal, 1.0 if scale is None else float(scale))
