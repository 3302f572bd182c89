"""The port report: Markdown, self-contained HTML and JSON renderings of a validation."""

from __future__ import annotations

from .render import build_context, fmt, rung_table, write_report

__all__ = ["build_context", "fmt", "rung_table", "write_report"]
