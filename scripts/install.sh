#!/usr/bin/env bash
# Install convs2s and everything it needs on a fresh machine, building the C++ extension.
# A torch already installed is kept as it is (a CUDA build on a GPU machine, a newer release): the
# extension is built against it, hence --no-build-isolation. Without one, the oldest tested release
# (convs2s_kernels.extension.TESTED_TORCH) is installed, a CPU build on this project's machines.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# tcmalloc for the command line (convs2s.allocator): best effort, as root with apt; without it
# convs2s runs on glibc's malloc, slower on long decoding jobs
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null && ! ls /usr/lib/*/libtcmalloc_minimal.so.4 >/dev/null 2>&1; then
    (apt-get install -y -q libtcmalloc-minimal4 >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 &&
        apt-get install -y -q libtcmalloc-minimal4 >/dev/null 2>&1; }) || echo "note: tcmalloc not installed"
fi
"$PY" -c "import torch" 2>/dev/null || "$PY" -m pip install --quiet "torch==2.13.0"
"$PY" -m pip install --quiet --upgrade setuptools wheel ninja
# The package and its C++ build are reused while nothing they are made from changed (the sources,
# the build files, torch, python, the switches): scripts/test.sh runs this again, and a rebuild
# costs 4-12 minutes on 2 cores.
fingerprint=$( { cat csrc/* setup.py pyproject.toml; "$PY" -c "import sys, torch; print(sys.version, sys.prefix, torch.__version__)";
                 echo "${CONVS2S_KERNELS_SKIP_CPP_BUILD:-} ${CONVS2S_KERNELS_DEBUG:-}"; } | sha256sum | cut -c1-16)
stamp=build/install-fingerprint
if [ "$(cat "$stamp" 2>/dev/null)" = "$fingerprint" ] && "$PY" -I -c "
import os, sys, convs2s, convs2s_kernels
ok = os.path.dirname(os.path.dirname(os.path.abspath(convs2s.__file__))) == os.getcwd()  # this folder's
sys.exit(0 if ok and (convs2s_kernels.extension._C is not None or os.environ.get('CONVS2S_KERNELS_SKIP_CPP_BUILD') == '1') else 1)
" 2>/dev/null; then
    echo "convs2s: installed from this folder and built from these sources already (fingerprint $fingerprint)"
else
    rm -f "$stamp"
    "$PY" -m pip install --quiet --no-build-isolation -e ".[test,triton,plot,text]"
    mkdir -p build && echo "$fingerprint" > "$stamp"
fi
"$PY" -m convs2s_kernels.report
