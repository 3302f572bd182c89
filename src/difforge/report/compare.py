"""The report of ``difforge compare``: report.md, report.html (with the pictures), report.json and SHA256SUMS.

Same shape as a validation report folder where it matters: built aside and published whole
(:class:`~difforge.validate.outdir.StagedFolder`), a previous report folder is replaced, any other
non-empty folder refused.  The pictures are the validation report's own pieces: per pair a strip of
:func:`difforge.validate.gallery.strip` (reference | device | difference heat map, plus the floor and its
difference when there is one), saved under ``pictures/`` and embedded in the self-contained HTML.  At most
:data:`MAX_FIGURES` pairs are drawn, worst first, so a folder of thousands stays a readable page.
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined
from PIL import Image

from ..runtime.atomic import atomic_write_bytes, atomic_write_text
from ..runtime.images import load_images
from ..runtime.record import sha256_file
from ..validate.compare import Comparison, Pair
from ..validate.gallery import HEAT_MAX_LEVELS, contact_sheet, difference_map, strip
from ..validate.options import check_out_dir
from ..validate.outdir import StagedFolder
from ..validate.verdict import Verdict
from .render import md_escape

#: Pairs drawn in report.html (worst first); the table lists every pair.
MAX_FIGURES = 48
_ORDER = {Verdict.FAIL: 0, Verdict.WARN: 1, Verdict.PASS: 2}


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return "inf" if value == float("inf") else f"{value:.{digits}f}"
    return str(value)


def _cells(p: dict[str, Any]) -> list[str]:
    m = p["metrics"] or {}
    return [_fmt(m.get("rmse")), _fmt(m.get("psnr_db"), 1), _fmt(m.get("ssim"), 4),
            f"{_fmt(m.get('within_4', 0) * 100 if m else None, 1)} %", _fmt(p["ratio"])]


def markdown(result: Comparison) -> str:
    d = result.to_dict()
    lines = [f"# difforge compare: **{d['verdict']}**", "",
             f"A (device run): {md_escape(d['a'])}  ", f"B (reference): {md_escape(d['b'])}  ",
             f"Floor: {md_escape(d['floor'])}" if d["floor"] else "Floor: none", ""]
    if d["no_floor"]:
        lines += [f"> {d['no_floor']}.", ""]
    lines += [f"Rule: {d['rule']}.", "",
              "| pair | verdict | RMSE (levels) | PSNR (dB) | SSIM | within ±4 | × floor | why |",
              "|---|---|---|---|---|---|---|---|"]
    for p in d["pairs"]:
        lines.append(f"| {md_escape(p['name'])} | {p['verdict']} | " + " | ".join(_cells(p))
                     + f" | {md_escape(p['why'])} |")
    for label, names in (("only in A", d["only_a"]), ("only in B", d["only_b"])):
        if names:
            lines += ["", f"Not compared ({label}): " + ", ".join(md_escape(n) for n in names[:50])
                      + (" …" if len(names) > 50 else "")]
    return "\n".join(lines) + "\n"


def figure(pair: Pair) -> Image.Image | None:
    """The strip a reviewer looks at for one pair, or None when a side cannot be drawn (sizes differ ...)."""
    if not pair.metrics:
        return None
    a, b = load_images([str(pair.a), str(pair.b)])
    if pair.floor is None:
        return strip(a, b, f"A: {pair.name}", "B (reference)")
    (f,) = load_images([str(pair.floor)])
    return contact_sheet([b, a, difference_map(a, b), f, difference_map(f, b)],
                         ["B (reference)", f"A: {pair.name}", "|A - B|", "floor", "|floor - B|"], columns=5)


def _png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG", optimize=True)
    return buf.getvalue()


def html(result: Comparison, figures: list[tuple[Pair, bytes]]) -> str:
    """The self-contained report.html: verdict, the no-floor note, the pictures, then the table."""
    d = result.to_dict()
    env = Environment(loader=PackageLoader("difforge.report", "templates"), undefined=StrictUndefined,
                      autoescape=True, trim_blocks=True, lstrip_blocks=True)
    layout = (f"B (reference) | A | |A - B| | floor | |floor - B| (heat map bright from {HEAT_MAX_LEVELS} levels)"
              if result.floor else f"B (reference) | A | |A - B| (heat map bright from {HEAT_MAX_LEVELS} levels)")
    drawn = [{"name": p.name, "verdict": str(p.verdict), "why": p.why, "png": base64.b64encode(png).decode()}
             for p, png in figures]
    rows = [{"name": p["name"], "verdict": p["verdict"], "cells": _cells(p), "why": p["why"]} for p in d["pairs"]]
    unmatched = [(label, names) for label, names in (("only in A", d["only_a"]), ("only in B", d["only_b"])) if names]
    return env.get_template("compare.html.j2").render(
        verdict=d["verdict"], no_floor=d["no_floor"], a=d["a"], b=d["b"], floor=d["floor"], rule=d["rule"],
        layout=layout, figures=drawn, hidden=len(result.pairs) - len(figures), rows=rows, unmatched=unmatched)


def write_compare_report(result: Comparison, out: str | Path) -> dict[str, Path]:
    """Write report.md, report.html, pictures/, report.json and SHA256SUMS into ``out`` (staged, published whole)."""
    check_out_dir(out)
    staged = StagedFolder(out)
    work = staged.create()
    try:
        worst_first = sorted(result.pairs, key=lambda p: (_ORDER.get(p.verdict, 0), p.name))
        figures: list[tuple[Pair, bytes]] = []
        deliverables: list[dict[str, Any]] = []
        for k, p in enumerate(worst_first[:MAX_FIGURES]):
            img = figure(p)
            if img is None:
                continue
            png = _png(img)
            path = atomic_write_bytes(work / "pictures" / f"pair_{k + 1:03d}.png", png)
            figures.append((p, png))
            deliverables.append({"file": f"pictures/{path.name}", "pair": p.name, "bytes": len(png),
                                 "sha256": sha256_file(path)})
        for name, text in (("report.md", markdown(result)), ("report.html", html(result, figures))):
            path = atomic_write_text(work / name, text)
            deliverables.append({"file": name, "bytes": path.stat().st_size, "sha256": sha256_file(path)})
        data = {**result.to_dict(), "rungs": {"compare": {"verdict": str(result.verdict)}},
                "deliverables": deliverables}
        js = atomic_write_text(work / "report.json", json.dumps(data, indent=2, default=str) + "\n")
        sums = [f"{sha256_file(js)}  report.json", *(f"{x['sha256']}  {x['file']}" for x in deliverables)]
        atomic_write_text(work / "SHA256SUMS", "\n".join(sorted(sums, key=lambda s: s.split("  ")[1])) + "\n")
        staged.publish()
    except BaseException:
        staged.discard()
        raise
    final = Path(out)
    return {"md": final / "report.md", "html": final / "report.html", "json": final / "report.json",
            "sha256": final / "SHA256SUMS"}


__all__ = ["MAX_FIGURES", "figure", "html", "markdown", "write_compare_report"]
