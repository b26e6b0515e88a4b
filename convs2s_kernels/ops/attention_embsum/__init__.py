"""``attention_embsum``: softmax(q z^T) over the valid source steps, values z + e, the sqrt(s) scale.

Everything of the op is in this folder:

* ``api.py``: the public function and its input checks;
* ``reference.py``: the plain-PyTorch ground truth (``*_ref``), also the ``reference`` backend;
* ``cpp.py``: the cpp backend's glue and capability record (kernel: ``csrc/attention_embsum_cpu.cpp``);
* ``triton.py`` / ``triton_kernels.py``: the Triton backend (GPU; CPU under the interpreter);
* ``triton_launches.py``: the launches the GPU config check compiles (``python3 -m convs2s_kernels.gpu_check``).

Tests: ``tests/ops/test_attention_embsum.py``; benchmark: ``bench/test_bench_attention_embsum.py``.
"""

from ...dispatch import register
from . import cpp  # noqa: F401  (registers the cpp backend's implementation)
from .api import attention_embsum
from .reference import attention_embsum_ref, source_key_mask

register("reference", "attention_embsum", attention_embsum_ref)
