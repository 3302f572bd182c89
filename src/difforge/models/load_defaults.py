"""Defaults for a bare ``Pipeline.from_pretrained(path)`` call, and the preamble every family's one shares.

difforge's own callers pass the backend, dtype, config and record explicitly; a user calling a
family pipeline diffusers-style passes only the folder, and gets the auto device and a float32
CPU reference (or the accelerator's preferred dtype).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, NamedTuple

import torch

from ..config import RunConfig
from ..devices import Backend, get_backend
from ..runtime.record import RunRecord


def load_defaults(
    folder: Path,
    kind: str,
    backend: Backend | None,
    dtype: torch.dtype | None,
    cfg: RunConfig | None,
    record: RunRecord | None,
) -> tuple[Backend, torch.dtype, RunConfig, RunRecord]:
    backend = backend if backend is not None else get_backend("auto")
    if dtype is None:
        dtype = backend.preferred_dtype()  # the backend's policy: float32 on the CPU
    cfg = cfg if cfg is not None else RunConfig(model=str(folder))
    record = record if record is not None else RunRecord(kind=kind)
    return backend, dtype, cfg, record


class LoadInputs(NamedTuple):
    """What every family's ``from_pretrained`` loads with, defaults filled in: the one preamble they share.

    Unpacks as ``folder, backend, dtype, cfg, record``; :meth:`phase` is the load's timed RunRecord phase.
    """

    folder: Path
    backend: Backend
    dtype: torch.dtype
    cfg: RunConfig
    record: RunRecord

    def phase(self) -> AbstractContextManager[Any]:
        """The ``load`` phase of the record, timed on the backend."""
        return self.record.phase("load", self.backend)


def load_inputs(
    folder: str | Path,
    kind: str,
    backend: Backend | None,
    dtype: torch.dtype | None,
    cfg: RunConfig | None,
    record: RunRecord | None,
) -> LoadInputs:
    """``from_pretrained``'s arguments as one family pipeline loads them (``kind``: the RunRecord's job,
    ``generate``/``edit``): the folder as a Path and :func:`load_defaults` for what the caller left out."""
    folder = Path(folder)
    return LoadInputs(folder, *load_defaults(folder, kind, backend, dtype, cfg, record))
