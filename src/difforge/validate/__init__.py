"""``difforge validate``: the acceptance ladder that proves a port works, and its report.

Rungs, in order: smoke, determinism, benchmark, operator, component, teacher-forced step,
trajectory (plus a gallery).  Each compares the device under test with a reference (any device and
dtype, CPU float32 by default) against the thresholds in :mod:`difforge.validate.thresholds`.

    import difforge
    result = difforge.validate(model="tiny-ursa", device="cpu", dtype="bfloat16", out="r")
    result.verdict, result.exit_code, result.report_paths

(:func:`run_validation` is the same with the report writer passed in: validate sits to the left of
:mod:`difforge.report` and never imports it.)
"""

from __future__ import annotations

from typing import Any

from .options import RUNGS, ValidateOptions, ValidationResult, parse_reference
from .verdict import Measurement, Row, RungResult, Verdict


def run_validation(options: ValidateOptions, write_report: Any) -> ValidationResult:
    """Run every rung for ``options``; ``write_report`` (``difforge.report.write_report``) writes
    report.md/.html/.json into ``options.out``."""
    from .runner import run_validation as _run

    return _run(options, write_report)


__all__ = [
    "RUNGS",
    "Measurement",
    "Row",
    "RungResult",
    "ValidateOptions",
    "ValidationResult",
    "Verdict",
    "parse_reference",
    "run_validation",
]
