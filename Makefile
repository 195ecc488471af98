# Set-up is part of every target: `.venv` is created and filled on first use.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# CI and CPU machines take the CPU build; GPU users may run `make TORCH=torch ...` for a CUDA build.
TORCH  ?= torch==2.13.0

.PHONY: demo test install clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -qq --upgrade pip
	$(PY) -m pip install -qq "$(TORCH)"
	$(PY) -m pip install -qq -e ".[test,realweights,bench]"
	touch $@

install: $(VENV)/.installed

demo: install
	$(VENV)/bin/bertforge demo --workdir build/demo

test: install
	$(PY) -m pytest -q tests

clean:
	rm -rf build .pytest_cache
