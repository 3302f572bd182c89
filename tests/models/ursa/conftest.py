"""Fixtures: the built-in tiny-ursa checkpoint and pipelines loaded from it (CPU, float32)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from difforge.config import RunConfig
from difforge.devices import CPUBackend
from difforge.models.tiny import ensure_tiny
from difforge.models.ursa import URSAPipeline
from difforge.runtime.record import RunRecord


@pytest.fixture(scope="session")
def tiny_ursa() -> Path:
    return ensure_tiny("tiny-ursa")


def load(folder: Path, dtype: torch.dtype = torch.float32, **overrides) -> tuple[URSAPipeline, RunRecord]:
    record = RunRecord("generate")
    pipe = URSAPipeline.from_pretrained(folder, CPUBackend(), dtype, RunConfig(model=str(folder)), record, **overrides)
    return pipe, record


@pytest.fixture(scope="session")
def tiny_pipe(tiny_ursa: Path) -> URSAPipeline:
    return load(tiny_ursa)[0]


@pytest.fixture(scope="session")
def mixture_folder(tiny_ursa: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny-ursa with ``alpha: null``: the reference's mixture (uniform-noise) path."""
    folder = tmp_path_factory.mktemp("mix") / "tiny-ursa-mix"
    shutil.copytree(tiny_ursa, folder)
    path = folder / "scheduler" / "scheduler_config.json"
    data = json.loads(path.read_text())
    data.update(alpha=None, c=None)
    path.write_text(json.dumps(data))
    return folder


@pytest.fixture
def copy_tiny(tiny_ursa: Path, tmp_path: Path):
    """A writable copy of tiny-ursa, for tests that break it."""

    def make() -> Path:
        dst = tmp_path / "tiny-ursa"
        shutil.copytree(tiny_ursa, dst)
        return dst

    return make
