# DRTriton: `make demo` runs the whole loop on embedded sizes, `make test` runs the suite.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TORCH_CPU_SPEC ?= torch==2.13.0+cpu
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
PYTEST_ARGS ?=
DEMO_ARGS ?=

.PHONY: install demo test test-slow bench lint format protos clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
	  echo "NVIDIA GPU found: installing the default (CUDA) torch build"; \
	else \
	  echo "No NVIDIA GPU: installing the CPU build of torch"; \
	  $(BIN)/python -m pip install -q "$(TORCH_CPU_SPEC)" 2>/dev/null || \
	  $(BIN)/python -m pip install -q "$(TORCH_CPU_SPEC)" --extra-index-url $(TORCH_CPU_INDEX); \
	fi
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[sandbox,synth,learner,dev]"
	@touch $(STAMP)

demo: install
	$(BIN)/drtriton demo $(DEMO_ARGS)

test: install
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

test-slow: install
	$(BIN)/python -m pytest -q -m slow $(PYTEST_ARGS)

bench: install
	$(BIN)/python -m bench

lint: install
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

format: install
	$(BIN)/ruff format . && $(BIN)/ruff check --fix .

protos: install
	$(BIN)/python -m protos.generate

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
