#!/usr/bin/env bash
# What to run when a GPU is lent (the device tool runs this in a copy of the checkout; its machine
# has its own CUDA torch, Triton, pytest and pytest-timeout, no network, no C++ extension).
# A lease is 15 minutes of device time and 10 a command: `first` is the one command that decides the
# next change (under 10 minutes: run it with timeout_s=600), `second` the rest if time is left.
#   bash scripts/gpu_session.sh first   # the CUDA-graph n-best tests; the full-set bf16 speed table at beams 1
#                                       # and 5, Triton beside the reference under the same graphs; the profile of
#                                       # one 640-row batch (GPU busy share, kernels a step); the conv+GLU and
#                                       # attention forward+backward bf16 op benchmarks; then the GPU-marked tests
#   bash scripts/gpu_session.sh second  # the Triton model tests on CUDA, training updates Triton beside the
#                                       # reference (bench/tools/train_step_ab.py), the forward-only op benchmarks,
#                                       # then the speed table at beam 5 without CUDA graphs
#   bash scripts/gpu_session.sh speed   # the speed table's variants: eager, one step a graph, 512-sentence batches (~5 min)
#   bash scripts/gpu_session.sh profile # bench/tools/gpu_batch_profile.py alone (~1 min)
# Everything it writes goes to $OUT (the device tool brings that folder back). Each step has its own
# time limit and says when it ended, so a slow step costs its own numbers, not the later ones.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD:$PWD/bench PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/convs2s-gpu}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
case "${1:-}" in first|second|speed|profile) ;; *) echo "usage: bash scripts/gpu_session.sh first|second|speed|profile" >&2; exit 2 ;; esac
start=$(date +%s)
elapsed() { echo $(( $(date +%s) - start )); }
nvidia-smi -L
"$PY" -m convs2s_kernels.report > "$OUT/env.txt" 2>&1
speed_table() {  # time limit (s), name, then the table's own options
  local limit=$1 name=$2; shift 2
  timeout "$limit" "$PY" -m convs2s bench speed-table --device cuda --full --dtype bf16 --decoders folded --repeats 1 \
    --json "$OUT/$name.json" "$@" > "$OUT/$name.md" 2> "$OUT/$name.err"
  echo "$name: exit $? at $(elapsed) s"; grep '^repeat' "$OUT/$name.err"
}
op_benchmarks() {  # time limit (s), name, the -k expression
  timeout "$1" "$PY" -m pytest bench/test_bench_conv_glu.py bench/test_bench_attention_embsum.py -k "$3" \
    -p no:cacheprovider -q --benchmark-min-rounds=5 --benchmark-max-time=0.2 \
    --benchmark-json "$OUT/$2.json" > "$OUT/$2.txt" 2>&1
  echo "$2: exit $? at $(elapsed) s"; tail -1 "$OUT/$2.txt"
}
left() { local s=$(( $1 - $(elapsed) )); echo $(( s > 1 ? s : 1 )); }  # seconds from now until $1 s into the run
case "${1:-}" in
  first)
    timeout 100 "$PY" -m pytest tests/test_step_graph.py -q -p no:cacheprovider --timeout 80 -rfE \
      > "$OUT/tests-step-graph.txt" 2>&1
    echo "step-graph tests: exit $? at $(elapsed) s"; tail -1 "$OUT/tests-step-graph.txt"
    speed_table 250 speed-table-reference-triton-graph --backends reference,triton --beams 1,5
    timeout 100 "$PY" bench/tools/gpu_batch_profile.py --out "$OUT" > "$OUT/profile.txt" 2>&1
    echo "profile: exit $? at $(elapsed) s"; cat "$OUT/profile.txt"
    op_benchmarks "$(left 470)" bench-ops-bf16-fwd-bwd "bf16 and fwd_bwd and not translating"
    timeout "$(left 570)" "$PY" -m pytest tests -m gpu -p no:cacheprovider --timeout 60 -q -rfE \
      --durations=10 > "$OUT/tests-gpu-marked.txt" 2>&1
    echo "gpu-marked tests: exit $? at $(elapsed) s"; tail -1 "$OUT/tests-gpu-marked.txt" ;;
  second)
    timeout 150 "$PY" -m pytest tests/test_triton_model.py -p no:cacheprovider --timeout 120 -v -rfE \
      > "$OUT/tests-triton-model.txt" 2>&1
    echo "triton model tests: exit $? at $(elapsed) s"; tail -1 "$OUT/tests-triton-model.txt"
    timeout 200 "$PY" bench/tools/train_step_ab.py --json "$OUT/train-step-ab.json" > "$OUT/train-step-ab.txt" 2>&1
    echo "training updates: exit $? at $(elapsed) s"; cat "$OUT/train-step-ab.txt"
    op_benchmarks "$(left 450)" bench-ops-bf16-fwd "bf16 and fwd and not fwd_bwd and not translating"
    speed_table "$(left 570)" speed-table-triton-eager --backends triton --beams 5 --no-cuda-graph ;;
  speed)
    speed_table 170 speed-table-triton-eager --backends triton --beams 5 --no-cuda-graph
    speed_table 150 speed-table-triton-graph-1step --backends triton --beams 5 --steps-per-graph 1
    speed_table 150 speed-table-triton-graph-batch512 --backends triton --beams 5 --batch-size 512 ;;
  profile)
    timeout 200 "$PY" bench/tools/gpu_batch_profile.py --out "$OUT" ;;
esac
