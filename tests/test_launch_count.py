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
    assert launches == {"_conv_step_fwd_kernel": 3, "_attention_step_kernel": 3}  # each one per decoder layer
    reference = count_generation(model, [[5, 6, 7, 8]] * 2, beam=3, steps=4, backend="reference")
    # each layer's conv step: one Triton launch in place of the reference's ATen kernels
    assert counts.per_step()[step] < reference.per_step()[step]


def test_the_decoding_step_launches_no_more_than_today(model):
    """Issue 50's ceiling on the GPU's program (Triton kernels, ATen elsewhere), to be lowered as the
    fused step lands (target: a few dozen kernels for 15 layers): each decoder layer one conv-step
    and one attention-step launch and nothing else; the whole step as counted in the closing note."""
    require_or_skip("triton")
    counts = count_generation(model, [[5, 6, 7, 8]] * 2, beam=3, steps=5, backend="triton,reference")
    step, records = steady_step(counts)
    layers = Counter()
    for (component, k, op), n in records.items():
        if component in ("weights.conv_step", "state.step", "step._layers_step") and k not in ("view", "alloc"):
            layers[(k, op)] += n
    assert layers == {("triton", "_conv_step_fwd_kernel"): 3, ("triton", "_attention_step_kernel"): 3}
    assert counts.per_step()[step] <= 97  # 72 kernels, 19 copies, 6 Triton launches (3 layers)
