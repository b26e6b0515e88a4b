"""``decoder_step``: every decoder layer of one decoding step in one call (folded attention).

Everything of the op is in this folder:

* ``api.py``: the public function and its input checks;
* ``reference.py``: the plain-PyTorch ground truth (``*_ref``), also the ``reference`` backend;
* ``cpp.py``: the cpp backend's glue and capability record (kernel: ``csrc/decoder_step_cpu.cpp``);
* ``layers.py``: :class:`StepLayer` / :class:`StepAttention`, the per-layer weights it takes.

Tests: ``tests/ops/test_decoder_step.py``; benchmark: ``bench/test_bench_decoder_step.py``.
"""

from ...dispatch import register
from . import cpp  # noqa: F401  (registers the cpp backend's implementation)
from .api import decoder_step
from .layers import StepAttention, StepLayer
from .reference import decoder_step_ref

register("reference", "decoder_step", decoder_step_ref)
