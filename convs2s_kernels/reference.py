"""The pure-PyTorch references of every op, in one namespace (``convs2s_kernels.reference.*_ref``).

Each reference lives with its op (``convs2s_kernels/ops/<op>/reference.py``); they are the ground
truth every other backend is tested against, and the dispatcher's last fallback. They favour
clarity over speed and support autograd. Layout is batch-major ``(B, T, C)`` everywhere;
convolution weights use fairseq's ConvTBC layout ``(k, C_in, 2C)``.
"""

from .ops import (attention_embsum_ref, attention_step_ref, beam_candidates_ref, beam_update_ref, conv_glu_ref, conv_padding, conv_step_ref, decoder_step_ref,
                  linear_int8_ref, linear_ref, linear_w8a8_ref, output_loss_ref, dropout_ref, grad_norm_ref, quantize_int8, quantize_rows_int8, search_rules_ref,
                  source_key_mask)

__all__ = [
    "conv_padding",
    "conv_glu_ref",
    "attention_embsum_ref",
    "attention_step_ref",
    "conv_step_ref",
    "source_key_mask",
    "quantize_int8",
    "linear_ref",
    "linear_int8_ref",
    "quantize_rows_int8",
    "linear_w8a8_ref",
    "output_loss_ref",
    "dropout_ref",
    "grad_norm_ref",
    "decoder_step_ref",
    "beam_candidates_ref",
    "search_rules_ref",
    "beam_update_ref",
]
