#!/usr/bin/env bash
# One prepared device check for a session that is lent a GPU (see DEVELOPERS guide: run once,
# leave time for one rerun).  The GPU machine has torch and no package index: everything else comes
# from the offline device kit (make device-kit here; carry [".kit"]).  First the kit (install, preflight,
# captures of the built-in models in bf16 and fp16: docs/device-kit.md), then the benchmarks, each bounded
# so one slow compile cannot starve the rest and the whole stays inside SESSION_S.
#   device tool:  bash benchmarks/gpu_session.sh   carry [".kit"]   (timeout_s 600; SESSION_S 570 by default)
# What comes back (the device returns at most 8 files): $OUT/device-kit.tgz (the kit's captures and logs)
# and $OUT/bench.tgz (the benchmarks' JSON and logs), each repacked after every step.
set -uo pipefail
OUT=${OUT:-bench-out}
mkdir -p "$OUT"
PY=${PY:-python3}
SESSION_S=${SESSION_S:-570}
KIT_S=${KIT_S:-230}      # the kit's share: install + doctor + as many captures as fit (each <= 90 s)
B=$(mktemp -d)           # the benchmarks' files, packed into $OUT/bench.tgz
T0=$SECONDS
pack() { tar -czf "$OUT/bench.tgz" -C "$B" . 2>/dev/null; }

if [ -f .kit/run.sh ]; then
  echo "== device kit (${KIT_S} s)"
  OUT=$OUT PY=$PY KIT_BUDGET_S=$((KIT_S - 10)) timeout "$KIT_S" bash .kit/run.sh
  echo "   rc=$?"
  export PYTHONPATH=${KIT_SITE:-/tmp/site}${PYTHONPATH:+:$PYTHONPATH}
elif ! $PY -c "import difforge" 2>/dev/null; then
  echo "no device kit (.kit/run.sh) and difforge does not import: run 'make device-kit' and carry .kit"; exit 1
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$B/gpu.csv" 2>&1
$PY -m difforge doctor --json >"$B/doctor.json" 2>&1

run() {  # name, seconds, command...: skipped when less than 30 s of the session is left, else capped by it
  local name=$1 secs=$2; shift 2
  local left=$((SESSION_S - (SECONDS - T0) - 5))
  if [ "$left" -lt 30 ]; then echo "== $name skipped: the session's ${SESSION_S} s are spent"; return; fi
  [ "$secs" -gt "$left" ] && secs=$left
  echo "== $name ($secs s)"
  timeout "$secs" "$@" >"$B/$name.log" 2>&1
  echo "   rc=$? ; $(tail -n 12 "$B/$name.log" | tr '\n' ' ' | cut -c1-600)"
  pack
}
# The Philox stream on the device: known answers, words and inverse-CDF / Gumbel-max codes device vs CPU,
# ms per full-size draw eager and compiled (issue 12's cross-device check).
run philox     45 $PY scripts/philox_device_check.py --device cuda --rows 1024 --json "$B/philox.json"
# bench_ursa times diffnext in the same process where it imports (carry the ignored reference/ folder, and
# diffnext's own deps: it reports "not timed - why" otherwise); --draws: draw / CFG / scheduler shares;
# --gumbel at 512 only: the Philox stream's other sampler, for the comparison that picked inverse-CDF.
run ursa512   150 $PY -m benchmarks.bench_ursa --size full --device cuda --dtype float16 --compile --draws --gumbel --steps 8 --json "$B/ursa512.json"
run qwen_plus 120 $PY -m benchmarks.bench_qwen_edit --size full --variant plus --device cuda --dtype bf16 --compile --fp8 --json "$B/qwen_plus.json"
run ursa1024  110 $PY -m benchmarks.bench_ursa --size full --res 1024 --device cuda --dtype float16 --compile --draws --steps 8 --json "$B/ursa1024.json"
run qwen_edit  90 $PY -m benchmarks.bench_qwen_edit --size full --variant edit --device cuda --dtype bf16 --fp8 --json "$B/qwen_edit.json"
git rev-parse --short HEAD >"$B/commit.txt" 2>/dev/null
date -u +%F >"$B/date.txt"
pack
ls -la "$OUT"
