"""``python3 -m convs2s_kernels.env``: the environment report (:mod:`convs2s_kernels.report`), under
the name scripts and results notes have used for it. A module of its own, not a ``__main__``
block of :mod:`convs2s_kernels.env`: the report reads the kernel-choice cache, whose machine key
reads these machine facts, so the facts cannot import the report."""

from ..report import report

if __name__ == "__main__":
    print(report())
