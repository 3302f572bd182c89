# Two entry points do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
export DIFFORGE_HOME ?= $(CURDIR)/.difforge-home

# Float results whose last bits follow the CPU's kernels: CI reruns these under every lower
# ATEN_CPU_CAPABILITY this CPU can execute (scripts/cpu_capabilities.py), so no pin tied to one
# kernel family (AVX-512, AVX2, aarch64's portable path) can land.  Each run builds its own tiny
# models too: torch.randn's vectorised kernel rounds differently per family, so the weights do.
PARITY_TESTS := tests/models/ursa/test_pipeline.py tests/models/ursa/test_video_pipeline.py \
	tests/models/ursa/test_vae_fsq.py tests/models/ursa/test_parity_bounds.py tests/models/ursa/test_transformer.py \
	tests/models/ursa/test_scheduler.py tests/models/ursa/test_perf_exact.py tests/runtime/test_philox.py \
	tests/models/ursa/test_philox_stream.py

# The optional msprobe extra (validate/golden --msprobe) lives in its own virtualenv layered on .venv (a .pth
# file adds .venv's site-packages), so the main suite never imports msprobe's ~430 MB of dependencies and
# torch stays constraints.txt's pin (the extra does not pull torch).  `make test-msprobe` runs its test file.
MSPROBE_VENV  := .venv-msprobe
MSPROBE_PY    := $(MSPROBE_VENV)/bin/python
MSPROBE_STAMP := $(MSPROBE_VENV)/.installed
MSPROBE_TESTS := tests/validate/test_msprobe.py

.PHONY: demo test test-parity test-msprobe msprobe-venv lint bench-tiny clean venv train-shapes

# Retrain the shapes models (seeded, CPU; docs/shapes-training.md has the times; CI never trains).
SHAPES_WEIGHTS := src/difforge/models/weights

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt -e '.[dev,video]'
	touch $(STAMP)

train-shapes: $(STAMP)
	$(PY) -m difforge.training.shapes_ursa --out $(SHAPES_WEIGHTS)/shapes-ursa
	$(PY) -m difforge.training.shapes_qwen_edit --out $(SHAPES_WEIGHTS)/shapes-qwen-edit

demo: $(STAMP)
	$(PY) -m difforge.demo --out demo-out

test: $(STAMP)
	$(PY) -m ruff check src tests benchmarks scripts
	$(PY) -m pytest -n 2 --durations=15

test-parity: $(STAMP)
	@for cap in $$($(PY) scripts/cpu_capabilities.py); do \
	  echo "parity tests with ATEN_CPU_CAPABILITY=$$cap"; \
	  ATEN_CPU_CAPABILITY=$$cap DIFFORGE_HOME=$(CURDIR)/.difforge-home-$$cap $(PY) -m pytest -n 2 -p no:cacheprovider $(PARITY_TESTS) || exit 1; \
	done

msprobe-venv: $(MSPROBE_STAMP)

$(MSPROBE_STAMP): $(STAMP)
	test -x $(MSPROBE_PY) || $(PY) -m venv $(MSPROBE_VENV)
	$(PY) -c 'import sysconfig; print("import site; site.addsitedir(%r)" % sysconfig.get_paths()["purelib"])' \
	  > "$$($(MSPROBE_PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/_difforge_base.pth"
	$(MSPROBE_PY) -m pip install -q -c constraints.txt -e '.[msprobe]'
	$(MSPROBE_PY) -c 'import msprobe, torch, difforge.validate.msprobe_view as v; assert v.available(); print("msprobe", v.version(), "torch", torch.__version__)'
	touch $@

test-msprobe: $(MSPROBE_STAMP)
	$(MSPROBE_PY) -m pytest -p no:cacheprovider --durations=5 $(MSPROBE_TESTS)

lint: $(STAMP)
	$(PY) -m ruff check src tests benchmarks scripts

bench-tiny: $(STAMP)
	$(PY) -m benchmarks.bench_ursa --tiny
	$(PY) -m benchmarks.bench_qwen_edit --tiny

clean:
	rm -rf $(VENV) $(MSPROBE_VENV) demo-out .difforge-home .difforge-home-* .pytest_cache
