#!/usr/bin/env bash
# Install everything, then run the test suite (CPU; GPU-only tests skip with their reason).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
PY=${PYTHON:-python3}
# benchmarks as a smoke test (no timing), then the test suite
CONVS2S_BENCH_SMOKE=1 "$PY" -m pytest bench --benchmark-disable -q -p no:cacheprovider
"$PY" -m pytest tests -m "not gpu" "$@"
