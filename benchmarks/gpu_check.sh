#!/usr/bin/env bash
# Every GPU check in one call, for a lent GPU machine (see README, "Performance"), most valuable first,
# each step under its own time limit so that one slow step cannot cost the others:
#   1. the GPU-marked tests (tests/test_gpu.py: needs torch and pytest, no mlflow)       TESTS_S=120
#   2. per-epoch times (the README's GPU table): cuda and cpu at batch sizes 1000/10000/20000 with 0
#      and 1 workers, 3 epochs each with the warm-up and every epoch shown and the cuda/cpu speedups
#      on the steady-state epochs; on cuda also cuda_graph, prefetch, data_on_device, bf16 and fp16,
#      and last compile (fp32/bf16/fp16) at batch size 1000                               EPOCHS_S=240
#   3. the pipeline against the tutorial's loop, side by side, with the data/transfer/compute shares,
#      cuda and cpu at batch sizes 1000 and 10000, 0 workers, ROUNDS=2 alternating rounds  LOOPS_S=120
# Each step writes its log (and its markdown table when it ends) to OUT_DIR as it goes: a step cut
# by its limit still leaves every row it measured in its log. The limits add up to 8 minutes, under
# the GPU machine's 10 minutes a call; on one H200 the whole check took 166 s (2026-11-30).
# On a machine without CUDA it says so and runs the CPU part only. Needs no MLflow and no
# Fashion-MNIST (it generates data of the same shape unless --real is given: the pipeline's search).
# Usage: bash benchmarks/gpu_check.sh [OUT_DIR] [--real]   (either order; exit 1 when a step fails)
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp/gpu_check}"
data_flag="--synthetic"
for arg in "$@"; do
  case "$arg" in
    --real) data_flag="" ;;
    -*) echo "unknown option $arg; usage: bash benchmarks/gpu_check.sh [OUT_DIR] [--real]" >&2; exit 2 ;;
    *) out="$arg" ;;
  esac
done
mkdir -p "$out"
python="${PYTHON:-python3}"
[ -x .venv/bin/python ] && python=.venv/bin/python
export PYTHONUNBUFFERED=1
status=0

# step NAME LIMIT_S LOG COMMAND...: runs COMMAND under its limit, its output shown and kept in LOG
step() {
  local name="$1" limit="$2" log="$3" started=$SECONDS
  shift 3
  echo "== $name (limit ${limit} s)"
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$out/$log"
  local rc=${PIPESTATUS[0]}
  case "$rc" in
    0) echo "== $name: passed in $((SECONDS - started)) s" ;;
    124|137) echo "== $name: STOPPED at its ${limit} s limit; the rows above are what it measured"; status=1 ;;
    *) echo "== $name: FAILED (exit $rc) after $((SECONDS - started)) s"; status=1 ;;
  esac
}

harness=("$python" benchmarks/harness.py --device cpu)
if "$python" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  harness=("$python" benchmarks/harness.py --device cuda --device cpu)
  nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit --format=csv | tee "$out/gpu.txt"
  step "GPU-marked tests" "${TESTS_S:-120}" gpu_tests.log \
    "$python" -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py
else
  echo "no CUDA device here (torch.cuda.is_available() is False): skipping the CUDA parts, CPU only"
fi

step "per-epoch times" "${EPOCHS_S:-240}" epochs.log \
  "${harness[@]}" --batch-size 1000 --batch-size 10000 --batch-size 20000 --workers 0 --workers 1 \
  --epochs 3 --cuda-variants --no-loops $data_flag --out "$out/epochs.md"
step "pipeline vs tutorial loop" "${LOOPS_S:-120}" loops.log \
  "${harness[@]}" --batch-size 1000 --batch-size 10000 --workers 0 --rounds "${ROUNDS:-2}" \
  $data_flag --out "$out/loops.md"
exit $status
