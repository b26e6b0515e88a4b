#!/usr/bin/env bash
# Install convs2s and everything it needs on a fresh machine, building the C++ extension.
# torch is pinned to 2.13.0 (a CPU build on this project's machines); the extension is built
# against the installed torch, hence --no-build-isolation.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
"$PY" -m pip install --quiet --upgrade "torch==2.13.0" setuptools wheel ninja pybind11
"$PY" -m pip install --quiet --no-build-isolation -e ".[test,triton]"
"$PY" -m convs2s_kernels.env
