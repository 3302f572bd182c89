#!/usr/bin/env bash
# One prepared device check for a session that is lent a GPU (docs/device-kit.md, "The GPU session"): run
# once, leave time for one rerun.  The GPU machine has torch and no package index: everything else comes from
# the offline device kit (make device-kit here, with diffnext's source in reference/ or $DIFFORGE_DIFFNEXT_PATH
# so the kit carries the reference as a wheel; carry [".kit"]).
#   device tool:  bash benchmarks/gpu_session.sh   carry [".kit"]   (timeout_s 570; SESSION_S 520 by default)
# Order (issue 27 first): install the kit + doctor; URSA 512² (every variant, diffnext eager and compiled in
# the same process, draw/sampler shares, the fused kernels' off state); Qwen-Image-Edit-Plus 1024² bf16 and
# fp8 side by side, eager, then compiled; URSA 1024²; the Philox check; the kit's captures with what is left.
# Every step is capped by `timeout` and by the time the session has left, so the whole ends inside 9 minutes.
# What comes back (the device returns at most 8 files): $OUT/device-session.tgz (every log and JSON, the kit's
# own tarballs inside) and $OUT/summary.md (scripts/device_kit_summary.py: the section benchmarks/RESULTS.md
# takes as it is), both rewritten after every step so a time-out loses nothing.
set -uo pipefail
OUT=${OUT:-bench-out}
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
PY=${PY:-python3}
SESSION_S=${SESSION_S:-520}
SITE=${KIT_SITE:-/tmp/site}
S=$(mktemp -d); B=$S/bench; mkdir -p "$B"   # staged here, packed into $OUT/device-session.tgz
T0=$SECONDS
HERE=$(pwd)
COMMAND="bash benchmarks/gpu_session.sh"
export DIFFORGE_HOME=${DIFFORGE_HOME:-$S/home} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

summarise() {
  $PY "$HERE/scripts/device_kit_summary.py" "$S" --command "$COMMAND" --out "$OUT/summary.md" >"$S/summary.log" 2>&1 \
    && cp "$OUT/summary.md" "$S/summary.md"
}
pack() { summarise; tar -czf "$OUT/device-session.tgz.part" -C "$S" . 2>/dev/null && mv "$OUT/device-session.tgz.part" "$OUT/device-session.tgz"; }
left() { echo $((SESSION_S - (SECONDS - T0) - 10)); }
run() {  # name, seconds, command...: skipped when under 30 s of the session is left, else capped by what is left
  local name=$1 secs=$2; shift 2
  local rest; rest=$(left)
  if [ "$rest" -lt 30 ]; then echo "== $name skipped: the session's ${SESSION_S} s are spent" | tee -a "$S/steps.txt"; return; fi
  [ "$secs" -gt "$rest" ] && secs=$rest
  local t1=$SECONDS
  timeout "$secs" "$@" >"$B/$name.log" 2>&1
  local rc=$?
  echo "== $name rc=$rc $((SECONDS - t1))s (cap ${secs}s)" | tee -a "$S/steps.txt"
  tail -n 4 "$B/$name.log" | cut -c1-300
  pack
}

# the device's copy of the tree may have no .git: COMMIT=<hash> names the commit then
echo "${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}" >"$S/commit.txt"
date -u +%FT%TZ >"$S/date.txt"
if [ -f .kit/run.sh ]; then  # 1. install + preflight + doctor only; the captures come last
  OUT=$S/kit-install PY=$PY KIT_SITE=$SITE KIT_MODELS="" KIT_BUDGET_S=90 timeout 100 bash .kit/run.sh >"$S/kit-install.log" 2>&1
  echo "== kit install rc=$? $((SECONDS - T0))s" | tee -a "$S/steps.txt"
  export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
elif ! $PY -c "import difforge" 2>/dev/null; then
  echo "no device kit (.kit/run.sh) and difforge does not import: run 'make device-kit' and carry .kit"; exit 1
fi
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$S/gpu.csv" 2>&1
else
  echo "no nvidia-smi on this machine" >"$S/gpu.csv"
fi
$PY -c "import torch, transformers, diffusers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'diffusers', diffusers.__version__)" >"$S/versions.txt" 2>&1
pack

# 2. URSA-1.7B 512², fp16, CFG 7: baseline, default, fused kernels off, compile (Inductor's default mode);
#    diffnext eager and compiled from the same process; draw / CFG / scheduler shares.  The host-drawn
#    reference stream (2.9 s a step on the H200, measured 2026-12-04) is left out.
run ursa512   150 $PY -m benchmarks.bench_ursa --size full --device cuda --dtype float16 --compile --draws --no-host-stream --steps 8 --json "$B/ursa512.json"
# 3. Qwen-Image-Edit-Plus 1024², true CFG: bf16 and fp8 storage side by side (eager), then both compiled.
run qwen_plus  90 $PY -m benchmarks.bench_qwen_edit --size full --variant plus --device cuda --dtype bf16 --fp8 --steps 4 --json "$B/qwen_plus.json"
run qwen_plus_compiled 110 $PY -m benchmarks.bench_qwen_edit --size full --variant plus --device cuda --dtype bf16 --fp8 --compile --steps 4 --json "$B/qwen_plus_compiled.json"
# 4. URSA-1.7B 1024²: the default and compiled (the reference's eager and compiled beside them).
run ursa1024   90 $PY -m benchmarks.bench_ursa --size full --res 1024 --device cuda --dtype float16 --compile --no-host-stream --steps 4 --json "$B/ursa1024.json"
# 5. the Philox stream on the device: known answers, device vs CPU words and codes, ms per full-size draw.
run philox     30 $PY scripts/philox_device_check.py --device cuda --rows 1024 --json "$B/philox.json"
# 6. the kit's captures (docs/device-kit.md) with what is left; each capture capped by the kit itself.
if [ ! -f .kit/run.sh ]; then
  echo "== kit captures skipped: no .kit/run.sh" | tee -a "$S/steps.txt"
elif [ "$(left)" -ge 60 ]; then
  budget=$(left)
  OUT=$S/kit-captures PY=$PY KIT_SITE=$SITE KIT_INSTALLED=1 KIT_BUDGET_S=$((budget - 5)) timeout "$budget" bash .kit/run.sh \
    >"$S/kit-captures.log" 2>&1
  echo "== kit captures rc=$? (budget ${budget}s)" | tee -a "$S/steps.txt"
else
  echo "== kit captures skipped: under 60 s left" | tee -a "$S/steps.txt"
fi
echo "== session done in $((SECONDS - T0))s" | tee -a "$S/steps.txt"
pack
ls -la "$OUT"
