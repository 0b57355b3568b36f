# The two commands a fresh machine needs: `make demo` and `make test`.
# Both create .venv when missing and (re)install ember when pyproject.toml or the pins change.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check
PIN    := -c constraints.txt

.PHONY: demo test test-lowest docs docs-serve lint typecheck bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(VENV)/.demo-installed: $(PY) pyproject.toml constraints.txt
	$(PIP) install -q $(PIN) -e ".[demo]"
	@touch $@

$(VENV)/.dev-installed: $(PY) pyproject.toml constraints.txt
	$(PIP) install -q $(PIN) -e ".[dev]"
	@touch $@ $(VENV)/.demo-installed $(VENV)/.docs-installed

## the main job: a small CNN on scikit-learn's digits, trained with ember
demo: $(VENV)/.demo-installed
	$(PY) examples/demo.py

## the whole suite: lint, type check, then every test on 2 pytest-xdist workers: the multi-process
## tests one after the other on one, every other module whole on either (tests/conftest.py);
## PYTEST_WORKERS=0 runs it in one process
PYTEST_WORKERS ?= 2
test: $(VENV)/.dev-installed lint typecheck
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadscope

## the lowest dependency versions pyproject.toml allows, in a venv of their own, and a subset of the tests (~3 min)
test-lowest:
	scripts/test_lowest.sh

$(VENV)/.bench-installed: $(PY) pyproject.toml constraints.txt
	$(PIP) install -q $(PIN) -e ".[bench]"
	@touch $@

## side-by-side benchmarks vs the hand loop and the peers (~20 min; docs/performance.md)
bench: $(VENV)/.bench-installed
	$(PY) -m benchmarks

$(VENV)/.docs-installed: $(PY) pyproject.toml constraints.txt
	$(PIP) install -q $(PIN) -e ".[docs]"
	@touch $@

## the documentation site (mkdocs.yml) into site/; --strict: a broken link, anchor or API reference fails it (~10 s)
docs: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --clean

## the site at http://127.0.0.1:8000, rebuilt on every change (warnings shown, not fatal: make docs is the check)
docs-serve: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs serve --no-strict

lint: $(VENV)/.dev-installed
	$(PY) -m ruff check src tests examples benchmarks
	$(PY) -m ruff format --check src tests examples benchmarks

typecheck: $(VENV)/.dev-installed
	$(PY) -m mypy

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache site
