"""Helpers for code built on the kernels (the convs2s decoding engine and its search), not part of
the ops' API: they may change with the engine.

* :func:`trusted_indices` — a context in which the ops skip the range checks of index inputs
  (a search loop's own top-k ids: a check would read them back on the host every step);
* :func:`indices_trusted` — whether the caller is inside one;
* :func:`write_version` — a tensor's in-place write counter, to key caches of derived weights.
"""

from ._checks import indices_trusted, trusted_indices, write_version

__all__ = ["indices_trusted", "trusted_indices", "write_version"]
