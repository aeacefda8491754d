#!/usr/bin/env bash
# Wheels of MLflow's tracking client and sqlite store for the lent GPU machine, which has PyTorch and
# the scientific stack (Python 3.12) but no MLflow and no network. Run here, where pip reaches PyPI;
# then carry `.whl` (ignored by git) with the device call, and gpu_check.sh installs them with
# `pip install --no-index --no-deps --target /tmp/site`.
#
# The list is mlflow-skinny's own dependencies (pip's resolution for Python 3.12, 2026-12-01) minus
# what the GPU machine's image already holds (its package list: the device tool's KINDS.md), plus
# SQLAlchemy and alembic for the sqlite store. About 22 MB, inside the 64 MiB a call carries beside data/.
# Usage: bash benchmarks/gpu_wheels.sh [FOLDER]   (default .whl)
set -euo pipefail
cd "$(dirname "$0")/.."
folder="${1:-.whl}"
mkdir -p "$folder"
mlflow_version=$(sed -n 's/^mlflow==//p' constraints.txt)  # the MLflow release the tests ran
wheels=(
  "mlflow-skinny==$mlflow_version" sqlalchemy==2.1.9 alembic==1.20.1 mako==1.4.3
  opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2 opentelemetry-proto==1.45.2
  opentelemetry-semantic-conventions==0.66b2
  databricks-sdk==0.162.0 google-auth==2.63.0 pyasn1==0.6.5 pyasn1-modules==0.4.2 cachetools==7.3.3
  cryptography==50.0.2 cffi==2.1.1 pycparser==3.12
  gitpython==3.2.1 gitdb==4.0.12 smmap==5.0.3 sqlparse==0.6.1 python-dotenv==1.2.4 importlib-metadata==9.1.0
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
  fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0
)
python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$folder" "${wheels[@]}" \
  2>&1 | { grep -v "^WARNING: Location 'file:" || true; }
echo "$(ls "$folder"/*.whl | wc -l) wheels, $(du -sh "$folder" | cut -f1), in $folder: carry it with the device call"
