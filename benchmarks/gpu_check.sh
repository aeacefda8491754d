#!/usr/bin/env bash
# Every GPU check in one call, for a lent GPU machine (see README, "Performance"), most valuable first,
# each step under its own time limit so that one slow step cannot cost the others:
#   0. each device's peaks (`pipeline devices --peak`: matmul at fp32/bf16/fp16 and a memory copy,
#      beside the datasheet's figures), appended to gpu.txt; later steps' runs reuse them (their
#      cache, PIPELINE_CACHE_DIR, is a temporary folder of this call)                      PEAK_S=30
#   1. the GPU-marked tests (tests/test_gpu.py: needs torch and pytest, no mlflow)       TESTS_S=60
#   2. the tracked device sweep (benchmarks/tracked_sweep.py): experiments/devices.yaml with repeats 3
#      through `pipeline run` into a fresh sqlite store, then `pipeline compare` with its intervals;
#      writes the README's device charts (devices-*.png); its comparison (in sweep.log) has each
#      setting's achieved TFLOP/s and MFU, a share of the peaks of step 0. Needs MLflow: the GPU
#      machine has none, so carry it as wheels made here by `bash benchmarks/gpu_wheels.sh` (carry
#      `.whl`)                                                                             SWEEP_S=240
#   3. per-epoch times (the README's GPU table): cuda and cpu at batch sizes 1000/10000/20000 with 0
#      and 1 workers, 3 epochs each with the warm-up and every epoch shown and the cuda/cpu speedups
#      on the steady-state epochs; on cuda also cuda_graph, prefetch, data_on_device, bf16 and fp16,
#      and last compile (fp32/bf16/fp16) at batch size 1000                               EPOCHS_S=180
#   4. the pipeline against the tutorial's loop, side by side, with the data/transfer/compute shares,
#      cuda and cpu at batch sizes 1000 and 10000, 0 workers, ROUNDS=2 alternating rounds  LOOPS_S=60
# Each step writes its log (and its markdown table when it ends) to OUT_DIR as it goes: a step cut
# by its limit still leaves every row it measured in its log. The limits add up to 9.5 minutes, under
# the GPU machine's 10 minutes a call; on one H200 steps 1, 3 and 4 took 166 s (2026-11-30). OUT_DIR
# gets 8 files, what a GPU machine sends back at most: gpu.txt, four logs, two tables, the device chart.
# On a machine without CUDA it says so and runs the CPU part only. Steps 1, 3 and 4 need no MLflow
# and no Fashion-MNIST (they generate data of the same shape unless --real is given: the pipeline's
# search, e.g. a carried data/).
# Usage: bash benchmarks/gpu_check.sh [OUT_DIR] [--real]   (either order; exit 1 when a step fails)
#   On the device tool: run(command="bash benchmarks/gpu_check.sh $OUT --real", carry=["data", ".whl"])
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
# The peaks step 0 measures, reused by every run after it, and removed at the end.
PIPELINE_CACHE_DIR="$(mktemp -d)"
export PIPELINE_CACHE_DIR
trap 'rm -rf "$PIPELINE_CACHE_DIR"' EXIT

# MLflow carried as wheels (benchmarks/gpu_wheels.sh), where this Python has none.
if [ -d .whl ] && ! "$python" -c "import mlflow" 2>/dev/null; then
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi

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
cuda=false
if "$python" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  cuda=true
  harness=("$python" benchmarks/harness.py --device cuda --device cpu)
  nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit --format=csv | tee "$out/gpu.txt"
else
  echo "no CUDA device here (torch.cuda.is_available() is False): skipping the CUDA parts, CPU only"
fi

step "device peaks" "${PEAK_S:-30}" peaks.log "$python" -m pipeline devices --peak
cat "$out/peaks.log" >> "$out/gpu.txt" && rm -f "$out/peaks.log"  # 8 files come back at most: the peaks go in gpu.txt
if $cuda; then
  step "GPU-marked tests" "${TESTS_S:-60}" gpu_tests.log \
    "$python" -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py
fi

if "$python" -c "import mlflow" 2>/dev/null; then
  step "tracked device sweep" "${SWEEP_S:-240}" sweep.log \
    "$python" benchmarks/tracked_sweep.py "$out" --repeats "${REPEATS:-3}" --budget-s "$((${SWEEP_S:-240} - 10))" ${data_flag}
else
  echo "== tracked device sweep: SKIPPED, no MLflow here; make wheels with 'bash benchmarks/gpu_wheels.sh' and carry .whl"
  status=1
fi
step "per-epoch times" "${EPOCHS_S:-180}" epochs.log \
  "${harness[@]}" --batch-size 1000 --batch-size 10000 --batch-size 20000 --workers 0 --workers 1 \
  --epochs 3 --cuda-variants --no-loops $data_flag --out "$out/epochs.md"
step "pipeline vs tutorial loop" "${LOOPS_S:-60}" loops.log \
  "${harness[@]}" --batch-size 1000 --batch-size 10000 --workers 0 --rounds "${ROUNDS:-2}" \
  $data_flag --out "$out/loops.md"
exit $status
