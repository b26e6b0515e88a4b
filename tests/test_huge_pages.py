"""Weights a decoding step streams, on 2 MB huge pages (``convs2s_kernels.huge_pages``): the same
values in 2 MB-aligned memory, small or non-CPU tensors left alone, and the decoder moving its
Linear weights there when it prepares to decode on the CPU."""

import pytest
import torch

from convs2s.model import build_model
from convs2s_kernels.huge_pages import MIN_BYTES, move_to_huge_pages, on_huge_pages
from harness import require_or_skip
from convs2s.engine import prepare

HUGE = 2 << 20


@pytest.fixture(autouse=True)
def cpp():
    require_or_skip("cpp")


def test_a_big_tensor_is_copied_onto_aligned_memory_and_a_small_one_is_left():
    big = torch.randn(MIN_BYTES // 4 + 5)
    moved = on_huge_pages(big)
    assert moved is not big and torch.equal(moved, big) and moved.data_ptr() % HUGE == 0
    small = torch.randn(100)
    assert on_huge_pages(small) is small
    strided = torch.randn(2, MIN_BYTES // 4)[:, ::2]
    assert torch.equal(on_huge_pages(strided), strided) and on_huge_pages(strided).is_contiguous()


def test_a_parameter_keeps_its_identity_and_moves_once():
    p = torch.nn.Parameter(torch.randn(1024, 1024))
    values = p.detach().clone()
    move_to_huge_pages(p)
    ptr = p.data_ptr()
    assert ptr % HUGE == 0 and torch.equal(p.detach(), values) and p.requires_grad
    move_to_huge_pages(p)
    assert p.data_ptr() == ptr  # already there: not copied again
    p.data = torch.randn(1024, 1024)  # new data: moved again next time
    move_to_huge_pages(p)
    assert p.data_ptr() % HUGE == 0 and p.data_ptr() != ptr


def test_the_decoder_streams_its_linear_weights_and_packed_convolutions_from_huge_pages():
    # a 512-channel conv: its packed weight (3 x 512 x 1024 floats, 6 MB) is big enough to move
    model = build_model("fconv_iwslt_de_en", 50, 8000, decoder_layers="[(512, 3)]").fold_weight_norm().eval()
    fc3 = model.decoder.fc3.weight  # 8000 x 256 floats: 8 MB
    before = fc3.detach().clone()
    with torch.no_grad():
        prepare(model).init_decoder_state(prepare(model).encode(torch.tensor([[5, 6, 2]])), beam=2)
        conv = prepare(model).derived(model.decoder.convolutions[0])
        packed = conv.step_packed()
    assert model.decoder.fc3.weight is fc3 and fc3.data_ptr() % HUGE == 0 and torch.equal(fc3.detach(), before)
    assert packed is not None and packed.numel() * packed.element_size() >= MIN_BYTES
    assert packed.data_ptr() % HUGE == 0
    model.train()
    assert conv.step_packed() is None  # training reads the weight itself
    assert conv.packed_now is None  # and the packed copy is let go
