"""Pieces of the GLU convolutions shared by the conv + GLU kernels and the step kernel."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _glu_tap_dot(xt, w_tap, ks, k_ok, cols, col_ok, C, sw_i, sw_o, acc_v, acc_g,
                 ACC: tl.constexpr, PRECISION: tl.constexpr):
    """``acc_v += xt @ W[ks, cols]`` and ``acc_g += xt @ W[ks, C + cols]`` for one weight tap
    ``w_tap`` (rows ``ks`` of C_in, value columns ``cols`` and their gates ``C`` further on)."""
    w_rows = w_tap + ks[:, None] * sw_i
    w_ok = k_ok[:, None] & col_ok[None, :]
    wv = tl.load(w_rows + cols[None, :] * sw_o, mask=w_ok, other=0.0)
    wg = tl.load(w_rows + (cols[None, :] + C) * sw_o, mask=w_ok, other=0.0)
    acc_v = tl.dot(xt, wv, acc_v, input_precision=PRECISION, out_dtype=ACC)
    acc_g = tl.dot(xt, wg, acc_g, input_precision=PRECISION, out_dtype=ACC)
    return acc_v, acc_g


@triton.jit
def _add_glu_bias(acc_v, acc_g, bias_ptr, cols, col_ok, C, ACC: tl.constexpr):
    """The bias of the value columns ``cols`` and of their gates."""
    acc_v += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(ACC)[None, :]
    acc_g += tl.load(bias_ptr + C + cols, mask=col_ok, other=0.0).to(ACC)[None, :]
    return acc_v, acc_g
