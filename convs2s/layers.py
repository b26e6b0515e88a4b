"""Building blocks with fairseq's parameter names and the paper's initialisation (section 3.5).

Weight normalisation (Salimans & Kingma 2016) is kept as explicit ``weight_g`` / ``weight_v``
parameters, exactly as fairseq's state dicts hold them, and can be folded into a plain
``weight`` for inference (:meth:`WeightNormed.fold_weight_norm`). What decoding derives from
these weights (int8, packed copies) is the engine's (:mod:`convs2s.engine.weights`).
"""

from __future__ import annotations

import contextlib
import math
import warnings
from typing import Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from convs2s_kernels.internal import write_version

SQRT_HALF = math.sqrt(0.5)


def derived_copies(module: nn.Module):
    """Where ``module`` makes its derived copies of a weight (weight norm applied, int8, packed):
    without gradients and outside inference mode, so that a copy made while decoding under
    ``torch.inference_mode()`` is an ordinary tensor (with a version counter), usable afterwards
    with gradients on (a frozen layer's weight saved for backward). Parameters that are inference
    tensors are warned about here, once: only when a copy is made, not on every call."""
    _warn_if_inference_parameters(module)
    stack = contextlib.ExitStack()
    stack.enter_context(torch.inference_mode(False))  # first: leaving inference mode turns gradients back on
    stack.enter_context(torch.no_grad())
    return stack


def _warn_if_inference_parameters(module: nn.Module) -> None:
    """Parameters made under ``torch.inference_mode()`` keep no version counter: the layers' copies
    of them could not see an in-place write (inside inference mode), so say so once."""
    global _WARNED_INFERENCE_PARAMETERS
    if not _WARNED_INFERENCE_PARAMETERS and any(p.is_inference() for p in module._parameters.values() if p is not None):
        _WARNED_INFERENCE_PARAMETERS = True
        warnings.warn("convs2s: this model's parameters are inference tensors (built or loaded under "
                      "torch.inference_mode()); its cached weights cannot see in-place writes to them, so build "
                      "or load it outside inference mode to change its weights later", stacklevel=4)


_WARNED_INFERENCE_PARAMETERS = False


class WeightNormed(nn.Module):
    """A parameter ``W = g * v / ||v||`` with the norm over every dim except ``dim``.

    ``dim`` is the dim ``weight_g`` keeps: 0 for Linear (g is (out, 1)), 2 for fairseq's
    convolutions (g is (1, 1, 2C)), 0 for legacy pre-2018 decoder convolutions (g is (k, 1, 1)).
    """

    def _init_weight_norm(self, v: torch.Tensor, dim: int, enabled: bool = True) -> None:
        self.wn_dim = dim
        if enabled:
            self.weight_v = nn.Parameter(v)
            self.weight_g = nn.Parameter(self._norm(v, dim))
        else:
            self.weight = nn.Parameter(v)

    @staticmethod
    def _norm(v: torch.Tensor, dim: int) -> torch.Tensor:
        dims = [d for d in range(v.dim()) if d != dim]
        return v.norm(dim=dims, keepdim=True)

    @property
    def weight_normed(self) -> bool:
        return "weight_v" in self._parameters

    def effective_weight(self) -> torch.Tensor:
        if not self.weight_normed:
            return self.weight
        v, g = self.weight_v, self.weight_g
        if torch.is_grad_enabled() and (v.requires_grad or g.requires_grad):
            # ATen's fused weight norm (what nn.utils.weight_norm and so fairseq run): one pass each
            # way, where the composition took seven (bench/results/amd-zen3-2c/training-ops.md)
            return torch._weight_norm(v, g, self.wn_dim)
        # Inference: compute W once and reuse it until g or v change (their version counters
        # move on every in-place update, e.g. an optimiser step or load_state_dict).
        key = (write_version(v), write_version(g), v.data_ptr(), g.data_ptr(), v.dtype, v.device, self.wn_dim)
        if getattr(self, "_wn_cache_key", None) != key:
            with derived_copies(self):
                self._wn_cache = (v * (g / self._norm(v, self.wn_dim))).detach()
            self._wn_cache_key = key
        return self._wn_cache

    @torch.no_grad()
    def fold_weight_norm(self) -> None:
        """Replace ``weight_g``/``weight_v`` by the plain ``weight`` they define (inference)."""
        if not self.weight_normed:
            return
        w = self.effective_weight().detach().clone()
        del self.weight_g, self.weight_v
        self._wn_cache = self._wn_cache_key = None
        self.weight = nn.Parameter(w)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # A checkpoint's weight_g shape tells which dim it keeps (legacy decoder convs keep the
        # kernel-tap dim 0); adopt it so both layouts load with strict=True.
        g = state_dict.get(prefix + "weight_g")
        if g is not None and self.weight_normed and g.shape != self.weight_g.shape:
            dim = gain_dim(g.shape, self.weight_v.shape)
            if dim is not None:
                self.wn_dim = dim
                self.weight_g = nn.Parameter(self.weight_g.new_empty(g.shape))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


def gain_dim(g_shape: Sequence[int], v_shape: Sequence[int]) -> Optional[int]:
    """The dim a weight-norm gain of ``g_shape`` keeps for a ``v_shape`` weight, or None if it fits none.

    fairseq's layouts: Linear (out, 1) keeps 0, convolutions (1, 1, 2C) keep 2, legacy pre-2018
    decoder convolutions (k, 1, 1) keep 0 (all ones: k = 1, taken as 0).
    """
    if len(g_shape) != len(v_shape):
        return None
    kept = [d for d, n in enumerate(g_shape) if n != 1] or [0]
    if len(kept) != 1 or g_shape[kept[0]] != v_shape[kept[0]]:
        return None
    return kept[0]


class Linear(WeightNormed):
    """Weight-normed linear layer: ``weight_v (out, in)``, ``weight_g (out, 1)``, ``bias (out,)``.

    Init: ``N(0, sqrt((1 - p) / in))``, bias 0, where ``p`` is the dropout applied to its input.
    """

    def __init__(self, in_features: int, out_features: int, dropout: float = 0.0, weight_norm: bool = True):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        v = torch.empty(out_features, in_features).normal_(0, math.sqrt((1 - dropout) / in_features))
        self._init_weight_norm(v, dim=0, enabled=weight_norm)
        self.bias = nn.Parameter(torch.zeros(out_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.effective_weight(), self.bias)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, weight_norm={self.weight_normed}"


class ConvTBCWeight(WeightNormed):
    """Weight-normed convolution parameters in fairseq's ConvTBC layout.

    ``weight_v (k, C_in, 2C)``, ``weight_g (1, 1, 2C)``, ``bias (2C,)``. The computation itself
    is a fused op (:func:`convs2s_kernels.conv_glu`; decoding: :func:`convs2s_kernels.conv_step`).
    Init: ``N(0, sqrt(4 (1 - p) / (k C_in)))`` (the 4 compensates GLU's halving), bias 0.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_width: int, dropout: float = 0.0,
                 weight_norm: bool = True):
        super().__init__()
        self.in_channels, self.out_channels, self.kernel_width = in_channels, out_channels, kernel_width
        std = math.sqrt(4 * (1 - dropout) / (kernel_width * in_channels))
        v = torch.empty(kernel_width, in_channels, out_channels).normal_(0, std)
        self._init_weight_norm(v, dim=2, enabled=weight_norm)
        self.bias = nn.Parameter(torch.zeros(out_channels))

    def extra_repr(self) -> str:
        return (f"in={self.in_channels}, out={self.out_channels}, k={self.kernel_width}, "
                f"weight_norm={self.weight_normed}")


def embedding(num_embeddings: int, dim: int, padding_idx: int) -> nn.Embedding:
    """Token or position table: ``N(0, 0.1)``, padding row zero."""
    m = nn.Embedding(num_embeddings, dim, padding_idx=padding_idx)
    nn.init.normal_(m.weight, 0, 0.1)
    with torch.no_grad():
        m.weight[padding_idx].zero_()
    return m


def make_positions(tokens: torch.Tensor, pad: int) -> torch.Tensor:
    """fairseq's positions: non-pad tokens count ``pad+1, pad+2, ...``; pad tokens get ``pad``."""
    mask = tokens.ne(pad).long()
    return torch.cumsum(mask, dim=1) * mask + pad


class GradMultiply(torch.autograd.Function):
    """Identity forward; gradient multiplied by ``scale`` (the encoder's 1 / (2 * #attention))."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad * ctx.scale, None


def residual_sources(spec: Sequence[tuple]) -> list:
    """For each layer, the width of its residual source (None when it has none).

    ``spec`` entries are ``(out_channels, kernel_width, residual)``; residual ``r > 0`` takes
    the output ``r`` layers back (1 = this layer's input, the width list starts with C_0).
    """
    widths = [spec[0][0]]
    sources = []
    for out_channels, _, r in spec:
        sources.append(widths[-r] if r > 0 else None)
        widths.append(out_channels)
    return sources


def conv_stack(spec: Sequence[tuple], dropout: float, weight_norm: bool = True):
    """fairseq's ``projections`` and ``convolutions`` lists for a layer spec.

    A projection exists only where the residual's width differs from the layer's output;
    ``None`` entries keep the list indices equal to layer numbers, as in fairseq's state dicts.
    """
    projections, convolutions = nn.ModuleList(), nn.ModuleList()
    in_channels = spec[0][0]
    for (out_channels, k, _), res_dim in zip(spec, residual_sources(spec)):
        needs_proj = res_dim is not None and res_dim != out_channels
        projections.append(Linear(res_dim, out_channels, weight_norm=weight_norm) if needs_proj else None)
        convolutions.append(ConvTBCWeight(in_channels, 2 * out_channels, k, dropout=dropout, weight_norm=weight_norm))
        in_channels = out_channels
    return projections, convolutions


def residual_input(residuals: list, projection, r: int, product=None):
    """The residual of a layer: the output ``r`` layers back, projected when widths differ
    (``product(projection, x)`` where given: the decoding engine's product, else ``projection(x)``)."""
    if r == 0:
        return None
    res = residuals[-r]
    if projection is None:
        return res
    return projection(res) if product is None else product(projection, res)
