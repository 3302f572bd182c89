#!/usr/bin/env bash
# One prepared device check for a session that is lent a GPU (see DEVELOPERS guide: run once,
# leave time for one rerun).  Installs nothing beyond the project; writes JSON + logs to $OUT.
#   device tool:  bash benchmarks/gpu_session.sh        (timeout_s ~560; the caps below sum to 515 s)
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
# The Philox stream on the device: known answers, words and inverse-CDF / Gumbel-max codes device vs CPU,
# ms per full-size draw eager and compiled (issue 12's cross-device check).
run philox     45 $PY scripts/philox_device_check.py --device cuda --rows 1024 --json "$OUT/philox.json"
# bench_ursa times diffnext in the same process where it imports (carry the ignored reference/ folder, and
# diffnext's own deps: it reports "not timed - why" otherwise); --draws: draw / CFG / scheduler shares;
# --gumbel at 512 only: the Philox stream's other sampler, for the comparison that picked inverse-CDF.
run ursa512   150 $PY -m benchmarks.bench_ursa --size full --device cuda --dtype float16 --compile --draws --gumbel --steps 8 --json "$OUT/ursa512.json"
run ursa1024  110 $PY -m benchmarks.bench_ursa --size full --res 1024 --device cuda --dtype float16 --compile --draws --steps 8 --json "$OUT/ursa1024.json"
run qwen_plus 120 $PY -m benchmarks.bench_qwen_edit --size full --variant plus --device cuda --dtype bf16 --compile --fp8 --json "$OUT/qwen_plus.json"
run qwen_edit  90 $PY -m benchmarks.bench_qwen_edit --size full --variant edit --device cuda --dtype bf16 --fp8 --json "$OUT/qwen_edit.json"
git rev-parse --short HEAD >"$OUT/commit.txt" 2>/dev/null
date -u +%F >"$OUT/date.txt"
