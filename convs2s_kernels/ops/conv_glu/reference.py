"""The ground truth of ``conv_glu``: convolution (causal or centred) + GLU in plain PyTorch.

Convolution weights use fairseq's ConvTBC layout ``(k, C_in, 2C)``: tap ``j = k-1`` multiplies the
newest input. GLU takes the first ``C`` output channels as values and the last ``C`` as gates.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
__all__ = ["conv_padding", "conv_glu_ref"]


def conv_padding(kernel_width: int, causal: bool) -> Tuple[int, int]:
    """(left, right) zero padding along time.

    Causal: ``k-1`` on the left, so output ``t`` sees inputs ``<= t``.
    Centred: ``(k-1)//2`` left and ``k//2`` right, fairseq's rule that also covers even ``k``.
    """
    if causal:
        return kernel_width - 1, 0
    return (kernel_width - 1) // 2, kernel_width // 2


def conv_glu_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    *,
    causal: bool,
    residual: Optional[torch.Tensor] = None,
    scale: Optional[float] = None,
    pad_mask: Optional[torch.Tensor] = None,
    packed: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Convolution of width k to 2C channels, GLU, then optionally ``(out + residual) * scale``.

    Shapes: ``x (B, T, C_in)``, ``weight (k, C_in, 2C)``, ``bias (2C,)``,
    ``residual (B, T, C)``, ``pad_mask (B, T)`` bool, True where the input is padding
    (those input steps are zeroed before the convolution, as fairseq's encoder does).
    Returns ``(B, T, C)``. ``packed`` (the cpp kernel's copy of ``weight``) is ignored.

    PyTorch equivalent (channels-first)::

        F.glu(F.conv1d(F.pad(x.mT, conv_padding(k, causal)), weight.permute(2, 1, 0), bias), dim=1).mT
    """
    k = weight.shape[0]
    if pad_mask is not None:
        x = x.masked_fill(pad_mask.unsqueeze(-1), 0.0)
    left, right = conv_padding(k, causal)
    pre = F.conv1d(F.pad(x.transpose(1, 2), (left, right)), weight.permute(2, 1, 0), bias)
    out = F.glu(pre, dim=1).transpose(1, 2)
    if residual is not None:
        out = out + residual
    if scale is not None:
        out = out * scale
    return out
