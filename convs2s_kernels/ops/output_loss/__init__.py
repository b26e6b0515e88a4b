"""``output_loss``: the decoder's output projection and the label-smoothed cross-entropy, fused.

Everything of the op is in this folder:

* ``api.py``: the public function and its input checks;
* ``reference.py``: the plain-PyTorch ground truth (``*_ref``), also the ``reference`` backend;
* ``cpp.py``: the cpp backend's glue and capability record (kernel: ``csrc/output_loss_cpu.cpp``:
  the logits made, reduced and turned into their gradient a block of rows at a time while the
  block is in cache, never the whole ``(N, V)`` matrix);
* no Triton kernel: on GPUs the reference (cuBLAS and ATen's softmax) runs.

Tests: ``tests/ops/test_output_loss.py``; benchmark: ``bench/test_bench_output_loss.py``.
"""

from ...dispatch import register
from . import cpp  # noqa: F401  (registers the cpp backend's implementation)
from .api import output_loss
from .reference import output_loss_ref

register("reference", "output_loss", output_loss_ref)
