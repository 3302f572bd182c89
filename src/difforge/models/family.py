"""The shape every model family has: one :class:`Family` record is all the registry and validate know of it.

A record names a family's pieces by dotted path (``"package.module:attribute"``) instead of importing
them, so declaring a family costs nothing and one family's heavy imports (torch modules, diffusers) or
import failure stays its own: a piece is imported the first time it is asked for.  The records
themselves are declared in :mod:`difforge.models.families` (one line per family) and looked up through
:mod:`difforge.models.registry`.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from typing import Any

from ..errors import DifforgeError


def load_attribute(path: str) -> Any:
    """The object a dotted ``"package.module:attribute"`` path names (the module imported now, not before)."""
    module, sep, attribute = path.partition(":")
    if not sep or not module or not attribute:
        raise DifforgeError(f"'{path}' is not a 'package.module:attribute' path.")
    return getattr(import_module(module), attribute)


@dataclass(frozen=True)
class Family:
    """What difforge needs to know of a model family, and nothing it has to import to know it.

    ``speed_names`` is called as ``check(disable, fast, compile)`` and raises the family's own
    InputError for a ``--disable``/``--fast`` name it does not know.  ``stream_names`` is called as
    ``rule(stream_default, disable, fast)`` and returns the ``(disable, fast)`` names that put another
    side of a comparison on the random stream such a run draws from; None: the family draws every
    number from the CPU generator on every device, so no side needs any.  ``primary_output`` is the
    per-step output key validation compares first (a velocity, logits ...).
    """

    name: str
    #: ``model_index.json`` ``_class_name`` values of a folder of this family.
    class_names: tuple[str, ...]
    #: The jobs (``generate``, ``edit``) that run it.
    tasks: tuple[str, ...]
    #: The pipeline class: ``from_pretrained(folder, backend, dtype, cfg, record, op_overrides)``.
    pipeline: str
    #: The :class:`~difforge.models.probing.Probe` class validation wraps around a loaded pipeline.
    probe: str
    speed_names: str
    primary_output: str
    stream_names: str | None = None

    def pipeline_class(self) -> Any:
        return load_attribute(self.pipeline)

    def probe_class(self) -> Any:
        return load_attribute(self.probe)

    def check_speed_names(self, disable: list[str], fast: list[str], compile: bool = False) -> None:
        load_attribute(self.speed_names)(disable, fast, compile)

    def same_stream_names(self, stream_default: str, disable: list[str], fast: list[str]) -> tuple[list[str], list[str]]:
        if self.stream_names is None:
            return [], []
        disable_names, fast_names = load_attribute(self.stream_names)(stream_default, disable, fast)
        return list(disable_names), list(fast_names)
