"""``decoder_step``: every decoder layer of one decoding step in one call, per backend, at the
widths of the WMT'14 En-De decoder (``fconv_wmt_en_de``: 9 layers of 512, 4 of 1024, 2 of 2048
with kernel width 1, attention in every layer, the residual projected where the width changes;
``fc1`` gives the first layer its 512 inputs), a batch of one sentence at beam 1 and 5 and of 8
sentences at beam 5, source length 30. The reference is the Python loop over the other ops'
references (conv step, folded attention, residuals); ``cpp-packed`` reads each float weight in
the cpp kernels' layout (``pack_conv_step_weight`` / ``pack_linear_weight``), as a prepared
decoder does. The layers' weights rotate between copies filling eight times the last-level
cache, so that each round meets them in memory, as a step does."""

import math

import pytest
import torch

import convs2s_kernels as ck

from convs2s_bench.harness import DTYPES, copies_to_stream, record, run_timed, shapes

# (C, k) per layer; the residual comes from one layer back
LAYERS = shapes(paper=[(512, 3)] * 9 + [(1024, 3)] * 4 + [(2048, 1)] * 2, smoke=[(16, 3), (24, 3), (24, 1)])
WIDTHS_IN = [LAYERS[0][0]] + [c for c, _ in LAYERS[:-1]]  # each layer's input width
CASES = shapes(paper=[(1, 1), (1, 5), (8, 5)], smoke=[(1, 1), (2, 3)])  # (sentences, beam)
SOURCE = shapes(paper=30, smoke=5)


def decoder_layers(B, S, dtype, device, packed):
    layers = []
    for (c, k), c_in in zip(LAYERS, WIDTHS_IN):
        w = (torch.randn(k, c_in, 2 * c, device=device) / math.sqrt(k * c_in)).to(dtype)
        b = (0.1 * torch.randn(2 * c, device=device)).to(dtype)
        proj = {}
        if c_in != c:
            proj = dict(proj_weight=(torch.randn(c, c_in, device=device) / math.sqrt(c_in)).to(dtype),
                        proj_bias=(0.1 * torch.randn(c, device=device)).to(dtype))
        if packed:
            proj.update(conv_packed=ck.pack_conv_step_weight(w))
            if "proj_weight" in proj:
                proj.update(proj_packed=ck.pack_linear_weight(proj["proj_weight"]))
        att = ck.StepAttention(torch.randn(B, S, c, device=device, dtype=dtype) / math.sqrt(c),
                               torch.randn(B, S, device=device, dtype=dtype),
                               torch.randn(B, S, c, device=device, dtype=dtype),
                               (0.1 * torch.randn(c, device=device)).to(dtype))
        layers.append(ck.StepLayer(w, b, None, 1, attention=att, **proj))
    return layers


def weight_bytes(layers):
    return sum(t.numel() * t.element_size() for layer in layers
               for t in (layer.conv_weight, layer.conv_bias, layer.proj_weight, layer.proj_bias) if t is not None)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("B,beam", CASES, ids=[f"B{b}_beam{k}" for b, k in CASES])
@pytest.mark.parametrize("backend", ["reference", "cpp", "cpp-packed"])
def test_decoder_step(benchmark, runnable, peaks, device, backend, B, beam, dtype_name):
    dtype, packed = DTYPES[dtype_name], backend == "cpp-packed"
    backend = "cpp" if packed else backend
    N, S = B * beam, SOURCE
    first = decoder_layers(B, S, dtype, device, packed)
    x = torch.randn(N, WIDTHS_IN[0], device=device, dtype=dtype)
    states = [torch.randn(N, k - 1, c_in, device=device, dtype=dtype) for (_, k), c_in in zip(LAYERS, WIDTHS_IN)]
    emb = torch.randn(B, beam, S, device=device, dtype=dtype)
    pad = torch.zeros(B, S, dtype=torch.bool, device=device)
    lengths = torch.full((B,), S, device=device)
    # a beam reorder: each sentence's beams in reverse (parents stay within their sentence)
    parents = (torch.arange(B, device=device)[:, None] * beam + torch.arange(beam, device=device).flip(0)).view(-1)
    runnable(backend, "decoder_step", x, states, first, emb, pad, lengths, parents)
    copies = [first] + [decoder_layers(B, S, dtype, device, packed)
                        for _ in range(copies_to_stream(weight_bytes(first), device) - 1)]
    benchmark.group = f"decoder_step B{B} beam{beam} {dtype_name}"
    turn = iter(range(1 << 62))

    def step():
        layers = copies[next(turn) % len(copies)]
        with torch.no_grad():
            return ck.decoder_step(x, states, layers, emb, pad, lengths, parents, backend=backend)

    run_timed(benchmark, step, device)
    flops = sum(2.0 * N * (k * c_in * 2 * c + (c_in * c if c_in != c else 0) + 2 * S * c)
                for (c, k), c_in in zip(LAYERS, WIDTHS_IN))
    # the weights, and per layer each sentence's z_in and y_out (B, S, C) and z_bias (B, S)
    folded = sum(x.element_size() * (2 * B * S * c + B * S) for c, _ in LAYERS)
    record(benchmark, flops=flops, bytes_moved=weight_bytes(first) + folded, peaks=peaks, dtype_name=dtype_name)
