"""``linear_w8a8``: ``linear`` with int8 weights and int8 activations (each row of ``x`` quantised
on the fly, one scale per row), integer dot products, float32 out.

Everything of the op is in this folder:

* ``api.py``: the public function and its input checks;
* ``reference.py``: the plain-PyTorch ground truth (``*_ref``), also the ``reference`` backend;
* ``cpp.py``: the cpp backend's glue and capability record (kernel: ``csrc/linear_w8a8_cpu.cpp``; per instruction set
  ``csrc/linear_w8a8_avx512.cpp``, ``csrc/linear_w8a8_avx2.cpp``).

Tests: ``tests/ops/test_linear_w8a8.py``; benchmark: ``bench/test_bench_linear_w8a8.py``.
"""

from ...dispatch import register
from . import cpp  # noqa: F401  (registers the cpp backend's implementation)
from .api import linear_w8a8
from .reference import linear_w8a8_ref, pack_w8a8_weight, quantize_rows_int8

register("reference", "linear_w8a8", linear_w8a8_ref)
