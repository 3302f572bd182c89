"""What a scan returns: findings, the files read, the files skipped and why, the time it took.

Plain frozen dataclasses of strings and numbers, so a result crosses process boundaries (the scan
of a large package runs on several cores) and serialises to JSON without a custom encoder.
"""

from __future__ import annotations

import unicodedata
from dataclasses import asdict, dataclass
from typing import Any

#: Bumped when a key of :meth:`ScanResult.to_dict` changes meaning or goes away (adding keys does not).
SCHEMA_VERSION = 1
#: The devices a scan can judge code for (``--target``); CUDA is the source every port starts from.
TARGETS = ("npu", "mps", "xpu", "cpu")
#: Severities, most severe first: error = breaks there, warning = may break or runs slowly,
#: info = worth a look while porting.
SEVERITIES = ("error", "warning", "info")


#: Format characters that reorder or hide text on a terminal (bidi overrides and isolates, zero-width joiners).
_HIDING = frozenset("\u200b\u200c\u200d\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\ufeff")


def printable(text: object) -> str:
    """``text`` with every control character written as an escape (``\\x1b``, ``\\n``, ``\\u202e``).

    Why: scan prints names it did not choose - file names, folder names, a module name typed by the
    user - and a name holding ``ESC [ 2 J`` or a bidi override would otherwise drive the terminal
    (clear it, recolour it, reorder a line) instead of being shown.  Printable text is unchanged.
    """
    out = []
    for ch in str(text):
        if ch in _HIDING or unicodedata.category(ch) in ("Cc", "Cs"):
            out.append(ch.encode("unicode_escape", "backslashreplace").decode("ascii"))
        else:
            out.append(ch)
    return "".join(out)


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
    #: Files read because the scanned code imports them from its own package (also in ``files``).
    followed: tuple[str, ...] = ()
    #: How far imports were followed, or why they were not (always said: a silent stop reads as all-clear).
    follow_note: str = ""

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
            "followed_imports": {"files": list(self.followed), "note": self.follow_note},
        }
