"""The launch counter of issue 50: what a decoding step would launch on a GPU, counted on the CPU."""

import os
from collections import Counter

import pytest
import torch

from convs2s_bench.launch_count import Counts, count_generation, format_step, kind, steady_step

from conftest import tiny_fconv
from harness import require_or_skip

aten = torch.ops.aten


@pytest.fixture
def model():
    return tiny_fconv(16, 3, 30)


def test_kinds():
    assert kind(aten.view.default) == kind(aten.t.default) == kind(aten.detach.default) == "view"
    assert kind(aten.empty.memory_format) == kind(aten.empty_strided.default) == "alloc"
    assert kind(aten.clone.default) == kind(aten.copy_.default) == kind(aten._to_copy.default) == "copy"
    assert kind(aten.mm.default) == kind(aten.topk.default) == kind(aten.fill_.Scalar) == "kernel"


def test_every_steady_step_launches_the_same_and_the_counts_add_up(model):
    counts = count_generation(model, [[5, 6, 7, 8]] * 2, beam=3, steps=5, backend="reference")
    per_step = counts.per_step()
    steady = [per_step[s] for s in range(1, 5)]
    assert len(set(steady)) == 1 and steady[0] > 0  # the same ops every step
    step, records = steady_step(counts)
    assert sum(n for (_, k, _), n in records.items() if k != "view" and k != "alloc") == per_step[step]
    table = format_step(records)
    assert table.splitlines()[-1].startswith("| **step** |") and "generate." in table


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the Triton kernels run in the interpreter here")
def test_triton_launches_are_counted_once_each_and_the_interpreters_own_work_not_at_all(model):
    import convs2s_kernels as ck

    if ck.available_backends()["triton"] is not None:
        pytest.fail(f"triton is required here: {ck.available_backends()['triton']}")
    counts = count_generation(model, [[5, 6, 7, 8]] * 2, beam=3, steps=4, backend="triton,reference")
    step, records = steady_step(counts)
    launches = {op: n for (_, k, op), n in records.items() if k == "triton"}
    # each one per decoder layer; the search's three once a step
    assert launches == {"_conv_step_fwd_kernel": 3, "_attention_step_kernel": 3, "_row_candidates_kernel": 1,
                        "_merge_candidates_kernel": 1, "_beam_update_kernel": 1}
    reference = count_generation(model, [[5, 6, 7, 8]] * 2, beam=3, steps=4, backend="reference")
    # each layer's conv step: one Triton launch in place of the reference's ATen kernels
    assert counts.per_step()[step] < reference.per_step()[step]


def test_the_decoding_step_launches_no_more_than_today(model):
    """Issue 50's ceiling on the GPU's program (Triton kernels, ATen elsewhere): each decoder layer
    one conv-step and one attention-step launch and nothing else; the whole step as counted in
    bench/results/launch-count-2026-11-27.md."""
    require_or_skip("triton")
    counts = count_generation(model, [[5, 6, 7, 8]] * 2, beam=3, steps=5, backend="triton,reference")
    step, records = steady_step(counts)
    layers = Counter()
    for (component, k, op), n in records.items():
        if component in ("weights.conv_step", "state.step", "step._layers_step") and k not in ("view", "alloc"):
            layers[(k, op)] += n
    assert layers == {("triton", "_conv_step_fwd_kernel"): 3, ("triton", "_attention_step_kernel"): 3}
    # 6 layer launches, 3 of the search, 7 ATen kernels (embedding, position add, the folded
    # attention's query bmm, 3 output GEMMs, the forced lengths' index), 2 copies (forced lengths, mailbox)
    assert counts.per_step()[step] <= 18


def wmt_en_fr_shaped(vocab: int = 200):
    """fconv_wmt_en_fr's layers (15 a side, kernel widths 3 and 1, the same width changes and so the
    same residual projections) at 1/32 of its widths: the same launches a step, at interpreter speed."""
    import convs2s

    layers = "[(16, 3)] * 6 + [(24, 3)] * 4 + [(32, 3)] * 3 + [(64, 1)] * 1 + [(128, 1)] * 1"
    torch.manual_seed(0)
    return convs2s.build_model("fconv", vocab, vocab, encoder_embed_dim=24, decoder_embed_dim=24,
                               decoder_out_embed_dim=16, encoder_layers=layers, decoder_layers=layers,
                               dropout=0.0).fold_weight_norm().eval()


def test_fconv_wmt_en_fr_steps_launch_at_most_64_kernels():
    """Issue 50's target: a step of fconv_wmt_en_fr's GPU program (Triton kernels, ATen elsewhere)
    launches at most 64 kernels, each decoder layer one conv-step and one attention-step launch,
    the search three."""
    require_or_skip("triton")
    counts = count_generation(wmt_en_fr_shaped(), [[5, 6, 7, 8, 9]] * 2, beam=5, steps=4, backend="triton,reference")
    step, records = steady_step(counts)
    launches = Counter({op: n for (_, k, op), n in records.items() if k == "triton"})
    assert launches == {"_conv_step_fwd_kernel": 15, "_attention_step_kernel": 15, "_row_candidates_kernel": 1,
                        "_merge_candidates_kernel": 1, "_beam_update_kernel": 1}
    assert counts.per_step()[step] <= 64, format_step(records)
