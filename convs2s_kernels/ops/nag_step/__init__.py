"""``nag_step``: one Nesterov step over every parameter of a model at once (fairseq's NAG, which
is ``torch.optim.SGD(nesterov=True)``), with the trainer's gradient normalisation and clipping
folded in as one scale, in place.

Everything of the op is in this folder:

* ``api.py``: the public function and its input checks;
* ``reference.py``: the plain-PyTorch ground truth (``nag_step_ref``: torch.optim.SGD's update
  written out), also the ``reference`` backend;
* ``cpp.py``: the cpp backend's glue and capability record (kernel: ``csrc/nag_step_cpu.cpp``, one
  pass over parameters, gradients and momentum buffers);
* no Triton kernel: on GPUs the reference runs.

Tests: ``tests/ops/test_nag_step.py``; benchmark: ``bench/test_bench_nag_step.py``.
"""

from ...dispatch import register
from . import cpp  # noqa: F401  (registers the cpp backend's implementation)
from .api import nag_step
from .reference import nag_step_ref

register("reference", "nag_step", nag_step_ref)
