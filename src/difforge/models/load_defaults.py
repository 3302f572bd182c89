"""Defaults for a bare ``Pipeline.from_pretrained(path)`` call, shared by every family.

difforge's own callers pass the backend, dtype, config and record explicitly; a user calling a
family pipeline diffusers-style passes only the folder, and gets the auto device and a float32
CPU reference (or the accelerator's preferred dtype).
"""

from __future__ import annotations

from pathlib import Path

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
