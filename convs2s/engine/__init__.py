"""The decoding engine: a model prepared once for decoding (:func:`prepare`), owning what decoding
derives from the weights (int8, packed copies, huge pages) and the step programs that run on them
(op by op, the one-call cpp step, the recorded CUDA-graph step).

| module | holds |
|---|---|
| ``prepared`` | :class:`PreparedModel`, :func:`prepare`, the int8 settings, the inference encoder |
| ``weights`` | :class:`DerivedWeights` (one layer's int8 and packed copies) and the products on them |
| ``state`` | :class:`DecoderState` and the folded attention |
| ``step`` | the step, op by op |
| ``fused`` | the step in one C++ call (``convs2s_kernels.decoder_step``) |
| ``graph``, ``recorded_search`` | a step recorded once and replayed (CUDA graphs) |
| ``shapes`` | the weight shapes the kernel choice is measured for |
| ``variants`` | the compute types :func:`prepare` applies (``VARIANTS``: fp32, bf16, the int8 variants) |
"""

from .prepared import INT8_ACTIVATIONS, PreparedModel, prepare, quantize_decoder_int8, quantize_encoder_int8
from .state import DecoderState

__all__ = ["INT8_ACTIVATIONS", "DecoderState", "PreparedModel", "prepare", "quantize_decoder_int8",
           "quantize_encoder_int8"]
