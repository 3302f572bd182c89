"""tiny-ursa: deterministic bytes and the official layout."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from difforge.models.registry import detect_family
from difforge.models.ursa.tiny import build_tiny_ursa


def digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_build_twice_gives_identical_bytes(tmp_path: Path, tiny_ursa: Path) -> None:
    build_tiny_ursa(tmp_path / "a")
    assert digest(tmp_path / "a") == digest(tiny_ursa)


def test_official_layout(tiny_ursa: Path) -> None:
    files = set(digest(tiny_ursa))
    assert {"model_index.json", "transformer/config.json", "transformer/diffusion_pytorch_model.safetensors",
            "vae/config.json", "vae/diffusion_pytorch_model.safetensors", "scheduler/scheduler_config.json",
            "scheduler/scheduler_model.pth", "tokenizer/tokenizer.json", "tokenizer/tokenizer_config.json"} <= files
    index = json.loads((tiny_ursa / "model_index.json").read_text())
    assert index["transformer"] == ["__transformer__", "URSATransformer3DModel"]
    assert detect_family(tiny_ursa) == "ursa"
    tcfg = json.loads((tiny_ursa / "transformer" / "config.json").read_text())
    assert "head_dim" not in tcfg  # the reference would ignore it; the weights use 128
    assert tcfg["vocab_size"] - tcfg["lm_vocab_size"] == tcfg["lm_head_size"]
