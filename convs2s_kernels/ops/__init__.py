"""The fused ops, one folder each (public function, reference, backend glue, capabilities).

Importing this package registers every op's ``reference`` and ``cpp`` implementations; the
Triton ones are registered by :mod:`convs2s_kernels.triton_backend` when Triton can be imported.
"""

from .beam_candidates import BeamCandidates, beam_candidates, beam_candidates_ref, search_rules_ref
from .beam_update import FinishedHypotheses, beam_update, beam_update_ref
from .attention_embsum import attention_embsum, attention_embsum_ref, source_key_mask
from .attention_step import attention_step, attention_step_ref
from .conv_glu import conv_glu, conv_glu_ref, conv_padding
from .conv_step import conv_step, conv_step_ref, pack_conv_step_weight
from .decoder_step import StepAttention, StepLayer, decoder_step, decoder_step_ref
from .linear import linear, linear_ref, pack_linear_weight
from .linear_int8 import linear_int8, linear_int8_ref, quantize_int8
from .output_loss import output_loss, output_loss_ref
from .dropout import dropout, dropout_ref
from .nag_step import nag_step, nag_step_ref
from .grad_norm import grad_norm, grad_norm_ref
from .linear_w8a8 import linear_w8a8, linear_w8a8_ref, pack_w8a8_weight, quantize_rows_int8

# the ops with a Triton backend (their folders hold triton.py)
TRITON_OPS = ("conv_glu", "attention_embsum", "conv_step", "attention_step", "beam_candidates", "beam_update")

__all__ = [
    "conv_glu", "attention_embsum", "attention_step", "conv_step", "linear", "linear_int8", "linear_w8a8", "decoder_step", "output_loss", "dropout", "nag_step", "grad_norm",
    "beam_candidates", "beam_update",
    "conv_glu_ref", "attention_embsum_ref", "attention_step_ref", "conv_step_ref", "linear_ref", "linear_int8_ref", "linear_w8a8_ref", "output_loss_ref", "dropout_ref", "nag_step_ref", "grad_norm_ref",
    "decoder_step_ref",
    "beam_candidates_ref", "search_rules_ref", "beam_update_ref",
    "BeamCandidates", "FinishedHypotheses", "conv_padding", "source_key_mask", "quantize_int8", "quantize_rows_int8", "pack_w8a8_weight", "pack_conv_step_weight", "pack_linear_weight", "StepLayer",
    "StepAttention", "TRITON_OPS",
]
