"""A decoding step reads nothing back to the host: the search loop is the same on every device,
and on a GPU a host read (``.item()``, ``.tolist()``, ``bool(t)``, ``.nonzero()``, boolean-mask
indexing, data-dependent shapes) waits for the device, so one per step serialises the two.

A ``TorchFunctionMode`` counts those calls during ``generate``; their number must not grow with
the number of decoding steps. The one per-step exception is the search's mailbox
(``convs2s.generate._Mailbox``): a pinned host buffer the device copies into without the host
waiting (on a GPU it is read only once the copy has arrived); its reads are counted apart and
must stay at most one per step.
"""

import pytest
import torch
from torch.overrides import TorchFunctionMode

import convs2s

Tensor = torch.Tensor
READS = {Tensor.item, Tensor.tolist, Tensor.__bool__, Tensor.__int__, Tensor.__float__, Tensor.__index__,
         Tensor.nonzero, torch.nonzero, Tensor.argwhere, torch.argwhere, Tensor.masked_select, torch.masked_select,
         Tensor.unique, torch.unique, Tensor.numpy, Tensor.any, Tensor.all}
INDEXING = {Tensor.__getitem__, Tensor.__setitem__, Tensor.index_put_, Tensor.index_put}


def _has_bool_tensor(index) -> bool:
    items = index if isinstance(index, (tuple, list)) else (index,)
    return any(isinstance(i, Tensor) and i.dtype == torch.bool for i in items)


class HostReads(TorchFunctionMode):
    """Counts the calls that read tensor data back to the host (``reads``), and the mailbox's."""

    def __init__(self):
        super().__init__()
        self.reads, self.mailbox, self.where = 0, 0, []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        if self._reads_host(func, args, result):
            if getattr(args[0], "mailbox", False):
                self.mailbox += 1
            else:
                self.reads += 1
                self.where.append(getattr(func, "__name__", str(func)))
        return result

    @staticmethod
    def _reads_host(func, args, result) -> bool:
        if func in (Tensor.any, Tensor.all):  # only when the answer is used by Python: see __bool__
            return False
        if func in READS:
            return True
        if func in INDEXING:
            return len(args) > 1 and _has_bool_tensor(args[1])
        if func in (torch.repeat_interleave, Tensor.repeat_interleave):
            return len(args) > 1 and isinstance(args[1], Tensor)
        return False


def count_reads(model, sources, forced, beam, **kw):
    steps = []
    with HostReads() as mode:
        hooks = convs2s.Observer(forced_length=forced, on_step=steps.append)
        convs2s.generate(model, sources, beam=beam, max_len_b=max(forced) + 2, observer=hooks, **kw)
    return mode, len(steps) - 1  # the hook is called once before the first step


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return convs2s.build_model("fconv_iwslt_de_en", 40, 40).eval()


@pytest.mark.parametrize("fold_attention", [False, True], ids=["plain", "folded"])
@pytest.mark.parametrize("beam", [1, 5])
def test_host_reads_do_not_grow_with_the_number_of_steps(model, beam, fold_attention):
    # sentences of one batch finishing at different steps, in a short and a long run
    sources = [[5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 16]]
    short, short_steps = count_reads(model, sources, [2, 4, 3], beam, fold_attention=fold_attention)
    long, long_steps = count_reads(model, sources, [9, 20, 14], beam, fold_attention=fold_attention)
    assert long_steps >= short_steps + 15
    assert long.reads == short.reads, (f"{short.reads} host reads in {short_steps} steps but {long.reads} in "
                                       f"{long_steps}; the extra ones: {long.where[len(short.where):][:20]}")
    assert short.reads <= 12, short.where  # setup and the end of the batch only
    for mode, steps in ((short, short_steps), (long, long_steps)):
        assert 1 <= mode.mailbox <= steps + 1


def test_the_counter_sees_host_reads():
    """The mode counts what it should (a counter that saw nothing would pass the test above)."""
    t = torch.arange(6.0)
    with HostReads() as mode:
        t.sum().item()
        bool(t.any())
        t[t > 2] = 0
        t.nonzero()
        t.tolist()
        t.masked_fill_(t > 3, 1.0)  # elementwise: not a read
        t[torch.tensor([0, 1])]  # integer indexing: not a read
    assert mode.reads == 5 and mode.mailbox == 0


def test_greedy_host_reads_do_not_grow_with_the_number_of_steps(model):
    counts = []
    for max_len_b in (3, 25):
        with HostReads() as mode:
            hyps = convs2s.greedy(model, [[5, 6, 7, 8], [9, 10, 11, 12]], max_len_b=max_len_b, min_len=max_len_b)
        assert all(len(h["tokens"]) == max_len_b + 1 for h in hyps)  # min_len = max_len: EOS exactly there
        counts.append((mode.reads, mode.mailbox))
    assert counts[0][0] == counts[1][0], counts
    assert counts[1][1] == 26 and counts[0][1] == 4, counts
