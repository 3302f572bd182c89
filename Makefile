# Two entry points do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
export DIFFORGE_HOME ?= $(CURDIR)/.difforge-home

.PHONY: demo test lint bench-tiny clean venv

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt -e '.[dev,video]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m difforge.demo --out demo-out

test: $(STAMP)
	$(PY) -m ruff check src tests benchmarks
	$(PY) -m pytest -n 2 --durations=15

lint: $(STAMP)
	$(PY) -m ruff check src tests benchmarks

bench-tiny: $(STAMP)
	$(PY) -m benchmarks.bench_ursa --tiny
	$(PY) -m benchmarks.bench_qwen_edit --tiny

clean:
	rm -rf $(VENV) demo-out .difforge-home .pytest_cache
