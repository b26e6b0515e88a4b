"""``dropout``: the public function (checks its inputs, draws the seed, calls the backend the dispatcher picks)."""

from __future__ import annotations

from typing import Optional

import torch

from ..._checks import check_tensor
from ...dispatch import resolve

__all__ = ["dropout", "dropout_tensors", "draw_seed", "draw_seed_tensor"]


def dropout_tensors(x, **_):
    """The floating tensors of a call (for the backends' capabilities)."""
    return (x,)


def draw_seed() -> int:
    """A mask's seed, drawn from torch's default CPU generator: ``torch.manual_seed`` makes the
    masks repeat, and each call consumes the generator as one draw."""
    return int(draw_seed_tensor())


def draw_seed_tensor() -> torch.Tensor:
    """:func:`draw_seed`'s draw as a one-element int64 tensor, not read on the host: what a
    ``torch.compile`` graph takes (reading it would break the graph). Under ``aot_eager`` it is
    the same draw as eager's; inductor draws from its own random streams, as for ``F.dropout``."""
    return torch.randint(0, 2 ** 62, (1,))


def dropout(x: torch.Tensor, p: float, training: bool = True, *, seed: Optional[int] = None,
            backend: Optional[str] = None) -> torch.Tensor:
    """``x`` with each element zeroed with probability ``p`` and the others scaled by ``1 / (1 - p)``
    (``F.dropout``'s contract), any shape; ``x`` itself when not ``training`` or ``p == 0``.
    The mask is a function of ``seed`` (drawn by :func:`draw_seed` when not given) and each
    element's index in ``x``'s row-major order, the same on every backend:
    ``convs2s_kernels.dropout_ref``. Under ``torch.compile`` (no graph break; forward and backward)
    a seed not given is drawn inside the graph (:func:`draw_seed_tensor`)."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must lie in [0, 1), got {p}")
    if not training or p == 0.0:
        return x
    check_tensor("x", x, x.dim())
    if seed is not None:
        seed = int(seed)
    else:  # traced: the seed stays a tensor in the graph (the backends take either)
        seed = draw_seed_tensor() if torch.compiler.is_compiling() else draw_seed()
    fn = resolve("dropout", x.device, backend, x, p=p, seed=seed)
    return fn(x, p=p, seed=seed)
