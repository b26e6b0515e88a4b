"""``conv_glu``: convolution (causal or centred) + GLU + bias + residual + scale, in one pass.

Everything of the op is in this folder:

* ``api.py``: the public function and its input checks;
* ``reference.py``: the plain-PyTorch ground truth (``*_ref``), also the ``reference`` backend;
* ``cpp.py``: the cpp backend's glue and capability record (kernel: ``csrc/conv_glu_cpu.cpp``);
* ``triton.py`` / ``triton_kernels.py``: the Triton backend (GPU; CPU under the interpreter);
* ``triton_launches.py``: the launches the GPU config check compiles (``python3 -m convs2s_kernels.gpu_check``).

Tests: ``tests/ops/test_conv_glu.py``; benchmark: ``bench/test_bench_conv_glu.py``.
"""

from ...dispatch import register
from . import cpp  # noqa: F401  (registers the cpp backend's implementation)
from .api import conv_glu
from .reference import conv_glu_ref, conv_padding

register("reference", "conv_glu", conv_glu_ref)
