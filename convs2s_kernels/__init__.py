"""convs2s_kernels: fused kernels for ConvS2S (Gehring et al. 2017).

Public ops (each takes ``backend=`` "auto" | "triton" | "cpp" | "reference", or a preference list
such as "cpp,reference"; ``None`` means "auto", whose default the ``CONVS2S_KERNELS_BACKEND``
environment variable can set), one folder each under ``convs2s_kernels/ops/``:

* :func:`conv_glu` — convolution (causal or centred) + GLU + bias + residual + scale;
* :func:`attention_embsum` — softmax(q z^T) over source positions, values z + e, sqrt(s) scale;
* :func:`attention_step` — a decoding step of an attention layer folded into the encoder outputs,
  with the layer's residual (Triton on GPUs; the CPU's one-call :func:`decoder_step` folds it in C++);
* :func:`conv_step` — one incremental decoding step with beam reorder of the conv state
  (:func:`pack_conv_step_weight` lays the weight out for its cpp kernel once);
* :func:`linear` — ``x @ weight.T + bias`` for the few rows of a decoding step
  (:func:`pack_linear_weight` lays the weight out for its cpp kernel once);
* :func:`linear_int8` — the same with int8 weights (:func:`quantize_int8`), for decoding;
* :func:`linear_w8a8` — int8 weights and int8 activations (each row quantised on the fly;
  :func:`pack_w8a8_weight` lays the weight out for its kernels once);
* :func:`decoder_step` — every decoder layer of one decoding step in one call;
* :func:`beam_candidates` — a beam-search step: log-softmax, the search's rules, top ``2 * beam``;
* :func:`beam_update` — the rest of it: finished hypotheses recorded, every beam advanced.

and for training:

* :func:`output_loss` — the output projection and the label-smoothed cross-entropy, a block of rows at a time;
* :func:`dropout` — dropout whose mask is a hash of a seed and the element's index;
* :func:`grad_norm` — the global L2 norm of every gradient, in one pass;
* :func:`nag_step` — one Nesterov step over every parameter, normalisation and clipping folded in.

Each has a pure-PyTorch twin ``<op>_ref`` (also in :mod:`convs2s_kernels.reference`).
"""

from . import extension  # noqa: F401  (the cpp backend's availability)
from .dispatch import BackendUnavailableError, available_backends, count_dispatches, requested_backends
from .dispatch import reasons as backend_reasons
from .ops import (BeamCandidates, StepAttention, StepLayer, attention_embsum, attention_embsum_ref, attention_step,
                  attention_step_ref, beam_candidates,
                  beam_candidates_ref, beam_update, beam_update_ref, FinishedHypotheses, conv_glu, conv_glu_ref,
                  conv_step, conv_step_ref, decoder_step, decoder_step_ref, linear, linear_int8, linear_int8_ref,
                  linear_ref, linear_w8a8, linear_w8a8_ref, output_loss, output_loss_ref, dropout, dropout_ref, nag_step, nag_step_ref, grad_norm, grad_norm_ref, pack_conv_step_weight, pack_linear_weight,
                  pack_w8a8_weight, quantize_int8, quantize_rows_int8)
from . import reference
from .buckets import warmup
from . import triton_backend  # noqa: F401  (registers the Triton kernels, or records why they cannot run)

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "conv_glu", "attention_embsum", "attention_step", "conv_step", "linear", "linear_int8", "linear_w8a8", "decoder_step",
    "beam_candidates", "beam_update", "output_loss", "output_loss_ref", "dropout", "dropout_ref", "nag_step", "nag_step_ref", "grad_norm", "grad_norm_ref",
    "conv_glu_ref", "attention_embsum_ref", "attention_step_ref", "conv_step_ref", "linear_ref", "linear_int8_ref", "linear_w8a8_ref",
    "decoder_step_ref", "beam_candidates_ref", "beam_update_ref",
    "quantize_int8", "quantize_rows_int8", "pack_w8a8_weight", "pack_conv_step_weight", "pack_linear_weight",
    "StepLayer", "StepAttention", "BeamCandidates", "FinishedHypotheses",
    "available_backends", "backend_reasons", "requested_backends", "count_dispatches",
    "BackendUnavailableError", "reference", "warmup",
]
