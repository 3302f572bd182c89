"""``run_validation`` with the real report writer, as ``difforge.validate`` calls it."""

from __future__ import annotations

import difforge.report
from difforge.validate import ValidateOptions, ValidationResult
from difforge.validate import run_validation as _run_validation


def run_validation(options: ValidateOptions) -> ValidationResult:
    """The writer is looked up per call, so a test may patch ``difforge.report.write_report``."""
    return _run_validation(options, lambda *a, **k: difforge.report.write_report(*a, **k))
