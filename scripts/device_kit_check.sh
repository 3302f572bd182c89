#!/usr/bin/env bash
# Prove here that the device kit installs without a package index (make device-kit-check).
# A clean virtualenv holds only torch (constraints.txt's pin: the one package taken from the index, as the GPU
# machine brings its own); the kit is built for THIS interpreter's platform (--platform local --carry-all: a
# clean venv has none of the GPU image's packages); then the kit's own run.sh installs it with
# pip --no-index --no-deps --target, runs its preflight and a CPU capture of tiny-ursa, and from the same
# folder difforge doctor and difforge generate run, away from the project so difforge comes from the wheel.
# Last, pip's own resolver installs difforge into the clean venv from the kit's folder alone
# (pip install --no-index --find-links KIT/wheels difforge), with this machine's pip configuration (which
# names other find-links) switched off, so nothing but the kit can satisfy a requirement.
# KIT_CHECK_MODELS (default tiny-ursa; "" for none) names the CPU captures.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python3}
W=${KIT_CHECK_DIR:-$(mktemp -d)}; mkdir -p "$W"
echo "device-kit-check in $W"
[ -x "$W/venv/bin/python" ] || "$PYTHON" -m venv "$W/venv"
VPY=$W/venv/bin/python
"$VPY" -m pip install -q -c "$ROOT/constraints.txt" torch
"$VPY" -m pip list --format=freeze | tee "$W/venv-before.txt"
"$ROOT/.venv/bin/python" "$ROOT/scripts/device_kit.py" --platform local --carry-all --out "$W/kit"
cd "$W"
OUT=$W/out PY=$VPY DEV=cpu KIT_SITE=$W/site KIT_MODELS=${KIT_CHECK_MODELS-tiny-ursa} KIT_DTYPES=bf16 KIT_STEP_S=300 KIT_BUDGET_S=400 \
  KIT_MAX_BYTES=${KIT_MAX_BYTES:-64000000} DIFFORGE_HOME=$W/home bash "$W/kit/run.sh"
tar -tzf "$W/out/device-kit.tgz" | sort | head -40
export PYTHONPATH=$W/site DIFFORGE_HOME=$W/home HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
"$VPY" -c "import difforge; assert difforge.__file__.startswith('$W/site/'), difforge.__file__; print('difforge from', difforge.__file__)"
"$VPY" -m difforge doctor
"$VPY" -m difforge generate --model tiny-ursa --prompt "a red circle" --output "$W/tiny-ursa.png"
PYTHONPATH= "$VPY" -m pip list --format=freeze | diff "$W/venv-before.txt" -   # set -e: any change fails the check
echo "the venv itself still holds only torch and its own requirements"
# pip's resolver, the kit's wheels as the only source: every requirement of difforge found there (or in the venv)
env -u PIP_FIND_LINKS -u PIP_EXTRA_INDEX_URL -u PIP_INDEX_URL PIP_CONFIG_FILE=/dev/null PYTHONPATH= \
  "$VPY" -m pip install -q --no-index --find-links "$W/kit/wheels" difforge
PYTHONPATH= "$VPY" -c "import difforge, diffusers, transformers; assert difforge.__file__.startswith('$W/venv/'), difforge.__file__; print('pip --no-index --find-links: difforge', difforge.__version__, 'from', difforge.__file__)"
PYTHONPATH= "$VPY" -m difforge doctor >/dev/null
echo "device-kit-check: OK ($W)"
