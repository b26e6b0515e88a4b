"""``python3 -m convs2s_kernels.gpu_check``: see :mod:`convs2s_kernels.gpu_check.cli`."""

import os
import sys


def _reexec_without_interpreter() -> None:
    """The kernels must be compiled as JITFunctions: drop TRITON_INTERPRET and start again."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    os.execve(sys.executable, [sys.executable, "-m", "convs2s_kernels.gpu_check", *sys.argv[1:]], env)


if __name__ == "__main__":
    if os.environ.get("TRITON_INTERPRET") == "1":
        _reexec_without_interpreter()
    from .cli import main

    sys.exit(main())
