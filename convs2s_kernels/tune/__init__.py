"""Kernel choice by measurement: for each weight shape a decoding step multiplies, which kernel runs
its products at which row count on this machine, timed rather than assumed.

The candidates (:mod:`.candidate_calls`): for float and int8-weight products, the few-row
streaming kernels (``csrc/small_gemm.cpp``; form ``kp``: on the weight packed by
``pack_conv_step_weight`` / ``pack_linear_weight``) against the GEMM; for int8 weights times int8
activations (form ``w8a8``) or 7-bit ones (form ``w7a8``, timed apart), the packed int8 kernel
(``csrc/linear_w8a8_avx512.cpp``, ``csrc/linear_w8a8_avx2.cpp``) against the library's int8 GEMM where its sums are exact, else
the reducing int8 kernel. For float32 weights "the GEMM" is itself a measured choice
(``csrc/library_gemm.cpp``): ATen's (what the reference composition calls) or oneDNN's inner
product, timed against each other first; where oneDNN's wins, the kernels are timed against
ATen's too, so no row count runs a GEMM or kernel measured slower than the reference's GEMM.

The timing (:mod:`.timing`): candidates side by side, in alternating blocks of calls, at row
buckets 1..64, on weights as cold as a decoding step finds them (a shape carries its step's
weight-set size, ``stream_mb``, and each call takes the next of enough copies to fill it); why
cold and why in blocks: ``bench/results/xeon-amx-2c/README.md``; the two libraries:
``bench/results/amd-zen5-2c/README.md``. The rules (:mod:`.rules`): each bucket takes its winner,
a row count between buckets the kernel only when both neighbours chose it.

What is in force (:mod:`.policy`, the package's one mutable state): choices are measured once per
machine (:mod:`convs2s_kernels.tune_cache`) and handed to the extension, which keys them by form,
dtype, K and N (shapes alike in these share one choice: the first measured or read holds) and
consults them on every call. :func:`ensure` is what the decoding engine calls first, measuring
only what the cache lacks; ``CONVS2S_TUNE=0`` (or :func:`measuring`) turns measuring off, and a
shape never measured takes the kernels up to 8 rows. The shape type is :mod:`.shapes`;
``python3 -m convs2s_kernels.tune`` (:mod:`.__main__`) prints the table::

    python3 -m convs2s_kernels.tune --shapes kn:1536x1024@512MB,nk:512x40000@512MB --dtype float32,int8
"""

from .candidate_calls import has_library_choice, w8a8_has_choice
from .policy import ENV, ensure, forget, measuring, tuning_enabled
from .shapes import ACTIVATION_BITS, DTYPES, FORMS, Shape, parse_shape, stream_mb, twin_stream_mb

__all__ = ["ACTIVATION_BITS", "DTYPES", "ENV", "FORMS", "Shape", "ensure", "forget", "has_library_choice", "measuring",
           "parse_shape", "stream_mb", "tuning_enabled", "twin_stream_mb", "w8a8_has_choice"]
