#!/usr/bin/env bash
# Every GPU check in one call, for a lent GPU machine (see README, "Performance"):
#   1. the GPU-marked tests (tests/test_gpu.py: needs torch and pytest, no mlflow);
#   2. the harness on cuda and cpu at batch sizes 1000/10000/20000 with 0 and 1 workers: 3 epochs
#      each with the warm-up and every epoch's time shown and the cuda/cpu speedups on the
#      steady-state epochs (the README's GPU table), with cuda_graph, prefetch, data_on_device, bf16
#      and fp16 on cuda, and compile (fp32/bf16/fp16) at the smallest batch size; then the pipeline
#      against the tutorial's loop with the data/transfer/compute shares.
# Under 7 minutes on one H200 with 16 cores (ROUNDS=1 halves the loop comparison).
# On a machine without CUDA it says so and runs the CPU part only. Needs no MLflow and no
# Fashion-MNIST (it generates data of the same shape unless --real is given).
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
status=0

if "$python" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  devices=(--device cuda --device cpu)
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
  echo "== GPU-marked tests"
  "$python" -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py 2>&1 | tee "$out/gpu_tests.log" || status=1
else
  echo "no CUDA device here (torch.cuda.is_available() is False): skipping the CUDA parts, CPU only"
  devices=(--device cpu)
fi

echo "== harness"
"$python" benchmarks/harness.py "${devices[@]}" --batch-size 1000 --batch-size 10000 --batch-size 20000 \
  --workers 0 --workers 1 --epochs 3 --cuda-variants --rounds "${ROUNDS:-2}" $data_flag --out "$out/harness.md" 2>&1 \
  | tee "$out/harness.log" || status=1
exit $status
