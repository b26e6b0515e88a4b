"""convs2s_kernels: fused kernels for ConvS2S (Gehring et al. 2017).

Public ops (each takes ``backend=`` "auto" | "triton" | "cpp" | "reference"; the
``CONVS2S_KERNELS_BACKEND`` environment variable sets the default):

* :func:`conv_glu` — convolution (causal or centred) + GLU + bias + residual + scale;
* :func:`attention_embsum` — softmax(q z^T) over source positions, values z + e, sqrt(s) scale;
* :func:`conv_step` — one incremental decoding step with beam reorder of the conv state;
* :func:`linear` — ``x @ weight.T + bias`` for the few rows of a decoding step;
* :func:`linear_int8` — the same with int8 weights (:func:`quantize_int8`), for decoding.

Their pure-PyTorch references are in :mod:`convs2s_kernels.reference` (``*_ref``).
"""

from . import reference
from . import _cpp  # noqa: F401  (registers the cpp backend, or records why it is missing)
from . import _triton_probe  # noqa: F401  (records whether the triton backend can run)
from .dispatch import BackendUnavailableError, available_backends, count_dispatches
from .ops import attention_embsum, conv_glu, conv_step, linear, linear_int8
from .reference import quantize_int8

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "conv_glu",
    "attention_embsum",
    "conv_step",
    "linear",
    "linear_int8",
    "quantize_int8",
    "available_backends",
    "count_dispatches",
    "BackendUnavailableError",
    "reference",
]
