"""A scan's findings as a terminal table (rich), a JSON document, or a short Markdown table.

The terminal table wraps every column instead of cutting it: a path folds at any character, so
``file:line`` stays whole and clickable in editors that understand it.  ``rich`` is imported only
when a table is printed, so ``--json`` and the API never pay for it.
"""

from __future__ import annotations

import json
from typing import IO

from .result import SEVERITIES, ScanResult, printable

_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}
#: From this terminal width on, rule, severity and fix get columns of their own.
WIDE_COLUMNS = 140


def summary_line(result: ScanResult) -> str:
    """``scanned 58 files (1 skipped) for npu in 0.31 s: 5 errors, 8 warnings, 2 info``."""
    counts = result.counts()
    parts = [f"{counts['error']} error{'s' * (counts['error'] != 1)}",
             f"{counts['warning']} warning{'s' * (counts['warning'] != 1)}", f"{counts['info']} info"]
    skipped = f" ({len(result.skipped)} skipped)" if result.skipped else ""
    followed = f"; {result.follow_note}" if result.follow_note else ""
    files = f"{len(result.files)} file{'s' * (len(result.files) != 1)}"
    return printable(f"scanned {files}{skipped} for {result.target} in {result.elapsed_s:.2f} s: "
                     f"{', '.join(parts)}{followed}")


def to_json(result: ScanResult) -> str:
    return json.dumps(result.to_dict(), indent=2)


def print_table(result: ScanResult, file: IO[str] | None = None, width: int | None = None) -> None:
    """The findings table, the skipped files and the summary line, on ``file`` (stdout by default)."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console(file=file, width=width, highlight=False, soft_wrap=False)
    if result.findings:
        wide = console.width >= WIDE_COLUMNS
        table = Table(show_lines=True, expand=True, pad_edge=False)
        table.add_column("where", overflow="fold", ratio=3 if wide else 2, min_width=16)
        if wide:
            table.add_column("rule", no_wrap=True, min_width=5)
            table.add_column("severity", no_wrap=True, min_width=7)
            table.add_column("why", overflow="fold", ratio=5)
            table.add_column("fix", overflow="fold", ratio=4)
        else:  # a narrow terminal: rule and severity under the place, the fix under the why
            table.add_column("why / fix", overflow="fold", ratio=5)
        for f in result.findings:
            severity = Text(f.severity, style=_STYLE.get(f.severity, ""))
            path, message, fix = printable(f.path), printable(f.message), printable(f.fix)
            if wide:
                table.add_row(Text(f"{path}:{f.line}"), Text(f.rule), severity, Text(message), Text(fix))
            else:
                where = Text(f"{path}:{f.line}\n{f.rule} ").append_text(severity)
                table.add_row(where, Text(message).append("\nfix: ", style="bold").append(fix))
        console.print(table)
    for s in result.skipped:
        console.print(Text(printable(f"skipped {s.path}: {s.reason}")))
    console.print(Text(summary_line(result)))


def render_markdown(result: ScanResult, limit: int = 40) -> str:
    """A short Markdown section (for a port report): the counts and the first ``limit`` findings."""
    counts = result.counts()
    lines = [f"**Source scan** ({result.target}): {len(result.files)} files, "
             + ", ".join(f"{counts[s]} {s}" for s in SEVERITIES) + "."
             + (f" ({printable(result.follow_note)}.)" if result.follow_note else ""), ""]
    if not result.findings:
        return "\n".join(lines + ["No findings."]) + "\n"
    lines += ["| where | rule | severity | finding |", "|---|---|---|---|"]
    ordered = sorted(result.findings, key=lambda f: (SEVERITIES.index(f.severity), f.path, f.line))
    for f in ordered[:limit]:
        detail = printable(f.message.split(": ", 1)[0]).replace("|", "\\|")
        where = printable(f.path).replace("`", "'")
        lines.append(f"| `{where}:{f.line}` | {f.rule} | {f.severity} | {detail} |")
    if len(ordered) > limit:
        lines += ["", f"... and {len(ordered) - limit} more (difforge scan --json lists them all)."]
    return "\n".join(lines) + "\n"

