"""Building blocks with fairseq's parameter names and the paper's initialisation (section 3.5).

Weight normalisation (Salimans & Kingma 2016) is kept as explicit ``weight_g`` / ``weight_v``
parameters, exactly as fairseq's state dicts hold them, and can be folded into a plain
``weight`` for inference (:meth:`WeightNormed.fold_weight_norm`).

``backend`` means what it means for every ``convs2s_kernels`` op: a backend request, where None
is the dispatcher's default (``CONVS2S_KERNELS_BACKEND``, else ``auto``). A linear layer has one
more choice, :data:`NO_DISPATCH` (its default): plain ``F.linear`` with autograd and the float
weights, which the full-sequence forward (training, scoring) uses; decoding steps pass a request.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from typing import Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

import convs2s_kernels as ck
from convs2s_kernels.internal import write_version
from convs2s_kernels.huge_pages import on_huge_pages
from convs2s_kernels.ops.conv_glu import conv_padding

SQRT_HALF = math.sqrt(0.5)

# Linear layers only: no dispatch, plain PyTorch (never the int8 weights of a decoding step).
NO_DISPATCH = "no-dispatch"


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

    def train(self, mode: bool = True) -> "WeightNormed":
        """Back to training: the packed copies made for inference (a validation pass makes them)
        are dropped, since the weights will change and training never reads them."""
        if mode:
            self._packs = {}
        return super().train(mode)

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
            return v * (g / self._norm(v, self.wn_dim))
        # Inference: compute W once and reuse it until g or v change (their version counters
        # move on every in-place update, e.g. an optimiser step or load_state_dict).
        key = (write_version(v), write_version(g), v.data_ptr(), g.data_ptr(), v.dtype, v.device, self.wn_dim)
        if getattr(self, "_wn_cache_key", None) != key:
            with derived_copies(self):
                self._wn_cache = (v * (g / self._norm(v, self.wn_dim))).detach()
            self._wn_cache_key = key
        return self._wn_cache

    # --- int8 weights for inference (decoding steps; the encoder without gradients) ---------------
    use_int8 = False  # set by ConvS2SModel.quantize_decoder_int8 / quantize_encoder_int8; never touches the parameters
    int8_activations = True  # with int8 weights: quantise each row of x too (linear_w8a8), else float x
    int8_activation_bits = 8  # what linear_w8a8 quantises those rows to (8 or 7)
    int8_weight_bits = 8  # what the weight is quantised to (8 or 7: [-63, 63], multiplied faster on AVX2)

    def int8_product(self):
        """The op a decoding step multiplies the int8 weight with: ``linear_w8a8`` (int8 activations)
        or ``linear_int8`` (float32 activations)."""
        return ck.linear_w8a8 if self.int8_activations else ck.linear_int8

    def _int8_matrix(self) -> torch.Tensor:
        """The (N, K) matrix a decoding step multiplies by (per-output-row quantisation)."""
        raise NotImplementedError

    def int8_weight(self) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
        """``(qweight int8 (N, K), scale (N,))`` of the effective weight when int8 inference is on,
        quantised once and kept until the weight changes; None when it is off."""
        if not self.use_int8:
            return None
        w = self.effective_weight()
        key = (write_version(w), w.dtype, w.device, self.int8_weight_bits)
        # the source held and compared by identity: a new weight may reuse a freed one's address
        if getattr(self, "_int8_source", None) is not w or self._int8_key != key:
            with derived_copies(self):
                self._int8 = ck.quantize_int8(self._int8_matrix(), bits=self.int8_weight_bits)
            self._int8_source, self._int8_key = w, key
        return self._int8

    def packs_int8(self, qweight: torch.Tensor) -> bool:
        """Whether the int8 products take ``qweight`` packed too (:func:`convs2s_kernels.pack_w8a8_weight`):
        with int8 activations, on the CPU (the cpp kernels' layout)."""
        return self.int8_activations and qweight.device.type == "cpu"

    def int8_activation_options(self) -> dict:
        """``linear_w8a8``'s ``activation_bits`` and ``weight_bits`` where they are not 8, else
        nothing (``linear_int8``, with float activations, takes no such argument)."""
        if not self.int8_activations:
            return {}
        options = {"activation_bits": self.int8_activation_bits, "weight_bits": self.int8_weight_bits}
        return {name: bits for name, bits in options.items() if bits != 8}

    def int8_extra(self) -> dict:
        """The int8 product's extra arguments: with int8 activations, ``activation_bits`` and
        ``weight_bits`` where they are not 8, and on the CPU ``packed`` (the weight in the cpp kernels' layout,
        :func:`convs2s_kernels.pack_w8a8_weight`, made once per quantisation); nothing otherwise."""
        quantized = self.int8_weight()
        if quantized is None or not self.int8_activations:
            return {}
        extra = self.int8_activation_options()
        if not self.packs_int8(quantized[0]):
            return extra
        if getattr(self, "_int8_packed_for", None) is not quantized:
            with derived_copies(self):
                # streamed from memory every step: on huge pages (convs2s_kernels.huge_pages)
                self._int8_packed = on_huge_pages(ck.pack_w8a8_weight(quantized[0]))
            self._int8_packed_for = quantized
        return {**extra, "packed": self._int8_packed}

    def _pack_for_step(self, w: torch.Tensor) -> Optional[torch.Tensor]:
        """``w`` in the layout the cpp decoding-step kernel reads (None where it cannot)."""
        raise NotImplementedError

    def _may_use_inference_copies(self) -> bool:
        """Whether derived copies of the weight may be used now: inference without gradients and
        without autocast (the op casts the weight, a float32 copy no longer matches it)."""
        return (not self.training and not torch.is_grad_enabled()
                and not torch.is_autocast_enabled(self.bias.device.type))

    def _inference_pack(self, slot: str, pack) -> Optional[torch.Tensor]:
        """``pack(weight)``, kept in ``slot`` until the weight changes; None in training (the copies
        are dropped: they would only hold memory), with gradients, or under autocast (the op casts
        the weight, a float32 packing no longer matches it)."""
        if self.training:
            self._packs = {}
            return None
        if not self._may_use_inference_copies():
            return None
        w = self.effective_weight()
        key = (write_version(w), w.dtype, w.device)
        packs = self.__dict__.setdefault("_packs", {})
        source, held_key, held = packs.get(slot, (None, None, None))
        if source is not w or held_key != key:  # by identity: a new weight may reuse a freed one's address
            with derived_copies(self):
                held = pack(w)
            packs[slot] = (w, key, held)
        return held

    @property
    def _packed(self) -> Optional[torch.Tensor]:
        """The step's packed copy held now (None when none is)."""
        return self.__dict__.get("_packs", {}).get("step", (None, None, None))[2]

    def step_packed(self) -> Optional[torch.Tensor]:
        """The float weight laid out once for the cpp decoding step (:meth:`_pack_for_step`: the
        conv step's or the Linear's packing), kept until the weight changes; None with int8
        weights, in training, with gradients, under autocast, or where the cpp kernels cannot
        take it (:meth:`_inference_pack`)."""
        if self.use_int8:  # the step multiplies the int8 weight
            return None
        return self._inference_pack("step", self._pack_for_step)

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

    def _pack_for_step(self, w: torch.Tensor) -> Optional[torch.Tensor]:
        return ck.pack_linear_weight(w)

    def fold_packed(self, transposed: bool = False) -> Optional[torch.Tensor]:
        """The float weight packed for the cpp ``linear`` outside the step, whatever the step
        multiplies (int8 weights too): the attention fold's values times ``W_out^T`` (the step's
        own packing, ``pack_linear_weight(W)``, shared) and keys times ``W_in`` (``transposed``:
        ``pack_linear_weight(W^T)``). Kept until the weight changes (:meth:`_inference_pack`)."""
        if transposed:
            return self._inference_pack("transposed", lambda w: ck.pack_linear_weight(w.t()))
        return self._inference_pack("step", self._pack_for_step)

    def folds_int8(self) -> bool:
        """Whether the attention fold multiplies this layer's weight in int8 (:meth:`fold_int8`): its
        decoding step multiplies int8 by int8, on the CPU."""
        return self.use_int8 and self.int8_activations and self.bias.device.type == "cpu"

    def fold_int8(self, transposed: bool = False
                  ) -> Optional[Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]]:
        """The attention fold's int8 operands where this layer's decoding step multiplies int8 by
        int8 (``use_int8`` with int8 activations), so that the fold is quantised as the step is:
        ``(qweight, scale, packed or None)`` of ``W`` (the step's own), or of ``W^T`` quantised per
        row with the step's weight bits (``transposed``: the keys times ``W_in``), kept until the
        weight changes. None otherwise: in training, with gradients, under autocast, and off the
        CPU (where ``linear_w8a8`` has only its reference, slower than the float product), the fold
        multiplies the float weights."""
        if not (self.folds_int8() and self._may_use_inference_copies()):
            return None
        if not transposed:
            q, s = self.int8_weight()
            return q, s, self.int8_extra().get("packed")
        bits = self.int8_weight_bits

        def quantize_transposed(w: torch.Tensor):
            q, s = ck.quantize_int8(w.t(), bits=bits)
            return q, s, (on_huge_pages(ck.pack_w8a8_weight(q)) if self.packs_int8(q) else None)

        return self._inference_pack(f"fold-int8-{bits}", quantize_transposed)

    def forward(self, x: torch.Tensor, backend: Optional[str] = NO_DISPATCH) -> torch.Tensor:
        """``x W^T + b``: plain ``F.linear`` (``NO_DISPATCH``), or the dispatched ``linear`` op for a
        backend request (None: the dispatcher's default), int8 weights when decoding with them, the
        packed weight (:meth:`step_packed`) where the cpp backend may run it."""
        if backend == NO_DISPATCH:
            return F.linear(x, self.effective_weight(), self.bias)
        rows = x.reshape(-1, x.shape[-1])  # (B, T, K) -> (B * T, K): the ops bound rows of a 2-D input
        quantized = self.int8_weight()
        if quantized is not None:
            y = self.int8_product()(rows, *quantized, self.bias, backend=backend, **self.int8_extra())
        else:
            y = ck.linear(rows, self.effective_weight(), self.bias, backend=backend,
                          packed=self.step_packed() if cpp_may_run(x, backend) else None)
        return y.view(*x.shape[:-1], y.shape[-1])

    def _int8_matrix(self) -> torch.Tensor:
        return self.effective_weight()

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, weight_norm={self.weight_normed}"


class ConvTBCWeight(WeightNormed):
    """Weight-normed convolution parameters in fairseq's ConvTBC layout.

    ``weight_v (k, C_in, 2C)``, ``weight_g (1, 1, 2C)``, ``bias (2C,)``. The computation itself
    is a fused op (:func:`convs2s_kernels.conv_glu` / :func:`convs2s_kernels.conv_step`).
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

    def _pack_for_step(self, w: torch.Tensor) -> Optional[torch.Tensor]:
        return ck.pack_conv_step_weight(w)

    def _int8_matrix(self) -> torch.Tensor:
        # the linearised step weight (k * C_in, 2C), transposed: one quantisation row per output channel
        w = self.effective_weight()
        return w.reshape(-1, w.shape[2]).t()

    def step(self, x: torch.Tensor, state: torch.Tensor, parents: Optional[torch.Tensor],
             backend: Optional[str] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """One decoding step: the fused ``conv_step`` op (reading :meth:`step_packed` where the cpp
        kernel runs), or with int8 weights the same reorder, shift and append followed by the int8
        product (:meth:`int8_product`) and GLU."""
        quantized = self.int8_weight()
        if quantized is None:
            choices = ck.requested_backends(backend)
            packed = self.step_packed() if "auto" in choices or "cpp" in choices else None  # only cpp reads it
            return ck.conv_step(x, state, self.effective_weight(), self.bias, parents, packed=packed, backend=backend)
        if parents is not None:
            state = state.index_select(0, parents)
        window = torch.cat([state, x.unsqueeze(1)], dim=1)
        pre = self.int8_product()(window.flatten(1), *quantized, self.bias, backend=backend, **self.int8_extra())
        return F.glu(pre, dim=-1), window[:, 1:]

    def int8_sequence(self, x: torch.Tensor, *, causal: bool, pad_mask: Optional[torch.Tensor] = None,
                      backend: Optional[str] = None) -> torch.Tensor:
        """GLU of the convolution over whole sequences ``x (B, T, C_in)`` with the int8 weight
        (:meth:`int8_weight`, on when the model is quantised): each step's window of k inputs
        (zero padding as ``conv_glu``'s, the inputs of padded steps zeroed) is one row of the int8 product, as
        one decoding step's is. Returns ``(B, T, C)``; ``conv_glu`` without its residual and scale."""
        quantized = self.int8_weight()
        if quantized is None:
            raise RuntimeError("int8_sequence needs the int8 weight on (ConvS2SModel.quantize_encoder_int8)")
        B, T, C_in = x.shape
        k = self.kernel_width
        if pad_mask is not None:
            x = x.masked_fill(pad_mask.unsqueeze(-1), 0.0)
        left, right = conv_padding(k, causal)
        windows = F.pad(x, (0, 0, left, right)).unfold(1, k, 1)  # (B, T, C_in, k): tap j sees step t - left + j
        rows = windows.transpose(2, 3).reshape(B * T, k * C_in)
        pre = self.int8_product()(rows, *quantized, self.bias, backend=backend, **self.int8_extra())
        return F.glu(pre, dim=-1).view(B, T, -1)


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


def cpp_may_run(x: torch.Tensor, backend: Optional[str]) -> bool:
    """Whether a dispatched op on ``x`` may run on the cpp backend (the only one that reads packed
    weights): a CPU tensor, and ``backend`` asks for cpp or auto."""
    choices = ck.requested_backends(backend)
    return x.device.type == "cpu" and ("auto" in choices or "cpp" in choices)


def apply_linear(module: nn.Module, x: torch.Tensor, backend: Optional[str] = NO_DISPATCH) -> torch.Tensor:
    """``module(x, backend)`` for a :class:`Linear`; a plain ``nn.Linear`` (fairseq's tied output
    layer) always runs ``module(x)``."""
    return module(x, backend) if isinstance(module, Linear) else module(x)


def residual_input(residuals: list, projection, r: int, backend: Optional[str] = NO_DISPATCH):
    """The residual of a layer: the output ``r`` layers back, projected when widths differ."""
    if r == 0:
        return None
    res = residuals[-r]
    return res if projection is None else apply_linear(projection, res, backend)
