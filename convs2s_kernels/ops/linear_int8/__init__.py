"""``linear_int8``: ``linear`` with int8 weights (symmetric, one scale per output row).

Everything of the op is in this folder:

* ``api.py``: the public function and its input checks;
* ``reference.py``: the plain-PyTorch ground truth (``*_ref``), also the ``reference`` backend;
* ``cpp.py``: the cpp backend's glue and capability record (kernel: ``csrc/linear_int8_cpu.cpp`` on the few-row kernels of ``csrc/small_gemm.cpp``).

Tests: ``tests/ops/test_linear_int8.py``; benchmark: ``bench/test_bench_linear_int8.py``.
"""

from ...dispatch import register
from . import cpp  # noqa: F401  (registers the cpp backend's implementation)
from .api import linear_int8
from .reference import linear_int8_ref, quantize_int8

register("reference", "linear_int8", linear_int8_ref)
