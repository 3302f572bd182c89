"""The tiny checkpoints: deterministic bytes, the real layout, the right family."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from safetensors import safe_open

from difforge.models.qwen_edit import apply_processor_shim, build_tiny_qwen_edit
from difforge.models.qwen_edit.compat import torchvision_available
from difforge.models.qwen_edit.folder import check_model_folder
from difforge.models.qwen_edit.settings import SETTINGS_FILE, EditSettings
from difforge.models.registry import QWEN_EDIT, QWEN_EDIT_PLUS, detect_family


def _hashes(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_build_is_byte_deterministic(edit_folder: Path, tmp_path: Path) -> None:
    again = tmp_path / "again"
    build_tiny_qwen_edit(again, plus=False)
    first, second = _hashes(edit_folder), _hashes(again)
    assert first == second
    assert {"model_index.json", "transformer/diffusion_pytorch_model.safetensors", "vae/diffusion_pytorch_model.safetensors",
            "text_encoder/model.safetensors", "processor/tokenizer.json", SETTINGS_FILE} <= set(first)
    for weights in edit_folder.rglob("*.safetensors"):
        with safe_open(str(weights), "pt") as fh:
            assert fh.metadata() == {"format": "pt"}  # nothing time- or host-dependent


def test_family_detection(edit_folder: Path, plus_folder: Path) -> None:
    assert detect_family(edit_folder) == QWEN_EDIT
    assert detect_family(plus_folder) == QWEN_EDIT_PLUS
    assert check_model_folder(edit_folder).pipeline_class == "QwenImageEditPipeline"
    checked = check_model_folder(plus_folder)
    assert checked.pipeline_class == "QwenImageEditPlusPipeline"
    assert checked.weight_bytes["vae"] > checked.weight_bytes["transformer"] > 0
    plus_cfg = json.loads((plus_folder / "transformer" / "config.json").read_text())
    edit_cfg = json.loads((edit_folder / "transformer" / "config.json").read_text())
    assert plus_cfg["zero_cond_t"] is True and edit_cfg["zero_cond_t"] is False  # Plus mimics Edit-2511


def test_tiny_settings_shrink_references(edit_folder: Path, tmp_path: Path) -> None:
    tiny = EditSettings.from_folder(edit_folder)
    assert tiny.reference_area <= 256 * 256 < EditSettings().reference_area == 1024 * 1024
    assert EditSettings.from_folder(tmp_path) == EditSettings()  # real checkpoints: diffusers' areas


def test_processor_shim_is_idempotent() -> None:
    from transformers import Qwen2VLProcessor

    expected = not torchvision_available()  # the shim only acts where torchvision is missing
    assert apply_processor_shim() is expected
    assert apply_processor_shim() is expected
    assert "video_processor" not in Qwen2VLProcessor.get_attributes()
    assert {"image_processor", "tokenizer"} <= set(Qwen2VLProcessor.get_attributes())
