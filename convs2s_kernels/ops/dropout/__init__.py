"""``dropout``: dropout whose mask is a hash of a seed and the element's index, so the CPU makes it
in parallel and backward remakes it instead of storing it.

Everything of the op is in this folder:

* ``api.py``: the public function and its input checks;
* ``reference.py``: the plain-PyTorch ground truth (``*_ref``, the same hash in int64 ops), also
  the ``reference`` backend;
* ``cpp.py``: the cpp backend's glue and capability record (kernel: ``csrc/dropout_cpu.cpp``);
* no Triton kernel: on GPUs the reference runs.

Tests: ``tests/ops/test_dropout.py``; benchmark: ``bench/test_bench_dropout.py``.
"""

from ...dispatch import register
from . import cpp  # noqa: F401  (registers the cpp backend's implementation)
from .api import dropout
from .reference import dropout_ref

register("reference", "dropout", dropout_ref)
