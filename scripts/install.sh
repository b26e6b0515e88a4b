#!/usr/bin/env bash
# Install convs2s and everything it needs on a fresh machine, building the C++ extension.
# torch is pinned to 2.13.0 (a CPU build on this project's machines); the extension is built
# against the installed torch, hence --no-build-isolation.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# tcmalloc for the command line (convs2s.allocator): best effort, as root with apt; without it
# convs2s runs on glibc's malloc, slower on long decoding jobs
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null && ! ls /usr/lib/*/libtcmalloc_minimal.so.4 >/dev/null 2>&1; then
    (apt-get install -y -q libtcmalloc-minimal4 >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 &&
        apt-get install -y -q libtcmalloc-minimal4 >/dev/null 2>&1; }) || echo "note: tcmalloc not installed"
fi
"$PY" -m pip install --quiet --upgrade "torch==2.13.0" setuptools wheel ninja pybind11
"$PY" -m pip install --quiet --no-build-isolation -e ".[test,triton,plot]"
"$PY" -m convs2s_kernels.env
