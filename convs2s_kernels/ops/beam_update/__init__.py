"""``beam_update``: the rest of a beam-search step after :func:`convs2s_kernels.beam_candidates`:
finished hypotheses recorded (fairseq's ``finalize_hypos``) and every beam advanced to its next
live candidates, the prefixes following their parents.

Everything of the op is in this folder:

* ``api.py``: the public function and its input checks;
* ``reference.py``: the plain-PyTorch ground truth (``*_ref``) and :class:`FinishedHypotheses`,
  also the ``reference`` backend (no host read: it serves GPUs as it is);
* ``cpp.py``: the cpp backend's glue and capability record (kernel: ``csrc/beam_update_cpu.cpp``);
* ``triton.py`` / ``triton_kernels.py``: the Triton backend (GPU; CPU under the interpreter): one
  program per sentence;
* ``triton_launches.py``: the launch the GPU config check compiles (``python3 -m convs2s_kernels.gpu_check``).

Tests: ``tests/ops/test_beam_update.py``; benchmark: ``bench/test_bench_beam_update.py``.
"""

from ...dispatch import register
from . import cpp  # noqa: F401  (registers the cpp backend's implementation)
from .api import beam_update
from .reference import FinishedHypotheses, beam_update_ref

register("reference", "beam_update", beam_update_ref)
