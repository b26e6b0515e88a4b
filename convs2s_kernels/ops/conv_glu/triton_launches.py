"""``conv_glu``'s launches for the GPU check (``python3 -m convs2s_kernels.gpu_check``, see
:mod:`convs2s_kernels.gpu_check.launches` for the interface): the encoder's call, forward and
backward, on meta tensors."""

from __future__ import annotations

import functools

import torch

from .triton_kernels import conv_glu_backward, conv_glu_forward, conv_glu_weight_grad

KERNELS = __package__ + ".triton_kernels"
# what --ci compiles beyond each launch's first config in bf16 on sm_90, (launch, config index,
# dtype, target): one fp32 IEEE case on sm_80, so that the FMA path and the A100 are covered too
SUBSET_EXTRA = (("_conv_glu_fwd_kernel", 0, "fp32-ieee", "sm_80"),)
# inference, then training (saves the pre-activations); dW at once, then in fp32 partials
SITES = {"_conv_glu_fwd_kernel": ["", "train"], "_conv_glu_bwd_dw_kernel": ["", "split"]}

_meta = functools.partial(torch.empty, device="meta")


def calls(dtype) -> None:
    """The encoder's call (centred, bias, residual, pad mask, scale): every flag on, inference and
    training; k = 3, C = 512, 160 sentences x 25 steps."""
    B, T, C, k = 160, 25, 512, 3
    x, res, grad = (_meta(B, T, C, dtype=dtype) for _ in range(3))
    w, b = _meta(k, C, 2 * C, dtype=dtype), _meta(2 * C, dtype=dtype)
    mask = _meta(B, T, dtype=torch.bool)
    conv_glu_forward(x, w, b, res, mask, False, 0.5 ** 0.5)
    _, pre = conv_glu_forward(x, w, b, res, mask, False, 0.5 ** 0.5, save_pre=True)
    conv_glu_backward(grad, pre, x, w, mask, False, 0.5 ** 0.5, (True, True, True, True), dw_splits=1)
    conv_glu_weight_grad(x, mask, pre, k, False, splits=4)  # where dW's tiles are too few for the GPU
