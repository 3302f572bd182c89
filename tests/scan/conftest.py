"""Helpers for the scan tests: write a snippet to a file under tmp_path and scan it."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from difforge.scan import Finding, scan


@pytest.fixture
def run(tmp_path: Path) -> Callable[..., list[Finding]]:
    """``run(code, target="npu")``: the findings of ``code`` (dedented) saved as a module."""
    counter = iter(range(10_000))

    def scan_snippet(code: str, target: str = "npu") -> list[Finding]:
        path = tmp_path / f"snippet_{next(counter)}.py"
        path.write_text(textwrap.dedent(code), encoding="utf-8")
        result = scan(path, target)
        assert not result.skipped, result.skipped
        return list(result.findings)

    return scan_snippet

