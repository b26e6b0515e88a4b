#!/usr/bin/env bash
# Install everything, then run the test suite (CPU; GPU-only tests skip with their reason).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
PY=${PYTHON:-python3}
# benchmarks as a smoke test (no timing), then the test suite; tests/test_gpu_check.py runs
# `python3 -m convs2s_kernels.gpu_check --ci`: the committed report of every Triton config for
# sm_80/sm_90 checked, a fixed subset recompiled on this CPU (~10 s while the kernels' sources
# match the report; a stale report fails)
CONVS2S_BENCH_SMOKE=1 "$PY" -m pytest bench --benchmark-disable -q -p no:cacheprovider
"$PY" -m pytest tests -m "not gpu" "$@"
