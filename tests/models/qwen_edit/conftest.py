"""Tiny Qwen-Image-Edit checkpoints built once per test session, and small run helpers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from difforge.config import RunConfig
from difforge.devices import CPUBackend
from difforge.models.qwen_edit import QwenEditPipeline, build_tiny_qwen_edit
from difforge.models.qwen_edit.probe import QwenEditProbe
from difforge.runtime.images import test_picture
from difforge.runtime.record import RunRecord


@pytest.fixture(scope="session")
def edit_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny") / "qwen-edit"
    build_tiny_qwen_edit(folder, plus=False)
    return folder


@pytest.fixture(scope="session")
def plus_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny") / "qwen-edit-plus"
    build_tiny_qwen_edit(folder, plus=True)
    return folder


def make_cfg(folder: Path, **kw) -> RunConfig:
    base = {"prompt": "make the sky red", "steps": 2, "seed": 0, "height": 64, "width": 64, "quiet": True}
    base.update(kw)
    return RunConfig(model=str(folder), **base)


def load(folder: Path, cfg: RunConfig, dtype: torch.dtype = torch.float32, overrides=None) -> tuple[QwenEditPipeline, RunRecord]:
    record = RunRecord("edit")
    return QwenEditPipeline.from_pretrained(folder, CPUBackend(), dtype, cfg, record, op_overrides=overrides), record


def probe(qe: QwenEditPipeline) -> QwenEditProbe:
    """The validation hooks of ``qe`` (forward_step, components, FLOPs, operators)."""
    return QwenEditProbe(qe)


def card(width: int = 96, height: int = 64, flip: bool = False):
    img = test_picture(width, height)
    return img.transpose(0) if flip else img


def pixels(image) -> np.ndarray:
    return np.asarray(image).astype(np.float64) / 255.0
