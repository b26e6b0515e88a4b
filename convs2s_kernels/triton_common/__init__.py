"""What the Triton kernels of every op share: interpreter mode, autotune configs, dtypes
(:mod:`.config`), and the GLU tap products of the two convolution kernels (:mod:`.glu`).

The kernels themselves live with their op: ``convs2s_kernels/ops/<op>/triton_kernels.py``.
Importing this package imports ``triton``; :mod:`convs2s_kernels.triton_backend` does it only
when Triton is installed, and records why not otherwise.
"""
