#!/usr/bin/env bash
# One prepared device check for a session that is lent a GPU (see DEVELOPERS guide: run once,
# leave time for one rerun).  Installs nothing beyond the project; writes JSON + logs to $OUT.
#   device tool:  bash benchmarks/gpu_session.sh        (timeout_s ~540)
# Each benchmark gets its own time budget so one slow compile cannot starve the others.
set -uo pipefail
OUT=${OUT:-bench-out}
mkdir -p "$OUT"
PY=${PY:-python}
if ! $PY -c "import difforge" 2>/dev/null; then
  $PY -m pip install -q -e . >"$OUT/install.log" 2>&1 || { echo "install failed"; tail -20 "$OUT/install.log"; exit 1; }
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$OUT/gpu.csv" 2>&1
$PY -m difforge doctor --json >"$OUT/doctor.json" 2>&1

run() {  # name, seconds, command...
  local name=$1 secs=$2; shift 2
  echo "== $name ($secs s)"
  timeout "$secs" "$@" >"$OUT/$name.log" 2>&1
  echo "   rc=$? ; $(tail -n 12 "$OUT/$name.log" | tr '\n' ' ' | cut -c1-600)"
}
run ursa512   110 $PY -m benchmarks.bench_ursa --size full --device cuda --dtype float16 --compile --steps 8 --json "$OUT/ursa512.json"
run ursa1024  110 $PY -m benchmarks.bench_ursa --size full --res 1024 --device cuda --dtype float16 --compile --steps 8 --json "$OUT/ursa1024.json"
run qwen_plus 150 $PY -m benchmarks.bench_qwen_edit --size full --variant plus --device cuda --dtype bf16 --compile --fp8 --json "$OUT/qwen_plus.json"
run qwen_edit 120 $PY -m benchmarks.bench_qwen_edit --size full --variant edit --device cuda --dtype bf16 --fp8 --json "$OUT/qwen_edit.json"
git rev-parse --short HEAD >"$OUT/commit.txt" 2>/dev/null
date -u +%F >"$OUT/date.txt"
