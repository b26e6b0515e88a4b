"""``linear``: the decoding step's projections: a few rows against a large weight.

Everything of the op is in this folder:

* ``api.py``: the public function and its input checks;
* ``reference.py``: the plain-PyTorch ground truth (``*_ref``), also the ``reference`` backend;
* ``cpp.py``: the cpp backend's glue and capability record (kernel: ``csrc/linear_cpu.cpp`` on the few-row kernels of ``csrc/small_gemm.cpp``);
* no Triton kernel: on GPUs the reference is a cuBLAS GEMM.

Tests: ``tests/ops/test_linear.py``; benchmark: ``bench/test_bench_linear.py``.
"""

from ...dispatch import register
from . import cpp  # noqa: F401  (registers the cpp backend's implementation)
from .api import linear
from .cpp import pack_linear_weight
from .reference import linear_ref

register("reference", "linear", linear_ref)
