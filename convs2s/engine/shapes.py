"""The weights one decoding step (and one encoding of a short batch) multiplies, named as the
kernel choice keys them (:mod:`convs2s_kernels.tune`), so that the model can have the few-row
kernels measured against the GEMM for exactly its shapes before it translates."""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
import torch.nn as nn

from convs2s_kernels.tune import Shape, stream_mb, w8a8_has_choice

from ..layers import ConvTBCWeight, WeightNormed

_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16"}


def _dims(module: nn.Module, packed: bool = False) -> Optional[Tuple[str, int, int]]:
    """``(form, K, N)`` of a float step's product with ``module``'s weight: a conv weight is
    (K, N) = (k * C_in, 2C), a Linear weight (N, K), both form kp where the decoding step reads
    them packed (DerivedWeights.step_packed); None for a plain nn.Linear (fc3 tied to the target
    embedding runs F.linear, never the kernels)."""
    if isinstance(module, ConvTBCWeight):
        return "kp" if packed else "kn", module.kernel_width * module.in_channels, module.out_channels
    if isinstance(module, WeightNormed):
        return "kp" if packed else "nk", module.in_features, module.out_features
    return None


def _weight_bytes(prepared, module: nn.Module) -> int:
    """The bytes of ``module``'s weight that a step reads: the float weight, or the int8 weight
    and its float32 scale per output row."""
    dims = _dims(module)
    if dims is None:
        return module.weight.numel() * module.weight.element_size()
    _, K, N = dims
    return K * N + 4 * N if prepared.derived(module).use_int8 else K * N * module.bias.element_size()


def step_weight_bytes(prepared) -> int:
    """The bytes of weights one step with folded attention reads (:func:`step_weight_modules`)."""
    return sum(_weight_bytes(prepared, m) for m in step_weight_modules(prepared.model.decoder))


def _w8a8_form(d) -> str:
    """The kernel choice's form of a product with int8 weights and activations: w7a8 for 7-bit ones."""
    return "w7a8" if d.int8_activation_bits == 7 else "w8a8"


def _shape(prepared, module: nn.Module, stream: int, packed: bool = False) -> List[Shape]:
    """int8 weights are quantised per output row, (N, K), whatever the float form; with int8
    activations, form w8a8 (the packed int8 kernel or its alternative, tune.w8a8_has_choice), with
    7-bit ones w7a8."""
    dims = _dims(module, packed)
    if dims is None:
        return []
    form, K, N = dims
    d = prepared.derived(module)
    if d.use_int8:
        if d.int8_activations:
            return [Shape(_w8a8_form(d), "int8", K, N, stream)] if w8a8_has_choice() else []
        return [Shape("nk", "int8", K, N, stream)]
    dtype = _DTYPES.get(module.bias.dtype)
    return [] if dtype is None else [Shape(form, dtype, K, N, stream)]  # float64: the kernels do not take it


def step_weight_modules(decoder: nn.Module) -> List[nn.Module]:
    """What a step with folded attention multiplies: fc1, every residual projection and
    convolution, fc2 and fc3, in that order (the attention projections are folded per sentence)."""
    return [decoder.fc1, *[p for p in decoder.projections if p is not None], *decoder.convolutions,
            decoder.fc2, decoder.fc3]


def _shapes_read_together(prepared, modules: List[nn.Module], packed: bool = False) -> List[Shape]:
    """The shapes of ``modules`` that run the kernels, in order (no repeats), each to be timed as
    cold as reading all of them leaves it: after their whole weight set (stream_mb)."""
    stream = stream_mb(sum(_weight_bytes(prepared, m) for m in modules))
    return list(dict.fromkeys(s for m in modules for s in _shape(prepared, m, stream, packed)))


def step_weight_shapes(prepared) -> List[Shape]:
    """The shapes of :func:`step_weight_modules`, timed as cold as the step leaves them, in form kp
    (the step reads its float weights packed: DerivedWeights.step_packed)."""
    return _shapes_read_together(prepared, step_weight_modules(prepared.model.decoder), packed=True)


def fold_weight_shapes(prepared, int8: Optional[bool] = None) -> List[Shape]:
    """The products that fold attention into a sentence's state (convs2s.engine.state.FoldedAttention), each
    layer's: the encoder's keys times W_in and its values times W_out^T, both (E, C) matrices, with
    B * S rows, timed as cold as one fold leaves them. Float weights read packed (form kp:
    DerivedWeights.fold_packed), also under a step with int8 weights and float activations; a step with int8
    weights and activations folds in int8 on the CPU (DerivedWeights.fold_int8: form w8a8 or w7a8, as its own
    products). ``int8``: True or False for those shapes whatever the decoder does now (None)."""
    decoder = prepared.model.decoder
    layers = [a for a in decoder.attention if a is not None]
    dtype = _DTYPES.get(decoder.fc1.bias.dtype)
    if not layers or dtype is None:
        return []
    projection = layers[0].in_projection
    if int8 is None:
        int8 = prepared.derived(projection).folds_int8()
    if int8 and not w8a8_has_choice():
        return []
    form, dtype, element = (_w8a8_form(prepared.derived(projection)), "int8", 1) if int8 else ("kp", dtype, decoder.fc1.bias.element_size())
    stream = stream_mb(sum(2 * a.in_projection.in_features * a.in_projection.out_features * element for a in layers))
    return list(dict.fromkeys(
        Shape(form, dtype, a.in_projection.out_features, a.in_projection.in_features, stream) for a in layers))


def encoder_weight_shapes(prepared) -> List[Shape]:
    """The shapes an encoding multiplies (fc1, residual projections, convolutions, fc2), timed as
    cold as one encoding leaves them, in form kp (translating, the encoder reads its float weights
    packed as the step does: DerivedWeights.step_packed). A sentence or two is a few dozen rows,
    where the few-row kernels can beat the GEMM."""
    encoder = prepared.model.encoder
    return _shapes_read_together(prepared, [encoder.fc1, *[p for p in encoder.projections if p is not None],
                                  *encoder.convolutions, encoder.fc2], packed=True)
