# `make run` and `make test` set up everything they need; `make setup` does only that.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
GRID   ?= experiments/quickstart.yaml
# `mlflow run` puts the project run in this experiment: the grid's `experiment:`, else its file name.
EXPERIMENT ?= $(or $(shell sed -n 's/^experiment:[[:space:]]*\([^#[:space:]]*\).*/\1/p' $(GRID) 2>/dev/null),$(basename $(notdir $(GRID))))
FASHION_DIRS := $(PIPELINE_DATA_DIR) data data/FashionMNIST/raw /usr/share/datasets/fashion-mnist
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
# pip warns about every missing local index folder on these machines; keep real messages only.
PIP := $(BIN)/python -m pip install -q --disable-pip-version-check
QUIET := 2>&1 | { grep -v "^WARNING: Location 'file:" || true; }

.PHONY: setup data browser postgres run grid-file lint test test-slow durations docs compat clean

setup: $(STAMP) data

# constraints.txt pins torch, torchvision and MLflow (the newest tested releases); pip takes these
# exact torch/torchvision builds from this machine's disk, other pins download GBs. The package goes in
# under the same file, so nothing it pulls moves them.
# setuptools' "Editable installation" notice (mind same-named folders) comes with every -e: not a problem.
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip $(QUIET)
	$(PIP) -r constraints.txt $(QUIET)
	PYTHONWARNINGS='ignore:Editable installation' $(PIP) -c constraints.txt -e '.[test,ray,server,docs]' $(QUIET)
	touch $@

# Fashion-MNIST: Debian's dataset-fashion-mnist when missing (as root), else say what to do.
data:
	@for d in $(FASHION_DIRS); do \
	  if [ -e "$$d/train-images-idx3-ubyte.gz" ] || [ -e "$$d/train-images-idx3-ubyte" ]; then \
	    echo "Fashion-MNIST: $$d"; exit 0; fi; done; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "Fashion-MNIST missing: installing Debian's dataset-fashion-mnist"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist >/dev/null) \
	    || echo "warning: apt-get could not install dataset-fashion-mnist; 'make run' needs the data"; \
	else \
	  echo "Fashion-MNIST not found. Install it with: sudo apt-get install dataset-fashion-mnist"; \
	  echo "  or put the four IDX files in ./data, or set PIPELINE_DATA_DIR, or: $(BIN)/pipeline data --download"; \
	fi

# The default experiment through `mlflow run` on the embedded sqlite store (./mlflow.db).
run: grid-file setup
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/mlflow run . --env-manager local \
	  --experiment-name $(EXPERIMENT) -P grid=$(GRID)

# Before anything is set up or started: MLflow would make the experiment and a project run that
# stays RUNNING before it finds that the grid file is missing.
grid-file:
	@test -f "$(GRID)" || { echo "error: GRID=$(GRID): no such grid file; pick one of experiments/*.yaml, e.g. make run GRID=experiments/quickstart.yaml" >&2; exit 2; }

# $(call debian,PACKAGE,TEST,WHAT): when TEST fails, install Debian's PACKAGE with apt-get as root,
# else say that WHAT will be skipped. The UI tests open MLflow in Debian's chromium through
# Playwright (never a downloaded browser); the PostgreSQL tests run Debian's postgresql binaries
# from a temp dir on a free port (no system service is used).
define debian
	@if $(2); then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "$(1) missing: installing Debian's $(1) for $(3)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(1) >/dev/null) \
	    || echo "warning: apt-get could not install $(1); $(3) will be skipped"; \
	else \
	  echo "$(1) not found: $(3) will be skipped (sudo apt-get install $(1))"; \
	fi
endef

browser:
	$(call debian,chromium,command -v chromium >/dev/null,the browser tests)

postgres:
	$(call debian,postgresql,ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1,the PostgreSQL tests)

# ruff (pyproject's [tool.ruff]: lint, and the format `ruff format` writes) and mypy (its [tool.mypy]:
# strict on the analysis modules); `make test` runs it first, so a lint, format or type error fails the
# tests and CI. `.venv/bin/ruff format pipeline tests benchmarks docs` formats.
lint: setup
	$(BIN)/ruff check pipeline tests benchmarks docs
	$(BIN)/ruff format --check pipeline tests benchmarks docs
	$(BIN)/mypy

# Two workers, one test file each at a time: servers and sweeps wait on I/O much of the time.
# Files in collection order (conftest puts the longest first, by tests/durations.json), not xdist's most-tests-first.
# The tests build the docs site with --strict (tests/conftest.py): a broken link or a page missing from the nav fails.
# The longest end-to-end tests (marker `slow`) are `make test-slow`; CI (.ci/run) runs both.
test: setup lint browser postgres
	$(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder -m "not slow"

test-slow: setup browser postgres
	$(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder -m slow

# Both tiers, each test's seconds recorded into tests/durations.json: the order the tiers run their
# files in (longest first), and what tests/test_layout.py holds to FAST_TEST_LIMIT_S. Commit the file.
durations: setup browser postgres
	PIPELINE_RECORD_DURATIONS=1 $(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder -m "not slow"
	PIPELINE_RECORD_DURATIONS=1 $(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder -m slow

# The docs site (docs/, mkdocs.yml) at http://127.0.0.1:8000, rebuilt as pages change.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --dev-addr 127.0.0.1:8000

# The declared floors (every `>=` in pyproject.toml, exactly) in a throwaway venv, through the
# smoke in tests/compat/ (a sweep, a rerun, compare, register, predict, a pyfunc load); `make test`
# covers the newest, constraints.txt. PINS="mlflow==3.14.0" tries another release in a floor's place.
compat:
	PYTHON=$(PYTHON) PINS="$(PINS)" tests/compat/run

clean:
	rm -rf $(VENV) mlflow.db mlruns mlartifacts .pytest_cache .mypy_cache .ruff_cache
