"""``difforge scan``: read a model's Python source and list what breaks or is slow off CUDA.

A static check for the first hour of a port: the source (a file, a folder, an installed package or
a module name such as ``diffusers.pipelines.qwenimage``) is parsed with :mod:`ast`, never imported or
run, and every rule of :data:`RULES` looks at it once - CUDA-only code at import time, device detection
that knows only cuda/mps, kernel libraries without a fallback, float64 and complex ops, CUDA
generators, default-backend ``torch.compile``, indices built in a floating dtype, hard-coded ``"cuda"``,
``torch.cuda.amp`` and backend switches, ``torch.cuda`` runtime calls, float16-only assumptions.

    >>> from difforge.scan import scan, render_markdown
    >>> result = scan("diffusers.pipelines.qwenimage", target_device="npu")
    >>> result.findings[0].rule, result.elapsed_s, render_markdown(result)

Nothing here imports torch (or anything heavier than :mod:`difforge.errors` and the one reading rule,
:mod:`difforge.runtime.reading`, both standard library only): scanning works on a
machine without the model's dependencies, and ``difforge scan`` starts instantly.  ``docs/scan.md``
lists the rules and how to silence one line (``# difforge: ignore[DF105]``).
"""

from __future__ import annotations

from .engine import MAX_BYTES, check_fail_on, check_target, fail_on_exit_code, scan, scan_source
from .render import print_table, render_markdown, summary_line, to_json
from .result import SCHEMA_VERSION, SEVERITIES, TARGETS, Finding, ScanResult, Skipped
from .rules import RULES, describe_rules

__all__ = [
    "MAX_BYTES", "RULES", "SCHEMA_VERSION", "SEVERITIES", "TARGETS", "Finding", "ScanResult", "Skipped",
    "check_fail_on", "check_target", "describe_rules", "fail_on_exit_code", "print_table", "render_markdown", "scan",
    "scan_source", "summary_line", "to_json",
]
