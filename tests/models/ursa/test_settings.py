"""A folder's ``difforge.json`` gives URSA runs without --height/--width their size (the shapes models: 64 x 64)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from difforge.config import RunConfig
from difforge.errors import CheckpointError
from difforge.models.checkpoint import SETTINGS_FILE
from difforge.models.ursa.call import DEFAULT_HEIGHT, DEFAULT_WIDTH
from difforge.models.ursa.loader import URSACheckpoint, default_size

from .conftest import load


def _copy(tiny_ursa: Path, tmp_path: Path, settings: dict | None) -> Path:
    folder = tmp_path / "m"
    shutil.copytree(tiny_ursa, folder)
    if settings is not None:
        (folder / SETTINGS_FILE).write_text(json.dumps(settings), encoding="utf-8")
    return folder


def test_no_file_keeps_ursas_own_default(tiny_ursa: Path) -> None:
    assert not (tiny_ursa / SETTINGS_FILE).exists()
    assert URSACheckpoint.read_configs(tiny_ursa).default_size == (DEFAULT_HEIGHT, DEFAULT_WIDTH) == (320, 512)


def test_folder_default_size_sets_the_token_grid(tiny_ursa: Path, tmp_path: Path) -> None:
    folder = _copy(tiny_ursa, tmp_path, {"default_height": 64, "default_width": 96, "other": "ignored"})
    pipe, _ = load(folder)
    stride = pipe.spatial_stride
    assert pipe.latent_shape(RunConfig(model=str(folder))) == (1, 64 // stride, 96 // stride)
    # an explicit size still wins over the folder's default
    assert pipe.latent_shape(RunConfig(model=str(folder), height=32, width=32)) == (1, 32 // stride, 32 // stride)


@pytest.mark.parametrize("value", [0, -16, 63, 1.5, "64", True, 16384])
def test_bad_default_size_is_one_checkpoint_error(tiny_ursa: Path, tmp_path: Path, value: object) -> None:
    folder = _copy(tiny_ursa, tmp_path, {"default_height": value})
    with pytest.raises(CheckpointError, match="default_height"):
        default_size(folder, 16)
