"""Fault sweep: does ``difforge validate`` FAIL broken ports and PASS clean ones? (issue 10)

Runs, each as its own subprocess through the real CLI (``python -m tests.validate.fault_cli``):

* clean validations on several seeds per model (``--seeds``, default 0-4): every non-PASS is a
  false alarm;
* every planted fault of :mod:`tests.validate.faults` on every model (``--faults``, ``--models``):
  a fault that fired and ends in FAIL is caught; WARN or PASS is missed; a fault that never fired
  is "not reached" (the model never calls that function in bf16/fp16) and counts for neither, nor does
  one that fired but is "inert": not FAIL, the device's pictures byte-identical to the clean run of the
  same model and seed and every accuracy measurement both reports hold equal (a swapped ``a - b`` whose
  result is squared, an ``exp`` whose result is never read: no check can see what changed nothing).

Localisation (issue 10: the first divergent layer named for >= 70 % of the faults that sit in the
transformer): before the runs, :func:`tests.validate.localisation.expected_blocks` replays one
teacher-forced step of each model in bf16 inside each fault, with hooks on the transformer's blocks,
and records where the fault first changes a result (the *expected* first divergent block; a fault that
first does so outside the transformer or never during that forward does not sit in it and is not
scored).  Each fault run's report.json ``rungs.step.data.localisation.first_divergent`` is then
compared with it; a run without a step localisation (caught by other rungs only, or not at all)
counts as not named.  ``--no-localisation`` skips the replays; ``--from-json ... --remeasure`` replays
them again for a previous sweep's kept reports.

Everything is read from outside validate: the exit code, the ``{"fault", "fired"}`` file fault_cli
writes, and the report.json validate writes (overall verdict and reasons, per-rung verdicts and
summaries, and every judged measurement).  The measurements are read generically: per rung and
measurement name the worst value is kept, and where the threshold text starts with a comparison
(``<= 2 PASS, <= 3 WARN``, ``>= 0.99``) its last bound is taken as the FAIL edge and the value is
expressed as ``closeness`` to it (1.0 = at the edge, above 1 = beyond it; ``v / edge`` for upper
bounds, ``ln v / ln edge`` for ratios named ``a / b`` (1x is perfect), ``(1 - v) / (1 - edge)`` for
lower bounds <= 1 such as cosines).  The largest closeness of a
run names the quantity that came nearest to failing it: for a missed fault, the rung to tighten.

    .venv/bin/python scripts/fault_sweep.py --jobs 2 --json sweep.json --markdown sweep.md
    .venv/bin/python scripts/fault_sweep.py --models tiny-ursa --faults embedding_shift,conv_no_bias --seeds 0
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.validate import faults as fault_catalogue  # noqa: E402

MODELS = ("tiny-ursa", "tiny-qwen-edit")
#: Per-model validate arguments that keep one run small (URSA 64x64 = 16 latent tokens).
MODEL_ARGS: dict[str, list[str]] = {
    "tiny-ursa": ["--height", "64", "--width", "64"],
    "tiny-qwen-edit": ["--height", "64", "--width", "64"],
}
#: Arguments of every run; --rounds 1 --warmup 0 only shortens the benchmark (the determinism rung
#: still compares two runs), the accuracy rungs are untouched.
COMMON_ARGS = ["--device", "cpu", "--dtype", "bfloat16", "--quick", "--rounds", "1", "--warmup", "0", "--quiet"]
SHORT = {"PASS": "P", "WARN": "W", "FAIL": "F", "SKIP": "S"}
#: Rungs whose measurements say what a fault changed (the others hold timings and memory).
ACCURACY_RUNGS = ("operator", "component", "step", "trajectory", "semantic")
_BOUND = re.compile(r"(<=|>=|<|>)\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)")


# ---- one run -------------------------------------------------------------------------------------
@dataclass
class Run:
    """One validation subprocess and what came out of it."""

    model: str
    fault: str
    seed: int
    out: str
    cmd: list[str] = field(default_factory=list)
    exit_code: int | None = None
    fired: int | None = None
    seconds: float = 0.0
    verdict: str | None = None
    reasons: list[str] = field(default_factory=list)
    rungs: dict[str, dict[str, Any]] = field(default_factory=dict)
    closest: dict[str, Any] | None = None
    error: str | None = None
    #: The clean run of the same model and seed, if the sweep has one: its FAILing rungs.
    baseline_fail: list[str] | None = None
    #: report.json's step localisation: {step, seed, first_divergent, after_blocks}; None when the step
    #: rung localised nothing (no WARN/FAIL step, or no step rung).
    localisation: dict[str, Any] | None = None
    #: Where the fault first fires in a teacher-forced bf16 transformer forward
    #: (:meth:`tests.validate.localisation.FirstFire.to_dict`); None when not measured.
    expected: dict[str, Any] | None = None
    #: sha256 of each picture the device made (``images/device_*.png``), and every numeric measurement of
    #: the accuracy rungs by ``rung/row/name``: what :meth:`same_results` compares with the clean baseline.
    device_images: dict[str, str] = field(default_factory=dict)
    values: dict[str, float] = field(default_factory=dict)
    #: Fired, not FAIL, and nothing it could change did (see the module docstring); None: not judged.
    inert: bool | None = None

    @property
    def clean(self) -> bool:
        return self.fault == "none"

    @property
    def fail_rungs(self) -> list[str]:
        return [k for k, r in self.rungs.items() if r.get("verdict") == "FAIL"]

    @property
    def new_fail_rungs(self) -> list[str]:
        """Rungs this run FAILs that its clean baseline (same model and seed) does not."""
        return [k for k in self.fail_rungs if k not in (self.baseline_fail or [])]

    def same_results(self, base: Run) -> bool:
        """This run's device pictures and accuracy measurements equal ``base``'s (nothing to compare: False)."""
        shared = set(self.values) & set(base.values)
        return (bool(self.device_images) and self.device_images == base.device_images and bool(shared)
                and all(self.values[k] == base.values[k] for k in shared))

    @property
    def outcome(self) -> str:
        """clean: PASS / WARN / FAIL; faulted: caught / missed (WARN or PASS) / not reached; or error.

        A FAIL whose clean baseline already FAILs and that FAILs no rung the baseline passes is
        "unattributed": validate would have failed the clean port too, so it says nothing of the fault.
        """
        if self.verdict is None:
            return "error"
        if self.clean:
            return self.verdict
        if not self.fired:
            return "not reached"
        if self.verdict != "FAIL":
            return "inert" if self.inert else "missed"
        if self.baseline_fail and not self.new_fail_rungs:
            return "unattributed"
        return "caught"

    @property
    def scored(self) -> bool:
        """A fault run whose localisation is scored: the fault sits in the transformer."""
        return not self.clean and bool(self.expected and self.expected.get("sits_in_transformer"))

    @property
    def named(self) -> str:
        """What validate named: a block, "after the last block", or "-" (no step localisation)."""
        if not self.localisation:
            return "-"
        return self.localisation.get("first_divergent") or "after the last block"

    @property
    def named_correctly(self) -> bool:
        """validate's first divergent block is the expected one (None = after the last block)."""
        if not self.scored or not self.localisation:
            return False
        return self.localisation.get("first_divergent") == (self.expected or {}).get("expected")


def numeric(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def fail_edge(threshold: str) -> tuple[str, float] | None:
    """``("<", edge)`` / ``(">", edge)`` when the threshold text starts with a comparison; the last bound
    of that direction is the FAIL edge (``<= 2 PASS, <= 3 WARN`` -> 3).  Hints such as ``< 0.001 (else
    dual-N)`` only route to another test, so they give none."""
    text = threshold.strip()
    if "(else " in text:
        return None
    found = _BOUND.findall(text)
    if not found or not text.startswith(found[0][0]):
        return None
    kind = found[0][0][0]
    bounds = [float(n) for op, n in found if op[0] == kind]
    return kind, bounds[-1]


def closeness(value: float, edge: tuple[str, float], ratio: bool = False) -> float | None:
    """How near ``value`` is to the FAIL edge: 1 at it, > 1 beyond it, 0 at perfect (see module doc).

    A ``ratio`` (a measurement named ``a / b``, e.g. an error over its noise floor) is perfect at 1, not
    0, so it is measured on a log scale: ``ln v / ln edge`` (0 at 1x, negative when better than the floor).
    """
    kind, bound = edge
    if math.isnan(value):
        return math.inf
    if kind == "<" and ratio and bound > 1:
        return math.log(value) / math.log(bound) if value > 0 else -math.inf
    if kind == "<":
        return value / bound if bound > 0 else None
    if bound < 1:
        return (1.0 - value) / (1.0 - bound)
    return None


_SEED_PREFIX = re.compile(r"^seed \d+ ")


def rung_quantities(rung: dict[str, Any]) -> list[dict[str, Any]]:
    """Every measurement with a threshold or a verdict, one entry per name: its worst value over the
    rung's rows (largest closeness, else worst verdict), with the row it came from."""
    rank = {"PASS": 0, "WARN": 1, "FAIL": 2}
    best: dict[str, dict[str, Any]] = {}
    for row in rung.get("rows") or []:
        for m in row.get("measurements") or []:
            threshold, verdict = str(m.get("threshold") or ""), m.get("verdict")
            if not threshold and verdict is None:
                continue
            value = numeric(m.get("value"))
            edge = fail_edge(threshold) if value is not None else None
            ratio = " / " in str(m.get("name"))
            close = closeness(value, edge, ratio) if edge is not None and value is not None else None
            entry = {"name": m.get("name"), "value": m.get("value"), "threshold": threshold, "verdict": verdict,
                     "row": row.get("subject"), "closeness": close}
            key = str(m.get("name"))
            old = best.get(key)
            score = (close if close is not None else -1.0, rank.get(str(verdict), -1))
            if old is None or score > (old["closeness"] if old["closeness"] is not None else -1.0,
                                       rank.get(str(old["verdict"]), -1)):
                best[key] = entry
    return list(best.values())


def read_report(run: Run) -> None:
    """Fill verdict, reasons, per-rung verdicts and quantities from ``run.out``/report.json."""
    path = Path(run.out) / "report.json"
    if not path.is_file():
        run.error = run.error or f"no report.json (exit {run.exit_code})"
        return
    data = json.loads(path.read_text())
    run.verdict = data.get("verdict")
    run.reasons = list(data.get("verdict_reasons") or [])
    closest: dict[str, Any] | None = None
    for key, rung in (data.get("rungs") or {}).items():
        quantities = rung_quantities(rung)
        run.rungs[key] = {"verdict": rung.get("verdict"), "summary": rung.get("summary", ""),
                          "quantities": quantities}
        if key == "benchmark":  # timings, not accuracy: never "the quantity that came closest"
            continue
        for q in quantities:
            c = q["closeness"]
            if c is not None and math.isfinite(c) and (closest is None or c > closest["closeness"]):
                closest = {"rung": key, **q}
    run.closest = closest
    run.values = {f"{key}/{row.get('subject')}/{m.get('name')}": float(m["value"])
                  for key, rung in (data.get("rungs") or {}).items() if key in ACCURACY_RUNGS
                  for row in rung.get("rows") or [] for m in row.get("measurements") or []
                  if numeric(m.get("value")) is not None and not math.isnan(float(m["value"]))}
    images = Path(run.out) / "images"
    run.device_images = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
                         for p in sorted(images.glob("device_*.png"))} if images.is_dir() else {}
    step = (data.get("rungs") or {}).get("step") or {}
    loc = (step.get("data") or {}).get("localisation")
    run.localisation = ({k: loc.get(k) for k in ("step", "seed", "first_divergent", "after_blocks")}
                        if isinstance(loc, dict) else None)


def command(model: str, fault: str, seed: int, out: str, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "tests.validate.fault_cli", fault, "--", "validate", "--model", model,
            *COMMON_ARGS, *MODEL_ARGS.get(model, []), "--seed", str(seed), *extra, "--out", out]


def make_bundles(runs: list[Run], work: Path, extra: list[str], threads: int, log_dir: Path,
                 timeout: float) -> float:
    """``--golden``: one clean bundle per (model, seed), each made by ``difforge golden`` in its own process;
    every run then validates against its bundle (``--golden DIR`` before ``--out``): the two-process flow."""
    t0 = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(threads)}
    env.setdefault("DIFFORGE_HOME", str(ROOT / ".difforge-home"))
    bundles: dict[tuple[str, int], str] = {}
    for run in runs:
        key = (run.model, run.seed)
        if key not in bundles:
            out = work / f"golden__{run.model}__s{run.seed}"
            shutil.rmtree(out, ignore_errors=True)
            cmd = [sys.executable, "-m", "difforge", "golden", "--model", run.model, "--dtype", "bfloat16", "--quick",
                   "--quiet", *MODEL_ARGS.get(run.model, []), "--seed", str(run.seed), *extra, "--out", str(out)]
            with (log_dir / f"{out.name}.log").open("w") as fh:
                proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout,
                                      check=False)
            if proc.returncode != 0:
                raise SystemExit(f"difforge golden failed for {key} (exit {proc.returncode}); see {fh.name}")
            bundles[key] = str(out)
        run.cmd = [*run.cmd[:-2], "--golden", bundles[key], *run.cmd[-2:]]
    return time.perf_counter() - t0


def execute(run: Run, timeout: float, log_dir: Path, threads: int | None = None) -> Run:
    """Run one validation subprocess (from the repo root) and read what it left; ``threads`` caps its
    torch/OpenMP threads (parallel jobs on a small machine would otherwise oversubscribe it)."""
    fired_path = Path(run.out).with_suffix(".fault.json")
    env = {**os.environ, "DIFFORGE_FAULT_REPORT": str(fired_path), "PYTHONPATH": str(ROOT)}
    env.setdefault("DIFFORGE_HOME", str(ROOT / ".difforge-home"))  # the tiny models `make test` builds
    if threads:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    log = log_dir / f"{Path(run.out).name}.log"
    t0 = time.perf_counter()
    try:
        with log.open("w") as fh:
            proc = subprocess.run(run.cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                  timeout=timeout, check=False)
        run.exit_code = proc.returncode
    except subprocess.TimeoutExpired:
        run.error = f"timed out after {timeout:g} s"
    run.seconds = time.perf_counter() - t0
    if fired_path.is_file():
        run.fired = int(json.loads(fired_path.read_text()).get("fired") or 0)
    read_report(run)
    if run.verdict is None and log.is_file():
        tail = log.read_text(errors="replace").strip().splitlines()[-3:]
        run.error = f"{run.error}: {' | '.join(tail)}"[:400]
    return run


# ---- the table -------------------------------------------------------------------------------------
def fmt(value: Any) -> str:
    v = numeric(value)
    if v is None:
        return str(value)
    if math.isnan(v) or math.isinf(v):
        return str(v)
    return f"{v:.4g}"


def closest_text(run: Run) -> str:
    c = run.closest
    if not c:
        return ""
    return f"{c['rung']}: {c['name']} = {fmt(c['value'])} ({c['threshold']}; {c['closeness']:.2f} of FAIL edge)"


def rung_order(runs: list[Run]) -> list[str]:
    order: list[str] = []
    for r in runs:
        for key in r.rungs:
            if key not in order:
                order.append(key)
    return order


def table(runs: list[Run]) -> list[str]:
    """Markdown table: one line per run."""
    order = rung_order(runs)
    head = ["model", "fault", "seed", "fired", "exit", "verdict", "outcome", *order, "new FAIL vs clean", "s",
            "closest to FAIL"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in runs:
        cells = [r.model, r.fault, str(r.seed), "-" if r.clean else str(r.fired), str(r.exit_code),
                 r.verdict or "-", r.outcome,
                 *[SHORT.get(str(r.rungs.get(k, {}).get("verdict")), "-") for k in order],
                 "" if r.clean or r.baseline_fail is None else (", ".join(r.new_fail_rungs) or "none"),
                 f"{r.seconds:.0f}", closest_text(r) if r.verdict else (r.error or "")]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return lines


def localisation_table(runs: list[Run]) -> list[str]:
    """Markdown table of every fault run that fired: where the fault first fires, what validate named."""
    head = ["model", "fault", "first fires", "expected first divergent", "named by validate", "at step", "correct"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in runs:
        if r.clean or r.expected is None or not (r.fired or r.expected.get("fired")):
            continue
        e = r.expected
        where = str(e.get("where"))
        if e.get("block"):
            where = f"{where} {e['block']}"
        loc = r.localisation or {}
        cells = [r.model, r.fault, where, (e.get("expected") or "after the last block") if r.scored else
                 "(not in the transformer)", r.named,
                 f"{loc.get('step')} (seed {loc.get('seed')})" if loc else "-",
                 ("yes" if r.named_correctly else "no") if r.scored else "not scored"]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return lines


def localisation_summary(runs: list[Run]) -> dict[str, Any]:
    """Named correctly / scored, in all and per model."""
    scored = [r for r in runs if r.scored]
    per_model: dict[str, list[int]] = {}
    for r in scored:
        n = per_model.setdefault(r.model, [0, 0])
        n[0] += r.named_correctly
        n[1] += 1
    return {"named_correctly": sum(r.named_correctly for r in scored), "scored": len(scored),
            "per_model": per_model,
            "wrong": [f"{r.model}/{r.fault} (expected {r.expected.get('expected') if r.expected else None}, "
                      f"named {r.named})" for r in scored if not r.named_correctly]}


def localisation_lines(loc: dict[str, Any]) -> list[str]:
    if not loc["scored"]:
        return []
    pct = 100.0 * loc["named_correctly"] / loc["scored"]
    per = "; ".join(f"{m} {a} / {b}" for m, (a, b) in loc["per_model"].items())
    lines = [f"localisation: {loc['named_correctly']} / {loc['scored']} faults that sit in the transformer "
             f"named correctly ({pct:.1f} %; {per})"]
    if loc["wrong"]:
        lines.append("localisation wrong or missing: " + ", ".join(loc["wrong"]))
    return lines


def measure_expected(runs: list[Run], threads: int) -> float:
    """Fill every fault run's ``expected`` (one replay per model, in this process); returns seconds."""
    import torch
    from tests.validate.localisation import expected_blocks

    t0 = time.perf_counter()
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for model in dict.fromkeys(r.model for r in runs if not r.clean):
            names = [r.fault for r in runs if r.model == model and not r.clean]
            seed = next(r.seed for r in runs if r.model == model and not r.clean)
            args = MODEL_ARGS.get(model, [])
            size = {flag: int(args[k + 1]) for k, flag in enumerate(args[:-1]) if flag in ("--height", "--width")}
            found = expected_blocks(model, names, seed=seed, **{k.lstrip("-"): v for k, v in size.items()})
            for r in runs:
                if r.model == model and r.fault in found:
                    r.expected = found[r.fault].to_dict()
    finally:
        torch.set_num_threads(old)
    return time.perf_counter() - t0


def link_baselines(runs: list[Run]) -> None:
    """Give every fault run the FAILing rungs of the clean run with its model and seed (if swept)."""
    clean = {(r.model, r.seed): r for r in runs if r.clean and r.verdict is not None}
    for r in runs:
        base = clean.get((r.model, r.seed))
        if not r.clean and base is not None:
            r.baseline_fail = base.fail_rungs
            if r.fired and r.verdict not in (None, "FAIL"):
                r.inert = r.same_results(base)


def summary(runs: list[Run]) -> dict[str, Any]:
    faulted = [r for r in runs if not r.clean]
    fired = [r for r in faulted if r.fired and r.outcome != "inert"]
    clean = [r for r in runs if r.clean]
    return {
        "fault_runs": len(faulted),
        "fired": len(fired),
        "caught": sum(r.outcome == "caught" for r in fired),
        "unattributed": [f"{r.model}/{r.fault}" for r in fired if r.outcome == "unattributed"],
        "missed_warn": sum(r.verdict == "WARN" for r in fired),
        "missed_pass": sum(r.verdict == "PASS" for r in fired),
        "not_reached": [f"{r.model}/{r.fault}" for r in faulted if r.verdict is not None and not r.fired],
        "inert": [f"{r.model}/{r.fault}" for r in faulted if r.outcome == "inert"],
        "missed": [f"{r.model}/{r.fault} ({r.verdict})" for r in fired if r.outcome == "missed"],
        "clean_runs": len(clean),
        "false_alarm_fail": sum(r.verdict == "FAIL" for r in clean),
        "false_alarm_warn": sum(r.verdict == "WARN" for r in clean),
        "errors": [f"{r.model}/{r.fault}/seed {r.seed}: {r.error}" for r in runs if r.verdict is None],
        "seconds": sum(r.seconds for r in runs),
        "per_family": per_family(fired),
    }


def per_family(fired: list[Run]) -> dict[str, list[int]]:
    """``{family: [caught, fired]}`` over the fired fault runs, by the catalogue's family of each fault (the
    blind-spot classes of issue 25 are families of their own: ``sampler``, ``post-network``)."""
    out: dict[str, list[int]] = {}
    for r in fired:
        fault = fault_catalogue.FAULTS.get(r.fault)
        n = out.setdefault(fault.family if fault is not None else "?", [0, 0])
        n[0] += r.outcome == "caught"
        n[1] += 1
    return out


def summary_lines(s: dict[str, Any]) -> list[str]:
    lines = [
        f"caught: {s['caught']} / {s['fired']} fired fault runs FAIL (missed: {s['missed_warn']} WARN, "
        f"{s['missed_pass']} PASS; unattributed: {len(s['unattributed'])}; {len(s['not_reached'])} of "
        f"{s['fault_runs']} fault runs not reached, {len(s.get('inert') or [])} inert)",
        f"false alarms: {s['false_alarm_fail'] + s['false_alarm_warn']} / {s['clean_runs']} clean runs "
        f"({s['false_alarm_fail']} FAIL, {s['false_alarm_warn']} WARN)",
    ]
    if s.get("per_family"):
        lines.append("by family (caught / fired): " + ", ".join(f"{k} {a} / {b}" for k, (a, b) in
                                                                  sorted(s["per_family"].items())))
    if s["missed"]:
        lines.append("missed: " + ", ".join(s["missed"]))
    if s["unattributed"]:
        lines.append("unattributed (FAIL, but the clean baseline of that model and seed FAILs the same rungs): "
                     + ", ".join(s["unattributed"]))
    if s["not_reached"]:
        lines.append("not reached: " + ", ".join(s["not_reached"]))
    if s.get("inert"):
        lines.append("inert (fired, changed no picture and no measurement of the clean run; counted neither way): "
                     + ", ".join(s["inert"]))
    if s["errors"]:
        lines.append("errors (no report): " + "; ".join(s["errors"]))
    lines.append(f"run time: {s['seconds']:.0f} s of subprocess time in all")
    return lines


# ---- main ------------------------------------------------------------------------------------------
def parse_list(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def parse_seeds(text: str) -> list[int]:
    """``0-4`` / ``0,3,7`` / ``0-2,9``; empty means no clean runs."""
    seeds: list[int] = []
    for part in parse_list(text):
        lo, sep, hi = part.partition("-")
        seeds.extend(range(int(lo), int(hi) + 1) if sep else [int(lo)])
    return seeds


def plan(models: list[str], fault_names: list[str], seeds: list[int], fault_seed: int, work: Path,
         extra: list[str]) -> list[Run]:
    runs: list[Run] = []
    for model in models:
        for seed in seeds:
            out = str(work / f"{model}__none__s{seed}")
            runs.append(Run(model, "none", seed, out, command(model, "none", seed, out, extra)))
        for name in fault_names:
            out = str(work / f"{model}__{name}__s{fault_seed}")
            runs.append(Run(model, name, fault_seed, out, command(model, name, fault_seed, out, extra)))
    return runs


def finish(done: list[Run], wall: float, jobs: int, threads: int, json_path: Path | None,
           md_path: Path | None) -> None:
    """Link baselines, print the table and summary, write the files asked for."""
    link_baselines(done)
    s = summary(done)
    s["wall_seconds"] = wall
    s["jobs"] = jobs
    s["threads"] = threads
    loc = localisation_summary(done)
    s["localisation"] = loc
    lines = [*table(done), "", *summary_lines(s), *localisation_lines(loc), f"wall time: {wall:.0f} s with --jobs {jobs}"]
    if loc["scored"] or any(r.expected for r in done):
        lines += ["", "Localisation (expected = the block where the fault first changes a result (its first "
                  "effective fire) in a teacher-forced bf16 transformer forward; named = report.json step localisation first_divergent):", "",
                  *localisation_table(done)]
    print("\n".join(lines))
    if json_path:
        json_path.write_text(json.dumps({"summary": s, "runs": [asdict(r) | {"outcome": r.outcome,
                                                                           "new_fail_rungs": r.new_fail_rungs}
                                                                for r in done],
                                         "faults": {k: f.what for k, f in fault_catalogue.FAULTS.items()}},
                                        indent=2, default=str))
    if md_path:
        md_path.write_text("\n".join(lines) + "\n")


def reanalyse(source: Path, json_path: Path | None, md_path: Path | None, remeasure: bool = False,
              threads: int = 1) -> int:
    """Rebuild the runs of a previous sweep's JSON (exit codes, fired, times) and re-read their reports;
    ``remeasure`` replays the faults for their expected blocks again (else the stored ones are used)."""
    old = json.loads(source.read_text())
    done: list[Run] = []
    for r in old["runs"]:
        run = Run(r["model"], r["fault"], r["seed"], r["out"], list(r.get("cmd") or []), r.get("exit_code"),
                  r.get("fired"), float(r.get("seconds") or 0.0))
        run.expected = r.get("expected")
        read_report(run)
        done.append(run)
    if remeasure:
        spent = measure_expected(done, threads)
        print(f"expected first divergent blocks measured in {spent:.0f} s", file=sys.stderr)
    s = old.get("summary", {})
    finish(done, float(s.get("wall_seconds") or 0.0), int(s.get("jobs") or 1), int(s.get("threads") or 0),
           json_path, md_path)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated models")
    ap.add_argument("--faults", default="all", help="comma-separated fault names, or 'all'")
    ap.add_argument("--seeds", default="0-4", help="seeds of the clean runs (e.g. 0-4, 0,2); '' for none")
    ap.add_argument("--fault-seed", type=int, default=0, help="seed of every fault run")
    ap.add_argument("--jobs", type=int, default=1, help="runs in parallel (each uses the CPU fully)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per run")
    ap.add_argument("--threads", type=int, default=None,
                    help="CPU threads per run (default: the CPU count divided by --jobs)")
    ap.add_argument("--extra", default="", help="more validate arguments for every run (one string)")
    ap.add_argument("--workdir", type=Path, default=None, help="where the report folders go (default: temp)")
    ap.add_argument("--keep", action="store_true", help="keep the report folders")
    ap.add_argument("--json", type=Path, default=None, help="write every run's data here")
    ap.add_argument("--markdown", type=Path, default=None, help="write the table and summary here")
    ap.add_argument("--no-localisation", action="store_true",
                    help="do not replay the faults for their expected first divergent block")
    ap.add_argument("--remeasure", action="store_true",
                    help="with --from-json: measure the expected first divergent blocks again")
    ap.add_argument("--golden", action="store_true",
                    help="make one clean golden bundle per model and seed first (difforge golden, its own process) and "
                         "validate every run against it (the two-process golden-then-validate flow)")
    ap.add_argument("--from-json", type=Path, default=None,
                    help="run nothing: re-read the reports of a previous --json (kept with --keep/--workdir)")
    args = ap.parse_args(argv)
    if args.from_json is not None:
        return reanalyse(args.from_json, args.json, args.markdown, args.remeasure, args.threads or os.cpu_count() or 1)

    names = list(fault_catalogue.FAULTS) if args.faults == "all" else parse_list(args.faults)
    unknown = [n for n in names if n not in fault_catalogue.FAULTS]
    if unknown:
        ap.error(f"unknown fault(s) {', '.join(unknown)}; known: {', '.join(fault_catalogue.FAULTS)}")
    work = args.workdir or Path(tempfile.mkdtemp(prefix="difforge-faults-"))
    work.mkdir(parents=True, exist_ok=True)
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    runs = plan(parse_list(args.models), names, parse_seeds(args.seeds), args.fault_seed, work,
                args.extra.split())
    threads = args.threads or max(1, (os.cpu_count() or 1) // max(1, args.jobs))
    t0 = time.perf_counter()
    if not args.no_localisation and any(not r.clean for r in runs):
        spent = measure_expected(runs, threads * max(1, args.jobs))
        print(f"expected first divergent blocks measured in {spent:.0f} s", file=sys.stderr)
    if args.golden:
        spent = make_bundles(runs, work, args.extra.split(), threads * max(1, args.jobs), logs, args.timeout)
        print(f"golden bundles made in {spent:.0f} s", file=sys.stderr)
    print(f"{len(runs)} runs, {args.jobs} at a time ({threads} threads each), in {work}", file=sys.stderr)

    def one(run: Run) -> Run:
        shutil.rmtree(run.out, ignore_errors=True)
        execute(run, args.timeout, logs, threads)
        print(f"  {run.model:15s} {run.fault:18s} seed {run.seed}: fired {run.fired}, exit {run.exit_code}, "
              f"{run.verdict} -> {run.outcome} ({run.seconds:.0f} s)", file=sys.stderr, flush=True)
        return run

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        done = list(pool.map(one, runs))
    finish(done, time.perf_counter() - t0, args.jobs, threads, args.json, args.markdown)
    if not args.keep and args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
