"""The one error base class of convs2s: every error a user can cause by input (a file, a flag,
a checkpoint, a corpus) derives from :class:`Convs2sError`, and the command line prints it as one
line and exits with status 2, never a traceback.

It subclasses ``ValueError`` so that callers who caught the older per-module errors as
``ValueError`` keep working.
"""

from __future__ import annotations


class Convs2sError(ValueError):
    """Bad input, named in the message: the command line prints ``error: <message>`` and exits 2."""
