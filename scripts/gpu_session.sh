#!/usr/bin/env bash
# What to run when a GPU is lent (the device tool runs this in a copy of the checkout; its machine
# has its own CUDA torch, Triton, pytest and pytest-timeout, no network, no C++ extension).
#   bash scripts/gpu_session.sh lease   # fits a 15-minute lease (~5 min on an H200, 2026-11-26): the CUDA-graph
#                                       # n-best tests, the full-set speed table (bf16, Triton, folded, beams 1 and 5,
#                                       # CUDA graphs on), the Triton model tests on CUDA, then the GPU-marked tests
#   bash scripts/gpu_session.sh speed   # the speed table with the reference beside Triton, then Triton eager, one step
#                                       # a graph instead of four, and 512-sentence batches (labelled rows; ~5 min)
#   bash scripts/gpu_session.sh profile # bench/tools/gpu_batch_profile.py: one 128-sentence batch, graph and eager (~1 min)
#   bash scripts/gpu_session.sh train   # issue 51: the conv+GLU and attention op benchmarks (bf16, pytest-benchmark
#                                       # JSON), then training updates Triton beside the reference (bench/tools/train_step_ab.py)
# Everything it writes goes to $OUT (the device tool brings that folder back).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD:$PWD/bench PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/convs2s-gpu}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
case "${1:-}" in lease|speed|profile|train) ;; *) echo "usage: bash scripts/gpu_session.sh lease|speed|profile|train" >&2; exit 2 ;; esac
start=$(date +%s)
elapsed() { echo $(( $(date +%s) - start )); }
nvidia-smi -L
"$PY" -m convs2s_kernels.report > "$OUT/env.txt" 2>&1
speed_table() {  # time limit (s), name, then the table's own options
  local limit=$1 name=$2; shift 2
  timeout "$limit" "$PY" -m convs2s bench speed-table --device cuda --full --dtype bf16 --decoders folded --repeats 1 \
    --json "$OUT/$name.json" "$@" > "$OUT/$name.md" 2> "$OUT/$name.err"
  echo "exit $? at $(elapsed) s"; grep '^repeat' "$OUT/$name.err"
}
case "${1:-}" in
  lease)
    timeout 140 "$PY" -m pytest tests/test_step_graph.py -q -p no:cacheprovider --timeout 110 -rfE \
      > "$OUT/tests-step-graph.txt" 2>&1
    echo "step-graph tests: exit $? at $(elapsed) s"; tail -1 "$OUT/tests-step-graph.txt"
    speed_table 240 speed-table-triton-graph --backends triton --beams 1,5
    timeout 150 "$PY" -m pytest tests/test_triton_model.py -p no:cacheprovider --timeout 120 -v -rfE \
      > "$OUT/tests-triton-model.txt" 2>&1
    echo "triton model tests: exit $? at $(elapsed) s"; tail -1 "$OUT/tests-triton-model.txt"
    timeout $(( 550 - $(elapsed) )) "$PY" -m pytest tests -m gpu -p no:cacheprovider --timeout 90 -v -rfE \
      --durations=15 > "$OUT/tests-gpu-marked.txt" 2>&1
    echo "gpu-marked tests: exit $? at $(elapsed) s"; tail -1 "$OUT/tests-gpu-marked.txt" ;;
  speed)
    speed_table 250 speed-table-reference-triton-graph --backends reference,triton --beams 1,5
    speed_table 170 speed-table-triton-eager --backends triton --beams 5 --no-cuda-graph
    speed_table 150 speed-table-triton-graph-1step --backends triton --beams 5 --steps-per-graph 1
    speed_table 150 speed-table-triton-graph-batch512 --backends triton --beams 5 --batch-size 512 ;;
  profile)
    timeout 200 "$PY" bench/tools/gpu_batch_profile.py --out "$OUT" ;;
  train)
    timeout 330 "$PY" -m pytest bench/test_bench_conv_glu.py bench/test_bench_attention_embsum.py -k "bf16 and not translating" \
      -p no:cacheprovider -q --benchmark-json "$OUT/bench-ops-bf16.json" > "$OUT/bench-ops-bf16.txt" 2>&1
    echo "op benchmarks: exit $? at $(elapsed) s"; tail -1 "$OUT/bench-ops-bf16.txt"
    timeout 250 "$PY" bench/tools/train_step_ab.py --json "$OUT/train-step-ab.json" > "$OUT/train-step-ab.txt" 2>&1
    echo "training updates: exit $? at $(elapsed) s"; cat "$OUT/train-step-ab.txt" ;;
esac
