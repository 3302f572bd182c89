"""Does the semantic rung pass clean ports and fail ports that lose meaning?  (issue 13's done-condition)

For each trained shapes model: ``difforge validate`` on bfloat16 (the CPU standing in for a device)
against the float32 reference, clean on several seeds, then with faults that change meaning planted
through the real CLI (``tests.validate.fault_cli``, the fault harness's wrapper).  Prints one line per
run and, with ``--markdown``, writes the table.

    python scripts/semantic_check.py --seeds 0,1,2,3,4 --faults embedding_shift,cat_swap --markdown OUT.md
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("shapes-ursa", "shapes-qwen-edit")


def run(model: str, fault: str, seed: int, work: Path, extra: list[str]) -> dict:
    out = work / f"{model}-{fault}-{seed}"
    report = work / f"{model}-{fault}-{seed}.fault.json"
    cmd = [sys.executable, "-m", "tests.validate.fault_cli", fault, "--", "validate", "--model", model,
           "--device", "cpu", "--dtype", "bfloat16", "--seed", str(seed), "--rounds", "1", "--warmup", "0",
           "--no-speed-table", "--quiet", "--out", str(out), *extra]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "DIFFORGE_FAULT_REPORT": str(report)})
    row = {"model": model, "fault": fault, "seed": seed, "exit": proc.returncode,
           "seconds": round(time.perf_counter() - t0, 1)}
    try:
        data = json.loads((out / "report.json").read_text())
        sem = data["rungs"]["semantic"]
        row.update(verdict=data["verdict"], semantic=sem["verdict"], **{k: sem["data"].get(k) for k in (
            "n", "device_correct", "reference_correct", "floor_correct", "device_lost", "floor_lost")})
        row["other_rungs"] = {k: v["verdict"] for k, v in data["rungs"].items() if k != "semantic"}
    except (OSError, KeyError, ValueError) as exc:
        row["error"] = f"{exc}: {proc.stderr.strip()[-300:]}"
    if report.is_file():
        row["fired"] = json.loads(report.read_text()).get("fired")
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--faults", default="embedding_shift,cat_swap")
    ap.add_argument("--fault-seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="validate --quick (4 semantic prompts, not 16)")
    ap.add_argument("--markdown", type=Path)
    args = ap.parse_args()
    extra = ["--quick"] if args.quick else []
    rows = []
    with tempfile.TemporaryDirectory(prefix="semantic-") as tmp:
        for model in args.models.split(","):
            plan = [("none", int(s)) for s in args.seeds.split(",") if s]
            plan += [(f, args.fault_seed) for f in args.faults.split(",") if f]
            for fault, seed in plan:
                row = run(model, fault, seed, Path(tmp), extra)
                rows.append(row)
                print(json.dumps(row), flush=True)
    if args.markdown:
        lines = ["| model | fault | seed | semantic | device / reference / floor correct (of N) | lost (device, floor) "
                 "| overall | other rungs | s |", "|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            if "error" in r:
                lines.append(f"| {r['model']} | {r['fault']} | {r['seed']} | error: {r['error']} | | | | | |")
                continue
            others = ", ".join(f"{k} {v}" for k, v in r["other_rungs"].items())
            lines.append(f"| {r['model']} | {r['fault']} | {r['seed']} | **{r['semantic']}** | {r['device_correct']} / "
                         f"{r['reference_correct']} / {r['floor_correct']} (of {r['n']}) | {r['device_lost']}, "
                         f"{r['floor_lost']} | {r['verdict']} | {others} | {r['seconds']} |")
        args.markdown.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
