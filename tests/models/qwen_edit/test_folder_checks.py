"""A broken model folder gives one sentence naming the file, before diffusers sees it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from difforge.errors import CheckpointError, ModelFamilyError
from difforge.models.qwen_edit.folder import check_model_folder

from .conftest import load, make_cfg


@pytest.fixture
def copy(edit_folder: Path, tmp_path: Path) -> Path:
    target = tmp_path / "model"
    shutil.copytree(edit_folder, target)
    return target


def _one_sentence(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert "\n" not in text and "Traceback" not in text
    return text


def test_truncated_weights_name_the_file(copy: Path) -> None:
    weights = copy / "vae" / "diffusion_pytorch_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    with pytest.raises(CheckpointError, match="truncated") as err:
        load(copy, make_cfg(copy))
    assert str(weights) in _one_sentence(err)


def test_missing_shard_and_missing_component(copy: Path) -> None:
    te = copy / "text_encoder"
    (te / "model.safetensors").rename(te / "model-00001-of-00002.safetensors")
    (te / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    with pytest.raises(CheckpointError, match="Missing shard .*model-00002-of-00002.safetensors") as err:
        check_model_folder(copy)
    _one_sentence(err)
    shutil.rmtree(copy / "tokenizer")
    (te / "model.safetensors.index.json").unlink()
    (te / "model-00001-of-00002.safetensors").rename(te / "model.safetensors")
    with pytest.raises(CheckpointError, match="Missing component folder .*tokenizer"):
        check_model_folder(copy)


def test_pickle_only_and_corrupt_header(copy: Path) -> None:
    weights = copy / "transformer" / "diffusion_pytorch_model.safetensors"
    weights.rename(copy / "transformer" / "diffusion_pytorch_model.bin")
    with pytest.raises(CheckpointError, match="pickle"):
        check_model_folder(copy)
    (copy / "transformer" / "diffusion_pytorch_model.bin").unlink()
    weights.write_bytes(b"\xff" * 64)
    with pytest.raises(CheckpointError, match="not a valid safetensors"):
        check_model_folder(copy)
    # A transformer given as a single file does not need the folder's weights, only its config.
    assert "transformer" not in check_model_folder(copy, skip_weights=frozenset({"transformer"})).weight_bytes


def test_foreign_component_classes_and_family(copy: Path) -> None:
    index = json.loads((copy / "model_index.json").read_text())
    index["vae"] = ["my_module", "MyVAE"]  # would make diffusers import code from the folder
    (copy / "model_index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="lists vae as"):
        check_model_folder(copy)
    index["_class_name"] = "StableDiffusionPipeline"
    (copy / "model_index.json").write_text(json.dumps(index))
    with pytest.raises(ModelFamilyError):
        check_model_folder(copy)
