"""``run_validation`` with the real report writer, as ``difforge.validate`` calls it."""

from __future__ import annotations

from difforge.report import write_report
from difforge.validate import ValidateOptions, ValidationResult
from difforge.validate import run_validation as _run_validation


def run_validation(options: ValidateOptions) -> ValidationResult:
    return _run_validation(options, write_report)
