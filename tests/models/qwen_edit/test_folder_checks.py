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


def _edit_config(path: Path, change) -> None:
    config = json.loads(path.read_text())
    change(config)
    path.write_text(json.dumps(config))


@pytest.mark.parametrize("layers, words", [(1, "unexpected weight 'transformer_blocks.1."),
                                           (3, "lacks weight 'transformer_blocks.2.")])
def test_transformer_weights_must_match_its_config(copy: Path, layers: int, words: str) -> None:
    """diffusers drops extra weights silently and leaves missing ones on the meta device; both are refused."""
    _edit_config(copy / "transformer" / "config.json", lambda c: c.update(num_layers=layers))
    with pytest.raises(CheckpointError, match=words) as err:
        load(copy, make_cfg(copy))
    assert str(copy / "transformer") in _one_sentence(err)


def test_vae_and_text_encoder_weights_must_match_their_configs(copy: Path) -> None:
    from safetensors.torch import load_file, save_file

    vae = copy / "vae" / "diffusion_pytorch_model.safetensors"
    state = load_file(str(vae))
    save_file({k: v for k, v in state.items() if k != "decoder.conv_out.bias"}, str(vae))
    with pytest.raises(CheckpointError, match="vae lacks weight 'decoder.conv_out.bias' [(]1 missing[)]") as err:
        load(copy, make_cfg(copy))
    _one_sentence(err)
    save_file({**state, "decoder.extra.weight": state["decoder.conv_out.bias"].clone()}, str(vae))
    with pytest.raises(CheckpointError, match="vae has unexpected weight 'decoder.extra.weight'"):
        load(copy, make_cfg(copy))
    save_file(state, str(vae))

    def fewer_vision_blocks(c: dict) -> None:
        c["vision_config"]["depth"] = 1

    _edit_config(copy / "text_encoder" / "config.json", fewer_vision_blocks)
    with pytest.raises(CheckpointError, match=r"text_encoder has unexpected weight '.*blocks\.1\.") as err:
        load(copy, make_cfg(copy))
    _one_sentence(err)

    def more_text_layers(c: dict) -> None:
        c["vision_config"]["depth"] = 2
        c["text_config"].update(num_hidden_layers=3, layer_types=["full_attention"] * 3)

    _edit_config(copy / "text_encoder" / "config.json", more_text_layers)
    with pytest.raises(CheckpointError, match=r"text_encoder lacks weight '.*layers\.2\.") as err:
        load(copy, make_cfg(copy))
    _one_sentence(err)
