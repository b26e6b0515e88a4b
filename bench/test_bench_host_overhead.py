"""Host microseconds per call of each op: the time a call takes to return on inputs so small that
the arithmetic is negligible (one decoding row, 16 channels), per backend. On a CPU this is the
dispatch and argument-check overhead a decoding step pays per op; on a GPU, with no
synchronisation inside the timed loop, the host cost of queueing the kernels. A decoding step
of fconv_wmt_en_fr makes ~100 such calls on the Python path (``decoder_step`` makes one)."""

import math

import pytest
import torch

import convs2s_kernels as ck

C, S, K = 16, 5, 3


def tiny_calls(device):
    """For each op, ``(args, kwargs)`` of one small call (a decoding row, or one short sentence)."""
    r = lambda *shape: torch.randn(*shape, device=device)  # noqa: E731
    w = r(K, C, 2 * C) / math.sqrt(K * C)
    q, s = ck.quantize_int8(r(2 * C, C))
    lengths = torch.tensor([S], device=device)
    layer = ck.StepLayer(w, r(2 * C), residual=1,
                         attention=ck.StepAttention(r(1, S, C), r(1, S), r(1, S, C), r(C)))
    pad = torch.zeros(1, S, dtype=torch.bool, device=device)
    return {
        "conv_glu": ((r(1, 4, C), w, r(2 * C)), dict(causal=True)),
        "attention_embsum": ((r(1, 1, C), r(1, S, C), r(1, S, C), lengths), {}),
        "conv_step": ((r(1, C), r(1, K - 1, C), w, r(2 * C), torch.zeros(1, dtype=torch.long, device=device)), {}),
        "linear": ((r(1, C), r(2 * C, C), r(2 * C)), {}),
        "linear_int8": ((r(1, C), q, s, r(2 * C)), {}),
        "decoder_step": ((r(1, C), [r(1, K - 1, C)] * 2, [layer, layer], r(1, 1, S), pad, lengths), {}),
    }


@pytest.mark.parametrize("op", ["conv_glu", "attention_embsum", "conv_step", "linear", "linear_int8", "decoder_step"])
@pytest.mark.parametrize("backend", ["reference", "cpp", "triton"])
def test_host_us_per_call(benchmark, runnable, device, backend, op):
    args, kwargs = tiny_calls(device)[op]
    runnable(backend, op, *args, **kwargs)
    fn = getattr(ck, op)
    benchmark.group = f"host overhead {op}"

    def call():
        with torch.no_grad():
            return fn(*args, **kwargs, backend=backend)

    call()  # compile / tune outside the timed loop
    benchmark.pedantic(call, rounds=30, iterations=50, warmup_rounds=2)
    if device.type == "cuda":
        torch.cuda.synchronize()
    stats = getattr(getattr(benchmark, "stats", None), "stats", None)
    if stats is not None:
        benchmark.extra_info["host_us_per_call"] = stats.median * 1e6
