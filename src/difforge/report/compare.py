"""The report of ``difforge compare``: report.md and report.json (and SHA256SUMS) in a folder.

Same shape as a validation report folder where it matters: built aside and published whole
(:class:`~difforge.validate.outdir.StagedFolder`), a previous report folder is replaced, any other
non-empty folder refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..runtime.atomic import atomic_write_text
from ..runtime.record import sha256_file
from ..validate.compare import Comparison
from ..validate.options import check_out_dir
from ..validate.outdir import StagedFolder


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return "inf" if value == float("inf") else f"{value:.{digits}f}"
    return str(value)


def markdown(result: Comparison) -> str:
    d = result.to_dict()
    lines = [f"# difforge compare: **{d['verdict']}**", "",
             f"A (device run): `{d['a']}`  ", f"B (reference): `{d['b']}`  ",
             f"Floor: `{d['floor']}`" if d["floor"] else "Floor: none (nothing proves the precision: at best WARN)",
             "", f"Rule: {d['rule']}.", "",
             "| pair | verdict | RMSE (levels) | PSNR (dB) | SSIM | within ±4 | × floor | why |",
             "|---|---|---|---|---|---|---|---|"]
    for p in d["pairs"]:
        m = p["metrics"] or {}
        lines.append(f"| `{p['name']}` | {p['verdict']} | {_fmt(m.get('rmse'))} | {_fmt(m.get('psnr_db'), 1)} | "
                     f"{_fmt(m.get('ssim'), 4)} | {_fmt(m.get('within_4', 0) * 100 if m else None, 1)} % | "
                     f"{_fmt(p['ratio'])} | {p['why']} |")
    for label, names in (("only in A", d["only_a"]), ("only in B", d["only_b"])):
        if names:
            lines += ["", f"Not compared ({label}): " + ", ".join(f"`{n}`" for n in names[:50])
                      + (" …" if len(names) > 50 else "")]
    return "\n".join(lines) + "\n"


def write_compare_report(result: Comparison, out: str | Path) -> dict[str, Path]:
    """Write report.md, report.json and SHA256SUMS into ``out`` (staged, published whole)."""
    check_out_dir(out)
    staged = StagedFolder(out)
    work = staged.create()
    try:
        md = atomic_write_text(work / "report.md", markdown(result))
        deliverables = [{"file": "report.md", "bytes": md.stat().st_size, "sha256": sha256_file(md)}]
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
    return {"md": final / "report.md", "json": final / "report.json", "sha256": final / "SHA256SUMS"}


__all__ = ["markdown", "write_compare_report"]
