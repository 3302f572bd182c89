"""The GPU session's summary: one Markdown section that benchmarks/RESULTS.md takes as it is.

``benchmarks/gpu_session.sh`` stages every benchmark's JSON under ``<session>/bench/`` and its own notes
beside them (``date.txt``, ``commit.txt``, ``gpu.csv``, ``versions.txt``, ``steps.txt``); this script reads
them and writes the section: date, commit, command and device first, then one table per benchmark with
difforge's rows, the reference's rows from the same process and each ratio, and the issue's goals beside
the default.  A benchmark that did not finish (no JSON) is named with its step line, so a partial session
still gives an honest section.  Standard library only (it runs on the device with whatever is there).

    python scripts/device_kit_summary.py SESSION_DIR --command "bash benchmarks/gpu_session.sh" [--out summary.md]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

#: Issue 27's goals for the default path (ms/step), by benchmark file.
GOALS_MS = {"ursa512": 15.0, "ursa1024": 55.0, "qwen_plus": 500.0, "qwen_plus_compiled": 500.0}
#: The sampler + scheduler step's goal at 512² (ms).
SAMPLER_GOAL_MS = 1.0
#: The row each benchmark calls difforge's default.
URSA_DEFAULT = "optimised (exact)"
QWEN_DEFAULT = "difforge default"
#: Said beside a row labelled exact whose tokens differ from the baseline's on the device (issue 27: every
#: label proven on the device under test).
UNPROVEN = ("**tokens differ from the baseline's: what this row switches against the baseline is not proven "
            "exact on this device**")
#: Said above a table whose benchmark stopped before its end (its JSON is marked ``partial``).
PARTIAL = "Partial: the run stopped (its cap) after the rows below; the rest was not measured."
#: The Qwen bench's row of diffusers' own pipeline call (the peer every ratio is also given against).
PIPELINE_PREFIX = "diffusers pipeline"


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError:
        return ""


def _ms(value: float | None) -> str:
    return "–" if value is None else (f"{value:.1f}" if value >= 10 else f"{value:.2f}")


def _yes(value: bool | None) -> str:
    return "–" if value is None else ("yes" if value else "**no**")


def _gib(value: int | None) -> str:
    return "–" if not value else f"{value / 2**30:.1f}"


def ursa_section(name: str, data: dict[str, Any]) -> list[str]:
    """URSA: every variant, the reference's rows and each ratio, the draw shares, compile times."""
    rows = data["results"]
    base = rows[0]["ms_per_step"]
    goal = GOALS_MS.get(name)
    lines = [f"### URSA {data['size']} {data['res']}², {data['dtype']}, CFG {data['guidance']:g}, {data['steps']} steps "
             f"(`{name}`)" + (f" — goal by default ≤ {goal:g} ms/step" if goal else ""), "",
             "| variant | ms/step | vs baseline | tokens = baseline | tokens = eager twin | peak GiB | notes |",
             "| --- | ---: | ---: | --- | --- | ---: | --- |"]
    if data.get("partial"):
        lines[1:1] = ["", PARTIAL]
    for r in rows:
        x = r["extra"]
        notes = r.get("notes", "")
        if notes == "exact" and x.get("tokens_equal_baseline") is False:  # a label the device did not bear out
            notes += f" — {UNPROVEN}"
        lines.append(f"| {r['name']} | {_ms(r['ms_per_step'])} | {base / r['ms_per_step']:.2f}× | "
                     f"{_yes(x.get('tokens_equal_baseline'))} | {_yes(x.get('tokens_equal_eager'))} | "
                     f"{_gib(r.get('peak_memory_bytes'))} | {notes} |")
    for ref in data.get("reference") or []:
        if not ref.get("available"):
            lines += ["", f"Reference (diffnext): not timed — {ref.get('why', '?')}"]
            continue
        label = "diffnext, decoder layers compiled" if ref.get("compiled") else "diffnext, eager"
        lines.append(f"| **{label}** (same process) | {_ms(ref['ms_per_step'])} | {base / ref['ms_per_step']:.2f}× | "
                     f"{_yes(ref.get('tokens_equal_baseline'))} | – | – | warm-up {ref.get('warmup_s', 0):.1f} s |")
    refs = [r for r in data.get("reference") or [] if r.get("available")]
    if refs:
        lines += ["", "difforge ÷ reference (speed; above 1 = difforge faster):", ""]
        for ref in refs:
            label = "diffnext compiled" if ref.get("compiled") else "diffnext eager"
            ratios = ", ".join(f"{k} **{v:.2f}×**" for k, v in ref["ratios"].items())
            lines.append(f"- vs {label}: {ratios}")
    lines += [""]
    for r in rows:
        x = r["extra"]
        if "draws" in x:
            d = x["draws"]
            goal_note = f" (goal ≤ {SAMPLER_GOAL_MS:g} ms)" if r["name"] == URSA_DEFAULT and name == "ursa512" else ""
            lines.append(f"- {r['name']}: scheduler step {_ms(d['sampler_ms_per_step'])} ms{goal_note}, random draws "
                         f"{_ms(d['draw_ms_per_step'])} ms, CFG combine {_ms(d['cfg_ms_per_step'])} ms a step")
        if x.get("compile"):
            c = x["compile"]
            lines.append(f"- {r['name']}: warm-up incl. compile {x.get('warmup_s', 0):.1f} s "
                         f"({c.get('label')}, {c.get('detail')})")
    return lines + [""]


def qwen_section(name: str, data: dict[str, Any]) -> list[str]:
    """Qwen-Image-Edit: diffusers' reference row, difforge's bf16 and fp8 rows, compile times."""
    rows = data["results"]
    ref = rows[0]["ms_per_step"]
    pipeline = next((r["ms_per_step"] for r in rows if r["name"].startswith(PIPELINE_PREFIX)), None)
    goal = GOALS_MS.get(name)
    lines = [f"### Qwen-Image-Edit ({data['variant']}) {data['output_pixels']}², {data['dtype']}, true CFG, "
             f"{data['steps']} steps (`{name}`)" + (f" — goal ≤ {goal:g} ms/step lossless, ≤ 22 GiB" if goal else ""),
             "", f"| variant | ms/step | {rows[0]['name']} ÷ this | diffusers pipeline ÷ this | peak GiB | notes |",
             "| --- | ---: | ---: | ---: | ---: | --- |"]
    if data.get("partial"):
        lines[1:1] = ["", PARTIAL]
    for r in rows:
        vs_pipeline = "–" if pipeline is None else f"{pipeline / r['ms_per_step']:.2f}×"
        lines.append(f"| {r['name']} | {_ms(r['ms_per_step'])} | {ref / r['ms_per_step']:.2f}× | {vs_pipeline} | "
                     f"{_gib(r.get('peak_memory_bytes'))} | {r.get('notes', '')} |")
    sh = data.get("step_shares") or {}
    if sh:
        lines += ["", f"- {QWEN_DEFAULT}: true-CFG combine {_ms(sh.get('cfg_ms_per_step'))} ms, Euler step "
                      f"{_ms(sh.get('scheduler_ms_per_step'))} ms a step"]
    return lines + [""]


def summary(session: Path, command: str) -> str:
    """The whole section for ``session`` (the folder gpu_session.sh staged)."""
    gpu = _read(session / "gpu.csv").splitlines()
    device = gpu[1] if len(gpu) > 1 else (gpu[0] if gpu else "device unknown")
    lines = [f"## GPU session {_read(session / 'date.txt') or 'date unknown'} — {device}", "",
             f"Commit `{_read(session / 'commit.txt') or 'unknown'}`, command `{command}`; "
             f"{_read(session / 'versions.txt') or 'versions unknown'}.  Random weights at full size.", ""]
    steps = _read(session / "steps.txt")
    if steps:
        lines += ["Steps (exit code, seconds, cap):", "", "```", steps, "```", ""]
    bench = session / "bench"
    found = sorted(bench.glob("*.json")) if bench.is_dir() else []
    for path in found:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            lines += [f"### `{path.stem}`: unreadable ({exc})", ""]
            continue
        kind = data.get("benchmark") if isinstance(data, dict) else None
        if kind == "ursa":
            lines += ursa_section(path.stem, data)
        elif kind == "qwen_edit_denoise":
            lines += qwen_section(path.stem, data)
        else:
            lines += [f"### `{path.stem}`", "", "```json", json.dumps(data, indent=1)[:3000], "```", ""]
    missing = [p.stem for p in sorted(bench.glob("*.log"))] if bench.is_dir() else []
    missing = [m for m in missing if not (bench / f"{m}.json").exists()]
    if missing:
        lines += [f"No JSON (failed or stopped at its cap: see its step line; its log is in the tarball): "
                  f"{', '.join(missing)}", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("session", type=Path, help="the folder benchmarks/gpu_session.sh staged")
    parser.add_argument("--command", default="bash benchmarks/gpu_session.sh")
    parser.add_argument("--out", type=Path, default=None, help="write here (default: stdout)")
    args = parser.parse_args(argv)
    text = summary(args.session, args.command)
    if args.out is None:
        sys.stdout.write(text + "\n")
    else:
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
