# Two entry points do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
export DIFFORGE_HOME ?= $(CURDIR)/.difforge-home
# Inductor's compiled kernels live in the clone, not in the machine-wide /tmp/torchinductor_<user>: a kernel
# cache left corrupt there by another process (seen 2026-12-05: a cached CPU kernel aborted the interpreter on
# load, while the same test passed from a fresh cache) must not fail this clone's tests or demo.
export TORCHINDUCTOR_CACHE_DIR ?= $(CURDIR)/.cache/torchinductor

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

.PHONY: demo test test-slow test-parity test-msprobe msprobe-venv lint bench-tiny clean venv train-shapes device-kit \
	device-kit-check test-oldest oldest-venv

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

# `make test` leaves out the slow end-to-end checks (`@pytest.mark.slow`: minutes each, e.g. the trained
# models on held-out prompts); `make test-slow` runs just those.  CI (.ci/run) runs both.
test: $(STAMP)
	$(PY) -m ruff check src tests benchmarks scripts
	$(PY) -m pytest -n 2 --durations=15 -m "not slow"

test-slow: $(STAMP)
	$(PY) -m pytest -n 2 --durations=15 -m slow

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

# The offline device kit (docs/device-kit.md): wheels for a GPU machine with torch and no package index
# (CPython 3.12, manylinux x86_64) + run.sh, in the ignored .kit/.  On the device tool: carry [".kit"], run
# `bash .kit/run.sh` (benchmarks/gpu_session.sh does it first).  device-kit-check proves here that a kit
# installs with pip --no-index into a clean venv holding only torch, then runs doctor and generate from it.
KIT := .kit
device-kit: $(STAMP)
	$(PY) scripts/device_kit.py --out $(KIT)

device-kit-check: $(STAMP)
	bash scripts/device_kit_check.sh

# The oldest versions pyproject.toml accepts (constraints-oldest.txt), in their own virtualenv layered on
# .venv like the msprobe one: the Qwen-Image-Edit loader and pipeline tests on them.
OLDEST_VENV  := .venv-oldest
OLDEST_PY    := $(OLDEST_VENV)/bin/python
OLDEST_STAMP := $(OLDEST_VENV)/.installed
OLDEST_TESTS := tests/models/qwen_edit/test_tiny_builds.py tests/models/qwen_edit/test_processor_layout.py \
	tests/models/qwen_edit/test_pipeline.py tests/models/qwen_edit/test_folder_checks.py tests/models/test_trained.py

oldest-venv: $(OLDEST_STAMP)

$(OLDEST_STAMP): $(STAMP) constraints-oldest.txt
	test -x $(OLDEST_PY) || $(PY) -m venv $(OLDEST_VENV)
	$(PY) -c 'import sysconfig; print("import site; site.addsitedir(%r)" % sysconfig.get_paths()["purelib"])' \
	  > "$$($(OLDEST_PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/_difforge_base.pth"
	$(OLDEST_PY) -m pip install -q -c constraints-oldest.txt diffusers transformers
	$(OLDEST_PY) -c 'import diffusers, transformers; print("diffusers", diffusers.__version__, "transformers", transformers.__version__)'
	touch $@

test-oldest: $(OLDEST_STAMP)
	DIFFORGE_HOME=$(CURDIR)/.difforge-home-oldest $(OLDEST_PY) -m pytest -p no:cacheprovider --durations=5 $(OLDEST_TESTS)

lint: $(STAMP)
	$(PY) -m ruff check src tests benchmarks scripts

bench-tiny: $(STAMP)
	$(PY) -m benchmarks.bench_ursa --tiny
	$(PY) -m benchmarks.bench_qwen_edit --tiny

clean:
	rm -rf $(VENV) $(MSPROBE_VENV) $(OLDEST_VENV) $(KIT) demo-out .difforge-home .difforge-home-* .pytest_cache
