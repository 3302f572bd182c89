"""Shared test set-up: an isolated DIFFORGE_HOME (tiny models built once per session) and quiet runs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

# Tiny checkpoints are deterministic, so every worker may share one cache; `make test` points it
# at the repo's .difforge-home.  Direct pytest runs get one too.
os.environ.setdefault("DIFFORGE_HOME", str(Path(__file__).resolve().parent.parent / ".difforge-home"))
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


@pytest.fixture
def tmp_out(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    out.mkdir()
    return out
