"""The options of ``difforge validate`` and what a validation returns.

``ValidateOptions`` mirrors the CLI flags one to one, so the CLI only builds it and calls
:func:`difforge.validate.run_validation`; Python users and tests build it directly (tests also
pass ``op_overrides`` to plant a porting bug in the device under test only).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..devices import DTYPES
from ..errors import InputError

if TYPE_CHECKING:
    from .verdict import RungResult, Verdict

#: Rungs in the order they run and appear in the report.
RUNGS = ("smoke", "determinism", "benchmark", "operator", "component", "step", "trajectory")


@dataclass
class ValidateOptions:
    """One validation run (``difforge validate`` flags)."""

    model: str
    out: str | Path
    device: str = "auto"
    dtype: str = "auto"
    reference: str = "cpu:float32"
    images: list[str] = field(default_factory=list)
    prompts: str | None = None  # a text file, one prompt (or edit instruction) per line
    steps: int | None = None
    height: int | None = None
    width: int | None = None
    rounds: int = 3
    warmup: int = 1
    seed: int = 0
    quick: bool = False
    lang: str = "en"
    quiet: bool = False
    #: Replace ops in the device-under-test pipeline only (tests plant porting bugs with this).
    op_overrides: dict[str, Callable[..., Any]] | None = None
    #: Extra seeds for the trajectory rung (clean runs are checked on several seeds).
    extra_seeds: list[int] = field(default_factory=list)

    def check(self) -> None:
        """Reject bad usage early, as a DifforgeError (exit 2) with one actionable sentence."""
        if self.lang not in ("en", "zh"):
            raise InputError(f"--lang must be 'en' or 'zh', not '{self.lang}'.")
        if self.rounds < 1:
            raise InputError("--rounds must be at least 1.")
        if self.warmup < 0:
            raise InputError("--warmup must be 0 or more.")
        if self.steps is not None and self.steps < 1:
            raise InputError("--steps must be at least 1.")
        if self.prompts is not None and not Path(self.prompts).is_file():
            raise InputError(f"--prompts file {self.prompts} does not exist; give a text file, one prompt a line.")
        for img in self.images:
            if not Path(img).is_file():
                raise InputError(f"--image {img} does not exist.")
        parse_reference(self.reference)

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "op_overrides"}
        out["out"] = str(self.out)
        out["op_overrides"] = sorted(self.op_overrides) if self.op_overrides else []
        return out


def parse_reference(spec: str) -> tuple[str, str]:
    """``cpu:float32`` / ``cuda:1:bfloat16`` / ``cpu`` -> (device, dtype); dtype defaults to float32."""
    spec = (spec or "cpu:float32").strip().lower()
    head, _, tail = spec.rpartition(":")
    if head and tail in DTYPES:
        device, dtype = head, tail
    else:
        device, dtype = spec, "float32"
    if not device:
        raise InputError(f"--reference '{spec}' needs a device, e.g. cpu:float32 or cuda:0:bfloat16.")
    return device, dtype


@dataclass
class ValidationResult:
    """What a validation concluded and where its report lies."""

    verdict: Verdict
    rungs: dict[str, RungResult]
    out_dir: Path
    report_paths: dict[str, Path] = field(default_factory=dict)
    #: Everything the report shows (environment, adaptations, benchmark, gallery ...), JSON-ready.
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        """0 for PASS/WARN, 1 for FAIL (bad usage never gets here: it raises DifforgeError, exit 2)."""
        from .verdict import Verdict

        return 1 if self.verdict is Verdict.FAIL else 0

    def rung_verdicts(self) -> dict[str, str]:
        return {k: str(r.verdict) for k, r in self.rungs.items()}
