"""The compute types a prepared model can decode in (:func:`convs2s.engine.prepare`'s
``compute_type``): the float dtypes and the int8 variants, each a model dtype and a quantisation.
Which one is fastest on a machine is measured by :mod:`convs2s.compute_type`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass(frozen=True)
class Variant:
    """One way to compute a decoding: the model's float dtype and, for int8, the decoder's (and
    optionally the encoder's) quantisation (``convs2s.engine.PreparedModel.quantize_decoder_int8``)."""

    name: str
    dtype: torch.dtype = torch.float32
    activations: Optional[str] = None  # None: float weights; "int8" / "int7" / "float" (weight-only)
    weight_bits: int = 8               # the decoder's; the encoder keeps 8 (7 cost 0.81 BLEU there)
    encoder: bool = False              # the encoder quantised alike

    @property
    def int8(self) -> bool:
        return self.activations is not None


FLOAT_VARIANTS = {"fp32": Variant("fp32"), "bf16": Variant("bf16", torch.bfloat16)}
# the int8 variants whose BLEU cost was measured within 0.3 on the Multi30k models
# (bench/results/amd-zen3-2c/README.md, bench/results/amd-zen5-2c/README.md)
INT8_VARIANTS = {
    "int8": Variant("int8", activations="int8"),
    "int8w": Variant("int8w", activations="float"),
    "int7": Variant("int7", activations="int7"),
    "w7a7": Variant("w7a7", activations="int7", weight_bits=7),
    "int8e": Variant("int8e", activations="int8", encoder=True),
    "int7e": Variant("int7e", activations="int7", encoder=True),
    "w7a7e": Variant("w7a7e", activations="int7", weight_bits=7, encoder=True),
}
VARIANTS = {**FLOAT_VARIANTS, **INT8_VARIANTS}
