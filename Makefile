# Two-command quick start: `make train` and `make test` (see README.md).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
UV := $(VENV)/bin/uv
# Installs into the venv with uv (installed into it by pip: a fresh install takes seconds, not
# half a minute), or with pip where uv cannot (no uv wheel for the platform, or an index that
# only pip's own configuration names: uv does not read pip.conf, but it is given
# PIP_INDEX_URL / PIP_EXTRA_INDEX_URL from the environment).
UV_ENV = $(if $(PIP_INDEX_URL),UV_DEFAULT_INDEX='$(PIP_INDEX_URL)') \
	$(if $(PIP_EXTRA_INDEX_URL),UV_INDEX='$(PIP_EXTRA_INDEX_URL)')
INSTALL = if [ -x $(UV) ] && $(UV_ENV) $(UV) pip install -q --python $(PY) $(1); then :; \
	else echo "installing with pip" >&2; $(PIP) install -q $(1); fi
ARGS ?=
# Test processes (pytest-xdist); each test file runs whole in one of them. A worker that dies
# (a crash in native code) ends the run at once, failed: xdist's replacement of a dead worker
# can hang `--dist loadfile` to the end of CI's time (pytest-dev/pytest-xdist#784, #1323).
TEST_WORKERS ?= 2

.PHONY: train test install install-test clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q uv || echo "no uv for this platform; installing with pip" >&2

$(VENV)/.installed: $(PY) setup.py
	$(call INSTALL,-e .)
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed setup.py
	$(call INSTALL,-e '.[test]')
	touch $@

install: $(VENV)/.installed

install-test: $(VENV)/.installed-test

## Runs the main job (Agentic GRPO on the embedded default task) into a fresh workdir.
train: $(VENV)/.installed
	$(PY) -m launch.train $(ARGS)

## Installs the test extra and runs the whole test suite (TEST_WORKERS processes, 1 = serial).
test: $(VENV)/.installed-test
	$(PY) -m pytest -q tests -n $(TEST_WORKERS) --dist loadfile --max-worker-restart=0 $(ARGS)

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
