"""Qwen-Image-Edit's answers to the registry, in the shapes its :class:`~difforge.models.family.Family` record calls.

The speed names are :class:`.loop.SpeedOptions`'s; the family has no stream rule (every number is
drawn from the CPU generator on every device), so its record names none.
"""

from __future__ import annotations

from .loop import SpeedOptions


def check_speed_names(disable: list[str], fast: list[str], compile: bool = False) -> None:
    """``--disable``/``--fast`` names (and their mix with ``--compile``) the family refuses, as its InputError."""
    SpeedOptions.parse(disable, fast, compile)
