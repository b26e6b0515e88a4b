"""The work and traffic of generation, counted from a model's shapes: FLOPs of incremental beam
search and the bytes of decoder weights a decoding step streams. The speed table and the
generation benchmarks read achieved rates (and fractions of the measured peaks) from them."""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from convs2s.engine import prepare
from convs2s.flops import weight_elements


def generation_flops(model, source_lengths: Sequence[int], target_lengths: Sequence[int], beam: int,
                     folded: bool = False) -> float:
    """FLOPs of incremental beam search: the encoder once per source token, every decoder layer,
    attention product and the vocabulary projection once per step and beam row (EOS included).
    ``folded``: the work of the folded-attention decoder instead, whose attention projections are
    multiplied into the encoder's keys and values once per sentence (z_in = z @ W_in, y_out = y @
    W_out^T, each 2 * S * E * C), leaving per step and row the scores and the context over C
    channels (4 * S * C a layer) in place of the projections and the products over E."""
    p_enc = weight_elements(model.encoder)
    p_dec = weight_elements(model.decoder)
    e = model.cfg.encoder_embed_dim
    n_att = model.cfg.num_attention_layers
    if folded:
        layers = [a for a in model.decoder.attention if a is not None]
        p_dec -= sum(weight_elements(a) for a in layers)  # the in / out projections
        channels = sum(a.out_projection.weight.shape[0] for a in layers)  # C of every attention layer
    total = 0.0
    for s_len, t_len in zip(source_lengths, target_lengths):
        s = s_len + 1  # EOS
        if folded:
            total += 2.0 * p_enc * s + 4.0 * s * e * channels + beam * t_len * (2.0 * p_dec + 4.0 * s * channels)
        else:
            total += 2.0 * p_enc * s + beam * t_len * (2.0 * p_dec + 4.0 * s * e * n_att)
    return total


def decoder_step_bytes(model, vocab_rows: Optional[int] = None) -> int:
    """Bytes of decoder weights one decoding step must stream, at the dtype they are stored in
    (int8 plus a float32 scale per row where int8 decoding is on); ``vocab_rows`` counts only
    that many rows of the output layer (a shortlist). Embeddings are gathered rows: not counted."""
    total = 0
    for name, module in model.decoder.named_modules():
        weight = getattr(module, "weight", None)
        if not isinstance(weight, torch.Tensor) or weight.dim() < 2 or "embed_" in name:
            continue
        derived = prepare(model).derived(module)
        quantized = None if derived is None else derived.int8_weight()
        if quantized is not None:
            q, scale = quantized
            n_bytes = q.numel() * q.element_size() + scale.numel() * scale.element_size()
        else:
            n_bytes = weight.numel() * weight.element_size()
        if name == "fc3" and vocab_rows is not None:
            n_bytes = n_bytes * vocab_rows // weight.shape[0]
        total += n_bytes
    return total
