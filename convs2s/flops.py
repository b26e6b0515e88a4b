"""The work of training, counted from a model's shapes: the products of a forward and backward
pass per batch, so ``convs2s train`` and the benchmarks can report an update's FLOP/s beside the
machine's measured GEMM rate."""

from __future__ import annotations

import time
from typing import Sequence

import torch


def weight_elements(module: torch.nn.Module) -> int:
    """Multiply-accumulates per row of the module's linear and convolution layers (embeddings are
    lookups, gains and biases negligible)."""
    return sum(p.numel() for name, p in module.named_parameters()
               if p.dim() >= 2 and "embed_" not in name and not name.endswith("weight_g"))


def width3_conv_elements(module: torch.nn.Module) -> int:
    """Multiply-accumulates per row of the module's kernel-width-3 convolutions (weights (3, C_in, 2C))."""
    return sum(p.numel() for name, p in module.named_parameters()
               if p.dim() == 3 and p.shape[0] == 3 and not name.endswith("weight_g"))


def training_flops(model, source_lengths: Sequence[int], target_lengths: Sequence[int], conv_tile: int = 0) -> float:
    """FLOPs of one forward and backward pass over sentences of these lengths (EOS included), pads
    not counted: every linear and convolution layer once per token, each attention layer's scores
    and context (``4 * S * E`` per target token); the backward twice the forward (the gradients of
    the inputs and of the weights), as is usual. ``conv_tile = m``: the products actually run when
    the width-3 convolutions are Winograd's F(m, 3) ((m + 2) / 3m of them; partial tiles not
    counted), else the model's."""
    p_enc, p_dec = weight_elements(model.encoder), weight_elements(model.decoder)
    if conv_tile:
        kept = (conv_tile + 2) / (3.0 * conv_tile)
        p_enc -= (1 - kept) * width3_conv_elements(model.encoder)
        p_dec -= (1 - kept) * width3_conv_elements(model.decoder)
    e, n_att = model.cfg.encoder_embed_dim, model.cfg.num_attention_layers
    forward = sum(2.0 * p_enc * s + 2.0 * p_dec * t + 4.0 * s * t * e * n_att
                  for s, t in zip(source_lengths, target_lengths))
    return 3.0 * forward


def gemm_gflops(n: int = 1024, repeats: int = 10) -> float:
    """The best GFLOP/s of an fp32 ``n^3`` matmul on this machine's CPU threads: the rate the
    training's products run at when the libraries run them at their best. Best of ``repeats``
    after two warm-ups: the first products also start the library's thread pool and the clocks."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    out = torch.empty(n, n)
    for _ in range(2):  # warm-up: allocation, library dispatch, threads
        torch.mm(a, b, out=out)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b, out=out)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n ** 3 / best / 1e9
