"""``attention_step``: one decoding step of an attention layer folded into its sentence's encoder
outputs, with the layer's residual: scores, masked softmax, context, sqrt(s), output bias, the sqrt(1/2) sums.

Everything of the op is in this folder:

* ``api.py``: the public function and its input checks;
* ``reference.py``: the plain-PyTorch ground truth (``*_ref``), also the ``reference`` backend (the
  CPU's: its one-call ``decoder_step`` folds the attention in C++);
* ``triton.py`` / ``triton_kernels.py``: the Triton backend (GPU; CPU under the interpreter);
* ``triton_launches.py``: the launches the GPU config check compiles (``python3 -m convs2s_kernels.gpu_check``).

Tests: ``tests/ops/test_attention_step.py``; benchmark: ``bench/test_bench_attention_step.py``.
"""

from ...dispatch import register
from .api import attention_step
from .reference import attention_step_ref

register("reference", "attention_step", attention_step_ref)
