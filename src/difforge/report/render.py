"""Render a ValidationResult into report.md, a self-contained report.html and report.json.

The two human-readable reports share one context built here (tables as lists of cells), so the
Markdown and HTML templates stay dumb.  Every file goes through :mod:`difforge.runtime.atomic`.

Prompts, paths, device names and error messages come from the user or the machine, so both reports
escape every value by default: the HTML one with jinja2's HTML autoescaping, the Markdown one with
:func:`md_escape` applied by the environment's ``finalize`` to every ``{{ value }}``.  Only the
report's own prose (the i18n texts, file links it makes) is marked safe (:class:`markupsafe.Markup`).
"""

from __future__ import annotations

import base64
import datetime as _dt
import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup

from ..runtime.atomic import atomic_write_bytes, atomic_write_text
from ..runtime.record import sha256_file
from ..validate.options import DUT_ONLY
from ..validate.thresholds import SOURCES
from ..version import __version__
from .fonts import font_face_css
from .i18n import RUNG_TITLES, texts
from .plots import block_plot, step_error_plot, step_time_plot
from .zh_text import translator

if TYPE_CHECKING:
    from ..validate.options import ValidationResult
    from ..validate.verdict import RungResult

MARK = {"PASS": "✓", "WARN": "!", "FAIL": "✗"}

#: What can start Markdown/HTML markup mid-line: backslash escapes, code, emphasis, links and images
#: (``[``/``]``), raw HTML and autolinks (``<``), entities (``&``), table cells (``|``), strikethrough,
#: math; ``_`` only where it can open or close emphasis (not inside a word like ``rel_l2``).
_MD_SPECIAL = re.compile(r"[\\`*\[\]<&|~$]|(?<![^\W_])_|_(?![^\W_])")


def md_escape(value: Any) -> str:
    """``value`` as inert Markdown text: specials backslash-escaped, line breaks folded to spaces.

    Values always sit inside a line (a table cell, a list item, a heading), so a newline is the only
    way to reach block syntax (a heading, a list, a new table row); folding it closes that door.
    """
    text = " ".join(str(value).split())
    return _MD_SPECIAL.sub(lambda m: "\\" + m.group(0), text)


def _md_finalize(value: Any) -> Any:
    """Every ``{{ value }}`` of report.md: escaped unless marked as the report's own markup."""
    return value if isinstance(value, Markup) else Markup(md_escape(value))


def _code_fence(lines: list[str]) -> str:
    """A backtick fence longer than any backtick run in ``lines``, so no line can close the block."""
    longest = max((len(run) for line in lines for run in re.findall(r"`+", line)), default=0)
    return "`" * max(3, longest + 1)


def fmt(value: Any) -> str:
    """A number rounded to what it can show: 3 significant digits; a value just below 1 (a cosine, an
    agreement) keeps digits until its distance from 1 shows (0.99987, not 1); tiny and huge values in
    e-notation; whole numbers as they are."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        if value == 0:
            return "0"
        if value.is_integer() and abs(value) < 1e6:
            return str(int(value))
        if 0.99 <= abs(value) < 1:
            gap = 1 - abs(value)
            digits = min(10, max(3, 1 - math.floor(math.log10(gap)))) if gap > 0 else 10
            return f"{value:.{digits}f}".rstrip("0")
        if abs(value) >= 1e6 or abs(value) < 1e-3:
            return f"{value:.2e}"
        if abs(value) >= 1000:
            return f"{value:.0f}"
        return f"{value:.3g}"
    return str(value)


#: Measurement names as a reviewer reads them (English); zh goes through :mod:`.zh_text`.
EN_COLUMNS = {
    "median_s": "median (s)", "min_s": "min (s)", "max_s": "max (s)", "steps_per_s": "steps/s",
    "peak_device_mib": "device peak (MiB)", "peak_host_rss_mib": "host RSS peak (MiB)",
    "forwards_per_step": "forwards/step", "tokens_per_forward": "tokens/forward", "flops_per_step": "FLOPs/step",
    "achieved_tflops": "achieved TFLOP/s", "peak_tflops": "peak TFLOP/s", "mfu": "MFU",
    "rmse_levels": "RMSE (levels)", "floor_rmse_levels": "floor RMSE (levels)", "psnr_db": "PSNR (dB)",
    "floor_psnr_db": "floor PSNR (dB)", "ssim": "SSIM", "floor_ssim": "floor SSIM",
    "nonfinite_only_device": "NaN/Inf on device only",
}


def column_name(name: str, lang: str, tr: Callable[[str], str]) -> str:
    """The table header of measurement ``name``: the zh catalogue's, else a readable English one."""
    if lang != "en":
        return tr(name)
    if name in EN_COLUMNS:
        return EN_COLUMNS[name]
    return name.replace("rel_l2", "rel-L2").replace("max_abs", "max |diff|").replace("_", " ")


#: A rung table with more measurement columns than this is laid out one subject a row with its
#: measurements as a wrapped list (and the thresholds as a legend), so it never runs off the page.
WIDE_COLUMNS = 7


def rung_table(rung: RungResult, tr: Callable[[str], str] = str, lang: str = "en") -> dict[str, Any]:
    """Columns = measurement names (first-seen order); a threshold row under the header; cells carry
    a verdict mark; the last column is the row verdict.  ``tr`` puts the run-time texts (names,
    subjects, notes, thresholds) into the report's language."""
    t = texts(lang)

    def show(value: Any) -> str:  # words in the report's language; numbers rounded
        if isinstance(value, bool):
            return t["yes"] if value else t["no"]
        return tr(value) if isinstance(value, str) else fmt(value)

    names: list[str] = []
    thresholds: dict[str, str] = {}
    sources: dict[str, str] = {}
    for row in rung.rows:
        for m in row.measurements:
            if m.name not in names:
                names.append(m.name)
            if m.threshold and m.name not in thresholds:
                thresholds[m.name] = m.threshold
            if m.source and m.name not in sources:
                sources[m.name] = m.source
    body = []
    for row in rung.rows:
        by_name = {m.name: m for m in row.measurements}
        cells = []
        for n in names:
            m = by_name.get(n)
            if m is None:
                cells.append("")
            else:
                mark = f" {MARK[str(m.verdict)]}" if m.verdict is not None and str(m.verdict) in MARK else ""
                cells.append(show(m.value) + mark)
        items = [(column_name(n, lang, tr), c) for n, c in zip(names, cells, strict=True) if c != ""]
        body.append({"subject": tr(row.subject), "cells": cells, "pairs": items, "verdict": str(row.verdict),
                     "note": tr(row.note) if row.note else row.note})
    threshold_cells = []
    for n in names:
        t = thresholds.get(n, "")
        t = f"{tr(t)} [{tr(SOURCES[sources[n]][0])}]" if t and n in sources else tr(t)
        threshold_cells.append(t)
    legend = [(column_name(n, lang, tr), x) for n, x in zip(names, threshold_cells, strict=True) if x]
    return {"summary": tr(rung.summary), "headers": [column_name(n, lang, tr) for n in names],
            "wide": len(names) > WIDE_COLUMNS, "legend": legend, "thresholds": threshold_cells, "rows": body,
            "has_thresholds": any(threshold_cells), "sources": sorted(set(sources.values()))}


def _jsonable(obj: Any) -> Any:
    """Strict JSON: non-finite floats become strings, enums/paths/dtypes become text."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else str(obj)
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple | set):
        return [_jsonable(v) for v in obj]
    if obj is None or isinstance(obj, bool | int | str):
        return obj
    if hasattr(obj, "value") and isinstance(obj.value, str):  # Verdict
        return obj.value
    return str(obj)


def _env_tables(env: dict[str, Any], t: dict[str, str]) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    versions = [(k, fmt(v)) for k, v in (env.get("packages") or {}).items()]
    dut = env.get("device_under_test") or {}
    ref = env.get("reference_device") or {}
    drv = env.get("driver") or {}
    mem = dut.get("total_memory_bytes")
    items = [
        (t["env_dut"], f"{dut.get('device_name')} ({dut.get('device')}), {t['env_count']} {dut.get('device_count')}"),
        (t["env_memory"], f"{mem / 2**30:.1f} GiB" if mem else "–"),
        (t["env_ref"], f"{ref.get('device_name')} ({ref.get('device')})"),
        (t["env_driver"], ", ".join(f"{k} {v}" for k, v in drv.items() if v) or "–"),
        (t["env_commit"], fmt(env.get("difforge_git"))),
        (t["env_platform"], fmt(env.get("platform"))),
        (t["env_threads"], t["env_threads_value"].format(cores=env.get("cpu_count"), threads=env.get("torch_threads"))),
        (t["env_vars"], ", ".join(f"{k}={v}" for k, v in (env.get("env") or {}).items()) or "–"),
        (t["env_presets"], ", ".join(f"{k}={v}" for k, v in (env.get("env_presets") or {}).get("applied", {}).items())
         or "–"),
        (t["env_config_hash"], fmt(env.get("config_hash"))),
    ]
    return versions, items


def _bytes(n: int | None) -> str:
    if n is None:
        return "–"
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def _speed_rounds(r: dict[str, Any], t: dict[str, str]) -> str:
    """How a row was measured (timed rounds after warm-up) and the spread between its rounds, flagged when a
    reader must not trust its median (above bench.SPREAD_FLAG)."""
    text = t["perf_rounds_cell"].format(rounds=r.get("rounds", "–"), warmup=r.get("warmup", "–"))
    spread = r.get("spread")
    if spread is not None:
        text += "; " + t["perf_spread_flag" if r.get("unsteady") else "perf_spread"].format(spread=f"{spread:.1f}")
    return text


def _identity_text(identity: dict[str, Any] | None, t: dict[str, str]) -> str:
    """The off-identity finding (validate/identity.py) in a few words, "" when it decided nothing."""
    status = (identity or {}).get("status")
    if status == "identical":
        return t["perf_acc_identical"].format(names=", ".join(identity["names"]))  # type: ignore[index]
    if status == "differs":
        return t["perf_acc_differs"].format(names=", ".join(identity.get("breaking") or identity["names"]))  # type: ignore[union-attr]
    return ""


def _speed_accuracy(r: dict[str, Any], t: dict[str, str], verdict: str, identity: dict[str, Any] | None = None) -> str:
    """The accuracy evidence beside a row: the validated row carries this report's verdict; an approximate
    row was timed only and names the validation that would judge it; the rows of exact optimisations carry the
    off-identity finding on this device (bitwise equal to their off state, or approximate here)."""
    found = _identity_text(identity, t)
    if r.get("validated"):
        text = t["perf_acc_validated"].format(verdict=verdict)
        return f"{text}; {found}" if found else text
    if r.get("kind") == "approximate":
        return t["perf_acc_none"].format(name=r.get("name", ""))
    return found or t["perf_acc_exact"]


def _speed_context(bench: RungResult | None, t: dict[str, str], tr: Callable[[str], str],
                   esc: Callable[[Any], Any], verdict: str = "") -> dict[str, Any]:
    """The ModelZoo-style performance table: header line and one row per configuration, each row with how it
    was measured and its accuracy evidence beside it."""
    speed = (bench.data or {}).get("speed") if bench is not None else None
    if not speed:
        return {}
    h = speed["header"]
    kinds = {"baseline": t["perf_baseline"], "exact": t["perf_exact"], "validated": t["perf_validated_row"],
             "approximate": t["perf_approximate"]}
    rows = []
    for r in speed.get("rows") or []:
        name = t["perf_defaults"] if r.get("name") == "defaults" else r.get("name", "")
        if "error" in r:
            rows.append({"kind": kinds.get(r["kind"], r["kind"]), "options": name, "error":
                         t["perf_failed"].format(error=tr(r["error"]))})
            continue
        mem_note = "" if r.get("memory_kind") == "device" else f" ({t['perf_host']})"
        speedup = r.get("speedup_end_to_end") or r.get("speedup_step")
        rows.append({"kind": kinds.get(r["kind"], r["kind"]), "options": name, "error": "",
                     "cells": [fmt(r.get("s_per_it")), fmt(r.get("it_per_s")), fmt(r.get("end_to_end_s")),
                               "–" if speedup is None else f"{speedup:.2f}×",
                               _bytes(r.get("memory_after_load_bytes")) + mem_note,
                               _bytes(r.get("peak_bytes")) + mem_note],
                     "rounds": _speed_rounds(r, t), "unsteady": bool(r.get("unsteady")),
                     "accuracy": _speed_accuracy(r, t, verdict, (bench.data or {}).get("off_identity")),
                     "validated": "✓" if r.get("validated") else ""})
    size = (f"{h['width']}×{h['height']}" if h.get("width") and h.get("height") else t["perf_default_size"])
    text = t["perf_table_text"].format(**{**{k: esc(v) for k, v in h.items()}, "size": esc(size)})
    unsteady = [r for r in rows if r.get("unsteady")]
    return {"text": text, "rows": rows, "skipped": t["perf_no_table"] if speed.get("skipped") else "",
            "unsteady": t["perf_unsteady"] if unsteady else "",
            "headers": [t["perf_config"], t["perf_options"], t["perf_s_it"], t["perf_it_s"], t["perf_e2e"],
                        t["perf_speedup"], t["perf_mem_load"], t["perf_mem_peak"], t["perf_rounds"],
                        t["perf_accuracy"], t["perf_validated"]]}


def _ranks_context(record: dict[str, Any] | None, t: dict[str, str], esc: Callable[[Any], Any]) -> dict[str, Any]:
    """``--parallel``: one row per rank of the device under test's run (its RunRecord's ``extra.parallel.ranks``):
    ``cfg`` ranks carry one run's timings, ``data`` ranks a list of ``runs``; nothing when the run had one process."""
    par = ((record or {}).get("extra") or {}).get("parallel") or {}
    ranks = par.get("ranks") if isinstance(par, dict) else None
    if not ranks:
        return {}
    rows = []
    for r in ranks:
        runs = r.get("runs") if isinstance(r.get("runs"), list) else [r]
        steps = sorted(s for run in runs for s in run.get("step_times_s") or [])
        phases = [run.get("phases_s") or {} for run in runs]
        peaks = [run["peak_device_bytes"] for run in runs if run.get("peak_device_bytes") is not None]
        wall = r.get("wall_s", sum(sum(ph.values()) for ph in phases))
        rows.append([fmt(r.get("rank")), fmt(r.get("host")), fmt(r.get("device")), fmt(len(runs)), fmt(len(steps)),
                     fmt(steps[len(steps) // 2] * 1e3) if steps else "–",
                     fmt(sum(ph.get("load", 0.0) for ph in phases)), fmt(sum(ph.get("denoise", 0.0) for ph in phases)),
                     fmt(wall), _bytes(max(peaks)) if peaks else "–"])
    text = t["ranks_text"].format(world=esc(par.get("world_size", len(ranks))), mode=esc(par.get("mode")),
                                  backend=esc(par.get("dist_backend")))
    return {"text": text, "rows": rows,
            "headers": [t["rank"], t["rank_host"], t["rank_device"], t["rank_runs"], t["rank_steps"],
                        t["rank_step_ms"], t["rank_load"], t["rank_denoise"], t["rank_wall"], t["perf_mem_peak"]]}


def _scan_context(scan: dict[str, Any] | None, t: dict[str, str], esc: Callable[[Any], Any]) -> dict[str, Any]:
    """``--scan-source``: the summary sentence and one row per finding (validate/runner.py's scan data)."""
    if not scan:
        return {}
    counts = scan.get("counts") or {}
    text = t["scan_text"].format(files=esc(scan.get("files_scanned")), root=esc(scan.get("root")),
                                 device=esc(scan.get("device")), seconds=esc(fmt(scan.get("elapsed_s"))),
                                 errors=counts.get("error", 0), warnings=counts.get("warning", 0),
                                 infos=counts.get("info", 0))
    rows = [(f"{f['path']}:{f['line']}", f["rule"], f["severity"], f["message"], f["fix"])
            for f in scan.get("findings") or []]
    return {"text": text, "rows": rows, "headers": [t["scan_where"], t["scan_rule"], t["scan_severity"],
                                                    t["scan_message"], t["scan_fix"]]}


#: The report's sections in reading order (pictures first, then the verdict, the performance table, the
#: accuracy rungs' detail, and the record); each present one is numbered in this order.
SECTIONS = ("pictures", "overview", "performance", "accuracy", "smoke", "environment", "adaptations", "scan",
            "reproduce", "gallery", "signoff", "notes", "deliverables")
SUBSECTIONS = {"accuracy": ("operator", "component_rung", "step", "trajectory", "semantic", "msprobe")}


def _headings(t: dict[str, str], present: set[str]) -> dict[str, str]:
    """Numbered headings of the sections present (``1. ...``), subsections ``4.1 ...``."""
    out: dict[str, str] = {}
    n = 0
    for key in SECTIONS:
        if key not in present:
            continue
        n += 1
        out[key] = f"{n}. {t[key]}"
        for i, sub in enumerate(SUBSECTIONS.get(key, ()), 1):
            out[sub] = f"{n}.{i} {t[sub]}"
    return out


#: Options that change what every side computes, as the configuration table names them (field, flag).
SHIPPED_OPTIONS = (("steps", "--steps"), ("height", "--height"), ("width", "--width"), ("num_frames", "--num-frames"),
                   ("guidance", "--guidance"), ("guidance_trunc", "--guidance-trunc"), ("true_cfg", "--true-cfg"),
                   ("negative_prompt", "--negative-prompt"), ("transformer", "--transformer"))


def _config_rows(config: dict[str, Any], t: dict[str, str]) -> list[tuple[str, str, str]]:
    """(flag, value, applies to) for the shipped options and the device-only ones (DUT_ONLY)."""
    def show(value: Any) -> str:
        if value is None:
            return t["default"]
        if isinstance(value, list | tuple):
            return ", ".join(str(v) for v in value) or t["none"]
        if isinstance(value, str) and value.strip() != value or value == "":
            return repr(value)  # a blank negative prompt stays visible
        return fmt(value)

    rows = [(flag, show(config.get(name)), t["every_side"]) for name, flag in SHIPPED_OPTIONS if name in config]
    rows += [("--" + name.replace("_", "-"), show(config.get(name)), t["device_only"]) for name in DUT_ONLY
             if name in config]
    return rows


def _floor_text(t: dict[str, str], traj: RungResult | None, esc: Callable[[Any], Any] = str,
                tr: Callable[[str], str] = str) -> str:
    if traj is None or not traj.data or "floor" not in traj.data:
        return ""
    key = "floor_text" if traj.data.get("floor_available", True) else "no_floor_text"
    return t[key].format(floor=esc(tr(traj.data["floor"])))


def _msprobe_result(result: str, messages: list[str]) -> str:
    """msprobe's Result and its messages in one cell: ``error: The dtype ...; The shape ...``."""
    said = "; ".join(str(m).removeprefix(f"{result}: ").removeprefix("warning: ") for m in messages)
    return f"{result}: {said}" if said else result


def _localisation_text(loc: dict[str, Any] | None, t: dict[str, str], esc: Callable[[Any], Any]) -> str:
    """Which step was replayed block by block, by which rule, and the block it names."""
    if not loc:
        return ""
    ratio = loc.get("ratio_threshold")
    rule = (t["localisation_rule_floor"].format(ratio=esc(ratio)) if ratio is not None
            else t["localisation_rule_cosine"].format(threshold=esc(loc["threshold"])))
    if loc["first_divergent"]:
        first = esc(loc["first_divergent"])
    else:
        first = t["no_block_diverges"] if loc.get("informative") else t["after_blocks"]
    key = "localisation_text_worst" if loc.get("informative") else "localisation_text"
    return t[key].format(step=esc(loc["step"]), seed=esc(loc.get("seed")), rule=rule, first=first)


def _msprobe_context(m: dict[str, Any] | None, t: dict[str, str], esc: Callable[[Any], Any],
                     markdown: bool, tr: Callable[[str], str] = str) -> dict[str, Any]:
    """The msprobe section (validate/msprobe_view.py's data): the table and its prose, or how to get it."""
    safe: Callable[[str], Any] = Markup if markdown else (lambda v: v)
    m = m or {"requested": False, "install": "pip install 'difforge[msprobe]'"}
    ctx: dict[str, Any] = {"requested": bool(m.get("requested")), "text": "", "first": "", "error": "", "rows": [],
                           "notes": [tr(n) for n in m.get("notes") or []], "commands": list(m.get("commands") or []),
                           "how": safe(t["msprobe_how"].format(install=esc(m.get("install", ""))))}
    if not ctx["requested"]:
        return ctx
    if m.get("error"):
        ctx["error"] = safe(t["msprobe_error"].format(error=esc(tr(m["error"]))))
    golden = m.get("golden") or {}
    if "rows_total" in m:
        counts = ", ".join(f"{k} {v}" for k, v in sorted((m.get("counts") or {}).items()))
        ctx["text"] = safe(t["msprobe_text"].format(
            version=esc(m.get("msprobe")), task=esc(m.get("task")), level=esc(m.get("level")), unit=esc(tr(m.get("unit") or "")),
            device_calls=esc((m.get("device") or {}).get("calls")), golden=esc(tr(golden.get("label") or "")),
            golden_calls=esc(golden.get("calls")), rows=esc(m["rows_total"]), counts=esc(counts)))
        first = m.get("first_flagged")
        ctx["first"] = safe(t["msprobe_first"].format(
            name=esc(first["name"]), module=esc(first.get("module") or "–"), block=esc(first.get("block") or "–"),
            result=esc(first["result"])) if first else t["msprobe_none_flagged"])
        def pct(x: float | None) -> str:
            return "–" if x is None else f"{fmt(x)}%"

        for r in m.get("worst") or []:
            ctx["rows"].append([r["name"], r.get("module") or "–", f"{r['dtype']} / {r['bench_dtype']}",
                                fmt(r.get("max_diff")), pct(r.get("max_rel")), pct(r.get("norm_rel")),
                                _msprobe_result(r["result"], r.get("messages") or []),
                                tr(r.get("difforge_block") or "–"), r.get("difforge_op") or "–"])
    ctx["headers"] = [t["msprobe_row"], t["msprobe_module"], t["msprobe_dtype"], "Max diff", "MaxRelativeErr",
                      "NormRelativeErr", t["msprobe_result"], t["difforge_block"], t["difforge_op"]]
    if markdown:
        ctx["commands"] = [Markup(c) for c in ctx["commands"]]
        ctx["fence"] = Markup(_code_fence(ctx["commands"]))
    return ctx


def build_context(result: ValidationResult, lang: str, plots: dict[str, bytes], deliverables: list[dict],
                  markdown: bool = False) -> dict:
    """The template context; ``markdown=True``: the prose is pre-escaped and marked safe for report.md."""
    esc: Callable[[Any], Any] = md_escape if markdown else (lambda v: v)
    t = texts(lang)
    tr = translator(lang)
    d = result.data
    titles = RUNG_TITLES.get(lang, RUNG_TITLES["en"])
    env = d.get("environment", {})
    versions, env_items = _env_tables(env, t)
    presets = [p for p in (env.get("env_presets") or {}).get("recommended", []) if not p.get("opt_in")]
    reproduce = ["pip install -e .", *[f"export {p['name']}={p['value']}" for p in presets], *d.get("reproduce", [])]
    overview = [{"key": k, "title": titles.get(k, k), "verdict": str(r.verdict), "summary": tr(r.summary),
                 "seconds": fmt(round(r.seconds, 2)) if r.seconds else "–"} for k, r in result.rungs.items()]
    tables = {k: rung_table(r, tr, lang) for k, r in result.rungs.items()}
    used_sources = sorted({s for tb in tables.values() for s in tb["sources"]})
    step = result.rungs.get("step")
    loc = step.data.get("localisation") if step is not None else None
    traj = result.rungs.get("trajectory")
    date = _dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    model = d.get("options", {}).get("model")
    ctx = {
        "t": t,
        "lang": lang,
        "title": t["title"].format(model=esc(model), device=esc(d.get("device_label"))),
        "verdict": str(result.verdict),
        "overview_text": t["overview_text"].format(
            model=esc(model), family=esc(d.get("family")), device=esc(d.get("device_label")),
            reference=esc(d.get("reference_label")), verdict=result.verdict),
        "overview": overview,
        "versions": versions,
        "env_items": env_items,
        "reproduce": reproduce,
        "config_rows": _config_rows(d.get("config") or {}, t),
        "quick_reductions": [tr(q) for q in d.get("quick_reductions") or []],
        "adaptations": [{**a, "what": tr(a.get("what", "")), "choice": tr(a.get("choice", "")),
                         "detail": tr(a.get("detail", ""))} for a in d.get("adaptations", [])],
        "tables": tables,
        "rungs": result.rungs,
        "titles": titles,
        "localisation": loc,
        "localisation_text": _localisation_text(loc, t, esc),
        "floor_text": _floor_text(t, traj, esc, tr),
        "verdict_reasons": [tr(r) for r in d.get("verdict_reasons") or []],
        "msprobe": _msprobe_context(d.get("msprobe"), t, esc, markdown, tr),
        "gallery": d.get("gallery") or {},
        "notes": [tr(n) for n in d.get("notes", [])],
        "signoff": d.get("signoff") or {},
        "sources": [(k, tr(SOURCES[k][0]), tr(SOURCES[k][1])) for k in used_sources],
        "deliverables": deliverables,
        "plots": {k: base64.b64encode(v).decode() for k, v in plots.items()},
        "plot_files": {k: f"plots/{k}.png" for k in plots},
        "generated": t["generated"].format(date=date, version=__version__),
        "fmt": fmt,
        "cols": {k: column_name(k, lang, tr) for k in ("cosine", "rel_l2", "max_abs")},
        "speed": _speed_context(result.rungs.get("benchmark"), t, tr, esc, str(result.verdict)),
        "font_css": Markup(font_face_css()) if lang == "zh" and not markdown else "",
    }
    ctx["scan"] = _scan_context(d.get("scan"), t, esc)
    ctx["ranks"] = _ranks_context(d.get("dut_record"), t, esc)
    strips = [e for e in (ctx["gallery"].get("entries") or []) if "strip" in e]
    present = set(SECTIONS) - ({"pictures"} if not strips else set()) - ({"signoff"} if not ctx["signoff"] else set())
    present -= set() if ctx["scan"] else {"scan"}
    ctx["h"] = _headings(t, present)
    ctx["steps_note"] = _steps_note(ctx["gallery"], result.rungs.get("semantic"), t, ctx["h"])
    if markdown:  # the report's own prose and links pass as they are; everything else is escaped
        ctx["t"] = {k: Markup(v) for k, v in t.items()}
        ctx["h"] = {k: Markup(v) for k, v in ctx["h"].items()}
        if ctx["speed"]:
            ctx["speed"] = {**ctx["speed"], "text": Markup(ctx["speed"]["text"])}
        if ctx["scan"]:
            ctx["scan"] = {**ctx["scan"], "text": Markup(ctx["scan"]["text"])}
        if ctx["ranks"]:
            ctx["ranks"] = {**ctx["ranks"], "text": Markup(ctx["ranks"]["text"])}
        for key in ("title", "overview_text", "localisation_text", "floor_text", "generated", "steps_note"):
            ctx[key] = Markup(ctx[key])
        ctx["plot_files"] = {k: Markup(v) for k, v in ctx["plot_files"].items()}
        ctx["fence"] = Markup(_code_fence(reproduce))
        ctx["reproduce"] = [Markup(line) for line in reproduce]  # inside the fence: shown verbatim
        here = (ctx["signoff"] or {}).get("reproduce_here")
        if here:
            ctx["signoff"] = {**ctx["signoff"], "reproduce_here": Markup(here), "fence": Markup(_code_fence([here]))}
    return ctx


def _steps_note(gallery: dict[str, Any], semantic: RungResult | None, t: dict[str, str], h: dict[str, str]) -> str:
    """What stands beside every gallery picture made with fewer steps than the model draws with (``--quick``):
    the steps it was made with, the model's default, and where the default-step pictures are (the semantic
    rung's sheet, when it ran).  Empty when the pictures were made at the default."""
    if not gallery.get("steps_lowered"):
        return ""
    text = t["pictures_steps"].format(steps=gallery.get("steps"), default=gallery.get("default_steps"))
    if semantic is not None and (semantic.data or {}).get("contact_sheet"):
        text += " " + t["pictures_steps_semantic"].format(section=h.get("semantic", t["semantic"]))
    return text


def _embed(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def write_report(result: ValidationResult, out: Path, lang: str = "en", files: list[Path] | None = None,
                 ) -> dict[str, Path]:
    """Write plots, report.json, report.md, report.html and SHA256SUMS; return their paths."""
    out = Path(out)
    plots: dict[str, bytes] = {}
    step = result.rungs.get("step")
    traj = result.rungs.get("trajectory")
    bench = result.rungs.get("benchmark")
    for name, png in (
        ("step_error", step_error_plot(step.data if step else None, traj.data if traj else None, lang)),
        ("step_time", step_time_plot(bench.data if bench else None, lang)),
        ("block_error", block_plot(step.data.get("localisation") if step and step.data else None, lang)),
    ):
        if png is not None:
            plots[name] = png
            atomic_write_bytes(out / "plots" / f"{name}.png", png)
    artefacts = [Path(p) for p in (files or [])] + [out / "plots" / f"{k}.png" for k in plots]
    deliverables = [{"file": str(p.relative_to(out)), "bytes": p.stat().st_size, "sha256": sha256_file(p)}
                    for p in artefacts if p.is_file()]

    payload = {
        "verdict": str(result.verdict),
        "exit_code": result.exit_code,
        "rungs": {k: r.to_dict() for k, r in result.rungs.items()},
        **result.data,
        "deliverables": deliverables,
        "threshold_sources": {k: {"label": v[0], "where": v[1]} for k, v in SOURCES.items()},
    }
    paths = {"json": atomic_write_text(out / "report.json", json.dumps(_jsonable(payload), indent=2,
                                                                       ensure_ascii=False) + "\n")}
    ctx = build_context(result, lang, plots, deliverables)
    md_ctx = build_context(result, lang, plots, deliverables, markdown=True)
    env = Environment(loader=PackageLoader("difforge.report", "templates"), undefined=StrictUndefined,
                      autoescape=True, finalize=_md_finalize, trim_blocks=True, lstrip_blocks=True)
    env.filters["url"] = lambda v: Markup(quote(str(v)))  # a file name as a link target
    paths["markdown"] = atomic_write_text(out / "report.md", env.get_template("report.md.j2").render(**md_ctx))
    images = {p.name: _embed(p) for p in artefacts if p.suffix == ".png" and p.is_file()}
    html_env = Environment(loader=PackageLoader("difforge.report", "templates"), undefined=StrictUndefined,
                           autoescape=True, trim_blocks=True, lstrip_blocks=True)
    paths["html"] = atomic_write_text(out / "report.html",
                                      html_env.get_template("report.html.j2").render(**ctx, images=images))
    sums = [f"{d['sha256']}  {d['file']}" for d in deliverables]
    for key in ("json", "markdown", "html"):
        sums.append(f"{sha256_file(paths[key])}  {paths[key].name}")
    paths["sha256"] = atomic_write_text(out / "SHA256SUMS", "\n".join(sums) + "\n")
    return paths
