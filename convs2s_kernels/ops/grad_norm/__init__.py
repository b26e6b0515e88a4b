"""``grad_norm``: the L2 norm over every element of a list of tensors, the global gradient norm
that clipping (``torch.nn.utils.clip_grad_norm_``, fairseq's ``--clip-norm``) scales by.

Everything of the op is in this folder:

* ``api.py``: the public function and its input checks;
* ``reference.py``: the plain-PyTorch ground truth (``grad_norm_ref``: ``clip_grad_norm_``'s
  norm of the per-tensor norms), also the ``reference`` backend;
* ``cpp.py``: the cpp backend's glue and capability record (kernel: ``csrc/grad_norm_cpu.cpp``, one
  parallel pass over all the tensors' elements);
* no Triton kernel: on GPUs the reference runs (torch's multi-tensor norm is one launch there).

Tests: ``tests/ops/test_grad_norm.py``; benchmark: ``bench/test_bench_grad_norm.py``.
"""

from ...dispatch import register
from . import cpp  # noqa: F401  (registers the cpp backend's implementation)
from .api import grad_norm
from .reference import grad_norm_ref

register("reference", "grad_norm", grad_norm_ref)
