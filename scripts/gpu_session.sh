#!/usr/bin/env bash
# What to run when a GPU is lent (the device tool runs this in a copy of the checkout; its machine
# has its own CUDA torch, Triton, pytest and pytest-timeout, no network, no C++ extension):
#   bash scripts/gpu_session.sh tests   # the whole suite on the GPU, each test under a time limit (<= 10 min)
#   bash scripts/gpu_session.sh speed   # the full-set speed table, bf16 fconv_wmt_en_fr, Triton, beams 1 and 5,
#                                       # CUDA graphs on, then off (issue 18's targets: <= 8 s and <= 12 s)
# Everything it writes goes to $OUT (the device tool brings that folder back).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD
OUT=${OUT:-/tmp/convs2s-gpu}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
"$PY" -m convs2s_kernels.env > "$OUT/env.txt" 2>&1
case "${1:-}" in
  tests)
    start=$(date +%s)
    timeout 570 "$PY" -m pytest tests -q -p no:cacheprovider --timeout 120 --durations=30 \
      --junitxml="$OUT/tests.xml" > "$OUT/tests.txt" 2>&1
    echo "exit $? after $(( $(date +%s) - start )) s" >> "$OUT/tests.txt"
    tail -40 "$OUT/tests.txt" ;;
  speed)
    for graph in "" "--no-cuda-graph"; do
      name=speed-table-full-bf16-triton${graph:+-eager}
      timeout 280 "$PY" -m convs2s bench speed-table --device cuda --full --backends triton --dtype bf16 \
        --decoders folded --beams 1,5 --repeats 1 $graph --json "$OUT/$name.json" > "$OUT/$name.md" 2>&1
      echo "exit $?" >> "$OUT/$name.md"
      head -12 "$OUT/$name.md"
    done ;;
  *)
    echo "usage: bash scripts/gpu_session.sh tests|speed" >&2
    exit 2 ;;
esac
