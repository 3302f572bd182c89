"""URSA's answers to the registry, in the shapes its :class:`~difforge.models.family.Family` record calls.

The speed-name check and the stream rule themselves live in :mod:`.call` (with the switches they
judge); this module only gives them the record's uniform signatures, so the registry never names URSA.
"""

from __future__ import annotations

from ...devices import PHILOX_STREAM
from .call import PHILOX_RNG, check_optimisation_names, random_stream


def check_speed_names(disable: list[str], fast: list[str], compile: bool = False) -> None:
    """``--disable``/``--fast`` names URSA does not know are its InputError (``--compile`` is no name here)."""
    check_optimisation_names(disable, fast)


def same_stream_names(stream_default: str, disable: list[str], fast: list[str]) -> tuple[list[str], list[str]]:
    """``philox-rng`` on the side it belongs: ``--fast`` when a run draws from the Philox stream (on a
    backend whose default is ``stream_default``), ``--disable`` when it draws from the reference's."""
    if random_stream(stream_default, disable, fast) == PHILOX_STREAM:
        return [], [PHILOX_RNG]
    return [PHILOX_RNG], []
