"""Small readers of a list of findings."""

from __future__ import annotations

from difforge.scan import Finding


def rules(findings: list[Finding]) -> list[str]:
    return [f.rule for f in findings]


def lines(findings: list[Finding], rule: str) -> list[int]:
    return [f.line for f in findings if f.rule == rule]


def severity(findings: list[Finding], rule: str) -> list[str]:
    return [f.severity for f in findings if f.rule == rule]
