# Two-command quick start: `make train` and `make test` (see README.md).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
ARGS ?=
# Test processes (pytest-xdist); each test file runs whole in one of them.
TEST_WORKERS ?= 2

.PHONY: train test install install-test clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(VENV)/.installed: $(PY) setup.py
	$(PIP) install -q -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed setup.py
	$(PIP) install -q -e '.[test]'
	touch $@

install: $(VENV)/.installed

install-test: $(VENV)/.installed-test

## Runs the main job (Agentic GRPO on the embedded default task) into a fresh workdir.
train: $(VENV)/.installed
	$(PY) -m launch.train $(ARGS)

## Installs the test extra and runs the whole test suite (TEST_WORKERS processes, 1 = serial).
test: $(VENV)/.installed-test
	$(PY) -m pytest -q tests -n $(TEST_WORKERS) --dist loadfile $(ARGS)

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
