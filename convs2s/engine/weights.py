"""What decoding derives from a layer's weight, kept beside the model rather than in it.

A :class:`DerivedWeights` belongs to one weight-normed layer (:class:`convs2s.layers.Linear` or
:class:`convs2s.layers.ConvTBCWeight`) of a :class:`convs2s.engine.PreparedModel`: its int8
setting and quantised copy, and its float weight packed for the cpp kernels. Each copy is made on
first use and made again once the weight changes (its version counter or identity moves), so a
prepared model follows an optimiser step or ``load_state_dict`` without being prepared again.
The products a decoding step or a short encoding runs with them are functions of this module.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F

import convs2s_kernels as ck
from convs2s_kernels.huge_pages import on_huge_pages
from convs2s_kernels.internal import write_version
from convs2s_kernels.ops.conv_glu import conv_padding

from ..layers import ConvTBCWeight, Linear, derived_copies

# Linear layers only: no dispatch, plain PyTorch (autograd, the float weights).
NO_DISPATCH = "no-dispatch"


class DerivedWeights:
    """One layer's int8 setting and its derived copies (quantised, packed)."""

    use_int8 = False  # multiply by the int8 weight (ConvS2SModel parameters untouched)
    int8_activations = True  # with int8 weights: quantise each row of x too (linear_w8a8), else float x
    int8_activation_bits = 8  # what linear_w8a8 quantises those rows to (8 or 7)
    int8_weight_bits = 8  # what the weight is quantised to (8 or 7: [-63, 63], multiplied faster on AVX2)

    def __init__(self, module):
        self.module = module
        self._packs = {}

    @property
    def bias(self) -> torch.Tensor:
        return self.module.bias

    def weight(self) -> torch.Tensor:
        return self.module.effective_weight()

    # --- int8 ----------------------------------------------------------------------------------
    def int8_product(self):
        """``linear_w8a8`` (int8 activations) or ``linear_int8`` (float32 activations)."""
        return ck.linear_w8a8 if self.int8_activations else ck.linear_int8

    def _int8_matrix(self) -> torch.Tensor:
        """The (N, K) matrix the int8 product multiplies by (per-output-row quantisation): a conv's
        linearised step weight (k * C_in, 2C) transposed, one row per output channel."""
        w = self.weight()
        return w.reshape(-1, w.shape[2]).t() if isinstance(self.module, ConvTBCWeight) else w

    def int8_weight(self) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
        """``(qweight int8 (N, K), scale (N,))`` when int8 is on, quantised once per weight; else None."""
        if not self.use_int8:
            return None
        w = self.weight()
        key = (write_version(w), w.dtype, w.device, self.int8_weight_bits)
        # the source held and compared by identity: a new weight may reuse a freed one's address
        if getattr(self, "_int8_source", None) is not w or self._int8_key != key:
            with derived_copies(self.module):
                self._int8 = ck.quantize_int8(self._int8_matrix(), bits=self.int8_weight_bits)
            self._int8_source, self._int8_key = w, key
        return self._int8

    def packs_int8(self, qweight: torch.Tensor) -> bool:
        """Whether the int8 product takes ``qweight`` packed too: int8 activations, on the CPU."""
        return self.int8_activations and qweight.device.type == "cpu"

    def int8_activation_options(self) -> dict:
        """``linear_w8a8``'s ``activation_bits`` and ``weight_bits`` where not 8 (nothing for ``linear_int8``)."""
        if not self.int8_activations:
            return {}
        options = {"activation_bits": self.int8_activation_bits, "weight_bits": self.int8_weight_bits}
        return {name: bits for name, bits in options.items() if bits != 8}

    def int8_extra(self) -> dict:
        """The int8 product's extra arguments: the bits where not 8 and, on the CPU, ``packed``
        (:func:`convs2s_kernels.pack_w8a8_weight`, once per quantisation)."""
        quantized = self.int8_weight()
        if quantized is None or not self.int8_activations:
            return {}
        extra = self.int8_activation_options()
        if not self.packs_int8(quantized[0]):
            return extra
        if getattr(self, "_int8_packed_for", None) is not quantized:
            with derived_copies(self.module):
                # streamed from memory every step: on huge pages (convs2s_kernels.huge_pages)
                self._int8_packed = on_huge_pages(ck.pack_w8a8_weight(quantized[0]))
            self._int8_packed_for = quantized
        return {**extra, "packed": self._int8_packed}

    # --- packed float copies -------------------------------------------------------------------
    def may_use_inference_copies(self) -> bool:
        """Derived copies serve inference only: no gradients, no autocast (the op would cast the
        weight, and a float32 copy no longer matches it)."""
        m = self.module
        return not m.training and not torch.is_grad_enabled() and not torch.is_autocast_enabled(m.bias.device.type)

    def _inference_pack(self, slot: str, pack) -> Optional[torch.Tensor]:
        """``pack(weight)`` kept in ``slot`` until the weight changes; None where copies may not serve
        (training drops them: they would only hold memory)."""
        if self.module.training:
            self._packs = {}
            return None
        if not self.may_use_inference_copies():
            return None
        w = self.weight()
        key = (write_version(w), w.dtype, w.device)
        source, held_key, held = self._packs.get(slot, (None, None, None))
        if source is not w or held_key != key:  # by identity: a new weight may reuse a freed one's address
            with derived_copies(self.module):
                held = pack(w)
            self._packs[slot] = (w, key, held)
        return held

    @property
    def packed_now(self) -> Optional[torch.Tensor]:
        """The step's packed copy held now (None when none is)."""
        return self._packs.get("step", (None, None, None))[2]

    def _pack_for_step(self, w: torch.Tensor) -> torch.Tensor:
        return ck.pack_conv_step_weight(w) if isinstance(self.module, ConvTBCWeight) else ck.pack_linear_weight(w)

    def step_packed(self) -> Optional[torch.Tensor]:
        """The float weight laid out once for the cpp step kernels (a conv's or a Linear's packing);
        None with int8 weights (the step multiplies those) or where copies may not serve."""
        if self.use_int8:
            return None
        return self._inference_pack("step", self._pack_for_step)

    # --- the attention fold (Linear layers) ----------------------------------------------------
    def fold_packed(self, transposed: bool = False) -> Optional[torch.Tensor]:
        """The float weight packed for the attention fold, whatever the step multiplies: values times
        ``W_out^T`` (the step's own packing) or keys times ``W_in`` (``transposed``: ``W^T`` packed)."""
        if transposed:
            return self._inference_pack("transposed", lambda w: ck.pack_linear_weight(w.t()))
        return self._inference_pack("step", self._pack_for_step)

    def folds_int8(self) -> bool:
        """Whether the fold multiplies this weight in int8: its step multiplies int8 by int8, on the CPU."""
        return self.use_int8 and self.int8_activations and self.bias.device.type == "cpu"

    def fold_int8(self, transposed: bool = False
                  ) -> Optional[Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]]:
        """The fold's int8 operands, quantised as the step's own products are: ``(qweight, scale,
        packed or None)`` of ``W``, or of ``W^T`` per row (``transposed``), kept until the weight
        changes; None where the fold multiplies the float weights (float steps, off the CPU, where
        ``linear_w8a8`` has only its slower reference)."""
        if not (self.folds_int8() and self.may_use_inference_copies()):
            return None
        if not transposed:
            q, s = self.int8_weight()
            return q, s, self.int8_extra().get("packed")
        bits = self.int8_weight_bits

        def quantize_transposed(w: torch.Tensor):
            q, s = ck.quantize_int8(w.t(), bits=bits)
            return q, s, (on_huge_pages(ck.pack_w8a8_weight(q)) if self.packs_int8(q) else None)

        return self._inference_pack(f"fold-int8-{bits}", quantize_transposed)


def cpp_may_run(x: torch.Tensor, backend: Optional[str]) -> bool:
    """Whether a dispatched op on ``x`` may run on the cpp backend (the only one reading packed
    weights): a CPU tensor, and ``backend`` asks for cpp or auto."""
    choices = ck.requested_backends(backend)
    return x.device.type == "cpu" and ("auto" in choices or "cpp" in choices)


def linear(d: Optional[DerivedWeights], module, x: torch.Tensor, backend: Optional[str] = NO_DISPATCH) -> torch.Tensor:
    """``x W^T + b`` for inference: the dispatched ``linear`` op (the packed weight where cpp may run),
    or the int8 product when ``d`` has int8 on; ``NO_DISPATCH`` or a plain ``nn.Linear`` (fairseq's
    tied output layer, ``d`` None) runs ``F.linear``."""
    if d is None or backend == NO_DISPATCH:
        return module(x)
    rows = x.reshape(-1, x.shape[-1])  # (B, T, K) -> (B * T, K): the ops bound rows of a 2-D input
    quantized = d.int8_weight()
    if quantized is not None:
        y = d.int8_product()(rows, *quantized, d.bias, backend=backend, **d.int8_extra())
    else:
        y = ck.linear(rows, d.weight(), d.bias, backend=backend,
                      packed=d.step_packed() if cpp_may_run(x, backend) else None)
    return y.view(*x.shape[:-1], y.shape[-1])


def conv_step(d: DerivedWeights, x: torch.Tensor, state: torch.Tensor, parents: Optional[torch.Tensor],
              backend: Optional[str] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """One decoding step of a convolution: the fused ``conv_step`` op (the packed weight where cpp
    runs), or with int8 weights the same reorder, shift and append, the int8 product and GLU."""
    quantized = d.int8_weight()
    if quantized is None:
        packed = d.step_packed() if cpp_may_run(x, backend) else None  # only cpp reads it
        return ck.conv_step(x, state, d.weight(), d.bias, parents, packed=packed, backend=backend)
    if parents is not None:
        state = state.index_select(0, parents)
    window = torch.cat([state, x.unsqueeze(1)], dim=1)
    pre = d.int8_product()(window.flatten(1), *quantized, d.bias, backend=backend, **d.int8_extra())
    return F.glu(pre, dim=-1), window[:, 1:]


def conv_int8_sequence(d: DerivedWeights, x: torch.Tensor, *, causal: bool, pad_mask: Optional[torch.Tensor] = None,
                       backend: Optional[str] = None) -> torch.Tensor:
    """GLU of the convolution over whole sequences ``x (B, T, C_in)`` with the int8 weight: each
    step's window of k inputs (``conv_glu``'s zero padding, padded steps' inputs zeroed) is one row
    of the int8 product, as a decoding step's is. ``(B, T, C)``: ``conv_glu`` without residual."""
    quantized = d.int8_weight()
    if quantized is None:
        raise RuntimeError("conv_int8_sequence needs int8 on (PreparedModel.quantize_encoder_int8)")
    B, T, C_in = x.shape
    k = d.module.kernel_width
    if pad_mask is not None:
        x = x.masked_fill(pad_mask.unsqueeze(-1), 0.0)
    left, right = conv_padding(k, causal)
    windows = F.pad(x, (0, 0, left, right)).unfold(1, k, 1)  # (B, T, C_in, k): tap j sees step t - left + j
    rows = windows.transpose(2, 3).reshape(B * T, k * C_in)
    pre = d.int8_product()(rows, *quantized, d.bias, backend=backend, **d.int8_extra())
    return F.glu(pre, dim=-1).view(B, T, -1)


def is_weight_layer(module) -> bool:
    """A layer with a derived record: a weight-normed Linear or convolution (not a plain nn.Linear)."""
    return isinstance(module, (Linear, ConvTBCWeight))
