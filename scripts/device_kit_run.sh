#!/usr/bin/env bash
# The device kit's run (make device-kit copies this to .kit/run.sh): on a GPU machine with torch and no
# package index, install the kit's wheels beside the machine's torch and capture the built-in models on
# the device in bf16 and fp16 with `difforge capture --clean`.  Nothing is judged here: the captures come
# back and are judged elsewhere (`difforge validate --capture`, and CI once kept under tests/fixtures/captures/).
#
#   device tool, from the project root, carry [".kit"]:   bash .kit/run.sh            (writes $OUT/device-kit.tgz)
#   CPU dry run here:   DEV=cpu PY=<python> KIT_SITE=<folder> bash .kit/run.sh
#
# KIT_MODELS="" installs and checks only; KIT_INSTALLED=1 then captures without installing again
# (benchmarks/gpu_session.sh does both, the captures last).
#
# Everything comes back as ONE tarball (the device returns at most 8 files), repacked after each step so a
# time-out loses nothing, and kept within KIT_MAX_BYTES (8 MB): each capture is made at 64x64 under
# `--max-bytes` KIT_CAPTURE_BYTES (KIT_MAX_BYTES / 8: eight fit), and a capture that would still push the
# tarball over is left out (steps.txt says so; its log stays).  KIT_BUDGET_S bounds the whole run, KIT_STEP_S
# each capture.
set -uo pipefail
KIT=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-$PWD/kit-out}; mkdir -p "$OUT"
PY=${PY:-python3}
DEV=${DEV:-cuda}
SITE=${KIT_SITE:-/tmp/site}
MODELS=${KIT_MODELS-"shapes-ursa shapes-qwen-edit tiny-ursa tiny-qwen-edit"}
DTYPES=${KIT_DTYPES:-"bf16 fp16"}
BUDGET_S=${KIT_BUDGET_S:-300}
STEP_S=${KIT_STEP_S:-90}
MAX_BYTES=${KIT_MAX_BYTES:-8000000}
CAPTURE_BYTES=${KIT_CAPTURE_BYTES:-$((MAX_BYTES / 8))}
TGZ=$OUT/device-kit.tgz
T=$(mktemp -d); L=$T/logs; C=$T/captures; mkdir -p "$L" "$C"
T0=$SECONDS

pack() { tar -czf "$TGZ.part" -C "$T" . && mv "$TGZ.part" "$TGZ"; }
note() { echo "$*" | tee -a "$L/steps.txt"; }

# 1. the wheels, beside (never over) the machine's torch: no index, no dependency resolution, no editable install
#    (KIT_INSTALLED=1: an earlier run of this session installed them into the same KIT_SITE)
if [ "${KIT_INSTALLED:-0}" = 1 ]; then
  echo "install skipped (KIT_INSTALLED=1): the wheels are in $SITE" >"$L/pip.log"
elif ! $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$KIT"/wheels/*.whl \
    >"$L/pip.log" 2>&1; then
  note "== install rc=1 :: $(tail -n 5 "$L/pip.log" | tr '\n' ' ' | cut -c1-400)"; pack; exit 1
fi
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
export DIFFORGE_HOME=${DIFFORGE_HOME:-$(mktemp -d)} PYTHONUNBUFFERED=1 MPLBACKEND=Agg
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
cp "$KIT/manifest.json" "$L/" 2>/dev/null
# every requirement of the installed difforge satisfied here (the machine's own packages included)?
if ! $PY "$KIT/kit.py" --preflight >"$L/preflight.log" 2>&1; then
  note "== preflight FAILED :: $(grep -v FAILED "$L/preflight.log" | tr '\n' ' ' | cut -c1-600)"; pack; exit 1
fi
{ command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  $PY -c "import torch, transformers, diffusers, difforge; print('torch', torch.__version__, 'transformers', transformers.__version__, 'diffusers', diffusers.__version__, 'difforge', difforge.__file__)"
} >"$L/env.txt" 2>&1
timeout 60 $PY -m difforge doctor --json >"$L/doctor.json" 2>"$L/doctor.log"
note "== install + doctor rc=$? $((SECONDS - T0))s :: $(tail -n 1 "$L/env.txt" | cut -c1-300)"
pack

# 2. the captures, one per model and dtype, each bounded; the run as a whole within BUDGET_S
for model in $MODELS; do
  for dtype in $DTYPES; do
    name=$model-$DEV-$dtype
    left=$((BUDGET_S - (SECONDS - T0)))
    if [ "$left" -lt 20 ]; then note "== $name skipped: the run's budget (${BUDGET_S}s) is spent"; continue; fi
    secs=$(( left < STEP_S ? left : STEP_S )); t1=$SECONDS
    timeout "$secs" $PY -m difforge capture --model "$model" --device "$DEV" --dtype "$dtype" --quick --no-speed-table \
      --height 64 --width 64 --max-bytes "$CAPTURE_BYTES" --clean --out "$C/$name" >"$L/$name.log" 2>&1
    rc=$?
    note "== $name rc=$rc $((SECONDS - t1))s :: $(tail -n 2 "$L/$name.log" | tr '\n' ' ' | cut -c1-300)"
    [ "$rc" -ne 0 ] && rm -rf "${C:?}/$name"   # a half-made bundle would only be refused; its log stays
    pack
    if [ "$(stat -c %s "$TGZ")" -gt "$MAX_BYTES" ]; then   # keep what fits; a smaller capture may still fit
      rm -rf "${C:?}/$name"; note "== $name left out: with it the tarball exceeds $MAX_BYTES bytes"; pack
    fi
  done
done
date -u +%FT%TZ >"$L/date.txt"
note "== device kit done in $((SECONDS - T0))s"; pack
echo "$TGZ: $(stat -c %s "$TGZ") bytes"
