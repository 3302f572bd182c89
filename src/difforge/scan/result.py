"""What a scan returns: findings, the files read, the files skipped and why, the time it took.

Plain frozen dataclasses of strings and numbers, so a result crosses process boundaries (the scan
of a large package runs on several cores) and serialises to JSON without a custom encoder.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

#: Bumped when a key of :meth:`ScanResult.to_dict` changes meaning or goes away (adding keys does not).
SCHEMA_VERSION = 1
#: The devices a scan can judge code for (``--target``); CUDA is the source every port starts from.
TARGETS = ("npu", "mps", "xpu", "cpu")
#: Severities, most severe first: error = breaks there, warning = may break or runs slowly,
#: info = worth a look while porting.
SEVERITIES = ("error", "warning", "info")


@dataclass(frozen=True)
class Finding:
    """One place in the source that breaks or is slow on the target, and what to do about it."""

    path: str
    line: int
    col: int
    rule: str
    severity: str
    message: str
    fix: str
    snippet: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Skipped:
    """A file the scan did not read (too large, not UTF-8, not valid Python ...), with the reason."""

    path: str
    reason: str


@dataclass(frozen=True)
class ScanResult:
    """The findings of one scan, sorted by path and line, with what was read and how long it took."""

    target: str
    root: str
    findings: tuple[Finding, ...]
    files: tuple[str, ...]
    skipped: tuple[Skipped, ...] = ()
    elapsed_s: float = 0.0

    def counts(self) -> dict[str, int]:
        """Findings per severity (every severity present, zero included)."""
        out = dict.fromkeys(SEVERITIES, 0)
        for f in self.findings:
            out[f.severity] = out.get(f.severity, 0) + 1
        return out

    def at_least(self, severity: str) -> list[Finding]:
        """Findings of ``severity`` or worse (``--fail-on``)."""
        rank = SEVERITIES.index(severity)
        return [f for f in self.findings if SEVERITIES.index(f.severity) <= rank]

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` document (keys are a contract: see :data:`SCHEMA_VERSION`)."""
        return {
            "schema_version": SCHEMA_VERSION,
            "target": self.target,
            "root": self.root,
            "files_scanned": len(self.files),
            "counts": self.counts(),
            "elapsed_s": round(self.elapsed_s, 3),
            "findings": [f.to_dict() for f in self.findings],
            "files": list(self.files),
            "skipped": [asdict(s) for s in self.skipped],
        }
