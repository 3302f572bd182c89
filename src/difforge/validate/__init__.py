"""``difforge validate``: the acceptance ladder that proves a port works, and its report.

Rungs, in order: smoke, determinism, benchmark, operator, component, teacher-forced step,
trajectory (plus a gallery).  Each compares the device under test with a reference (any device and
dtype, CPU float32 by default) against the thresholds in :mod:`difforge.validate.thresholds`.

    from difforge.validate import ValidateOptions, run_validation
    result = run_validation(ValidateOptions(model="tiny-ursa", device="cpu", dtype="bfloat16", out="r"))
    result.verdict, result.exit_code, result.report_paths
"""

from __future__ import annotations

from .options import RUNGS, ValidateOptions, ValidationResult, parse_reference
from .verdict import Measurement, Row, RungResult, Verdict


def run_validation(options: ValidateOptions) -> ValidationResult:
    """Run every rung for ``options`` and write report.md/.html/.json into ``options.out``."""
    from .runner import run_validation as _run

    return _run(options)


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
