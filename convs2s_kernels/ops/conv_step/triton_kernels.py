"""One incremental decoding step of a causal convolution + GLU in Triton: one launch per layer.

Each program owns ``BLOCK_M`` new rows (sentence x beam) and ``BLOCK_N`` output channels. It
gathers every row's window ``[state[parent, 0..k-2], x_t]`` by beam index while it multiplies
it with the weight (tap by tap, ``C_in`` in ``BLOCK_K`` chunks, value and gate accumulators side
by side), and the programs of the first channel tile copy what they read into the new state
``[state[parent, 1..k-2], x_t]``. The new state is a second buffer: parents repeat across rows,
so an in-place shift would overwrite a state another row still has to read.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ...triton_common.config import acc_type, configs, dot_precision, new_empty
from ...triton_common.fits import prune_by_report
from ...triton_common.glu import _add_glu_bias, _glu_tap_dot

_STEP_CONFIGS = configs(
    gpu=[
        # decoding has few rows (1..160) and wide weights: tall-skinny tiles, many channel tiles.
        # Checked by `python3 -m convs2s_kernels.gpu_check`; the autotuner drops, per device and
        # dtype, those its report says break the rule there (fp32 IEEE on sm_80: only 16x64x32).
        dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=64, num_warps=4, num_stages=4),
        dict(BLOCK_M=16, BLOCK_N=128, BLOCK_K=32, num_warps=4, num_stages=3),  # K = 64 spilled in fp32
        dict(BLOCK_M=32, BLOCK_N=64, BLOCK_K=32, num_warps=4, num_stages=3),  # K = 64, s4 spilled in fp32
        dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, num_warps=4, num_stages=3),
        dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=32, num_warps=4, num_stages=3),  # fits everywhere
    ],
    interpreter=dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=64),
)


@triton.autotune(configs=_STEP_CONFIGS, key=["C_in", "C", "K_W"],
                 prune_configs_by=prune_by_report("conv_step/_conv_step_fwd_kernel"))
@triton.jit
def _conv_step_fwd_kernel(
    x_ptr, state_ptr, parent_ptr, w_ptr, bias_ptr, out_ptr, new_state_ptr,
    N, C_in, C,
    sx_n, sx_c, ss_n, ss_k, ss_c, sw_k, sw_i, sw_o,
    K_W: tl.constexpr, HAS_PARENT: tl.constexpr, HAS_BIAS: tl.constexpr,
    ACC: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid_n = tl.program_id(1)
    rows = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    row_ok = rows < N
    col_ok = cols < C
    if HAS_PARENT:
        parent = tl.load(parent_ptr + rows, mask=row_ok, other=0).to(tl.int64)
    else:
        parent = rows
    acc_v = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC)
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC)
    for j in tl.static_range(K_W):
        if j < K_W - 1:
            src = state_ptr + parent * ss_n + j * ss_k  # tap j reads the parent's j-th stored input
            src_c = ss_c
        else:
            src = x_ptr + rows * sx_n  # the newest tap reads the step's input
            src_c = sx_c
        w_tap = w_ptr + j * sw_k
        for k0 in range(0, C_in, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < C_in
            ok = row_ok[:, None] & k_ok[None, :]
            xt = tl.load(src[:, None] + ks[None, :] * src_c, mask=ok, other=0.0)
            if j >= 1:
                if pid_n == 0:
                    # the window without its oldest entry is the new state: slot j-1
                    dst = new_state_ptr + (rows[:, None] * (K_W - 1) + (j - 1)) * C_in + ks[None, :]
                    tl.store(dst, xt, mask=ok)
            acc_v, acc_g = _glu_tap_dot(xt, w_tap, ks, k_ok, cols, col_ok, C, sw_i, sw_o, acc_v, acc_g,
                                        ACC, PRECISION)
    if HAS_BIAS:
        acc_v, acc_g = _add_glu_bias(acc_v, acc_g, bias_ptr, cols, col_ok, C, ACC)
    out = acc_v / (1.0 + tl.exp(-acc_g))
    tl.store(out_ptr + rows[:, None] * C + cols[None, :], out.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & col_ok[None, :])


def conv_step_triton(x_t, state, weight, bias=None, beam_index=None):
    """The ``conv_step`` op on the Triton backend (same contract as ``conv_step_ref``)."""
    N, C_in = x_t.shape
    k, _, c2 = weight.shape
    C = c2 // 2
    out = new_empty(N, C, dtype=x_t.dtype, device=x_t.device)
    new_state = new_empty(N, k - 1, C_in, dtype=x_t.dtype, device=x_t.device)
    if N == 0:
        return out, new_state
    grid = lambda meta: (triton.cdiv(N, meta["BLOCK_M"]), triton.cdiv(C, meta["BLOCK_N"]))
    _conv_step_fwd_kernel[grid](
        x_t, state, beam_index if beam_index is not None else x_t, weight, bias if bias is not None else x_t,
        out, new_state, N, C_in, C, *x_t.stride(), *state.stride(), *weight.stride(),
        K_W=k, HAS_PARENT=beam_index is not None, HAS_BIAS=bias is not None,
        ACC=acc_type(x_t.dtype), PRECISION=dot_precision(x_t.dtype),
    )
    return out, new_state
