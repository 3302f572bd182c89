"""Safe, strict reading of checkpoint folders.

Only ``.safetensors`` (and, for URSA's scheduler, a statically parsed ``.pth``) are read from a
model folder.  Nothing in a folder is imported or executed.  Every problem becomes one
:class:`~difforge.errors.CheckpointError` sentence naming the file.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from ..errors import CheckpointError

WEIGHTS_NAME = "diffusion_pytorch_model"


def read_json(path: Path) -> dict[str, Any]:
    """Read a JSON config, turning every failure into one CheckpointError line."""
    if not path.is_file():
        raise CheckpointError(f"Missing file {path}.")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path} is not valid JSON ({exc.__class__.__name__}).") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} must hold a JSON object.")
    return data


def check_safetensors_header(path: Path) -> dict[str, Any]:
    """Validate a safetensors file's header and length without reading its tensors.

    Catches truncated downloads (data shorter than the header promises) before torch sees them.
    """
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise ValueError("file shorter than its 8-byte header length")
            (n,) = struct.unpack("<Q", head)
            if n > size - 8 or n > 100_000_000:
                raise ValueError("header length exceeds file size")
            header = json.loads(fh.read(n))
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path} is not a valid safetensors file ({exc}).") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path} is not a valid safetensors file (its header is not a JSON object).")
    end = 0
    for key, meta in header.items():
        if key == "__metadata__":
            continue
        try:
            end = max(end, int(meta["data_offsets"][1]))
        except (KeyError, TypeError, IndexError, ValueError):
            raise CheckpointError(f"{path} has a malformed entry '{key}' in its header.") from None
    if 8 + n + end > size:
        raise CheckpointError(
            f"{path} is truncated ({size} bytes, header promises {8 + n + end}); download it again."
        )
    return header


def load_safetensors(path: Path, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Load one safetensors file with clear errors for missing / corrupt / truncated files."""
    if not path.is_file():
        raise CheckpointError(f"Missing weights file {path}.")
    check_safetensors_header(path)
    try:
        return load_file(str(path), device=str(device))
    except Exception as exc:  # safetensors raises SafetensorError / OSError for corrupt bodies
        raise CheckpointError(f"{path} could not be read as safetensors ({exc}).") from None


def weight_files(folder: Path, name: str = WEIGHTS_NAME) -> list[Path]:
    """The safetensors files of a component folder: one file, or every shard of an index."""
    single = folder / f"{name}.safetensors"
    index = folder / f"{name}.safetensors.index.json"
    if single.is_file():
        return [single]
    if index.is_file():
        data = read_json(index)
        weight_map = data.get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{index} has no weight_map.")
        shards = sorted(set(weight_map.values()))
        missing = [s for s in shards if not (folder / s).is_file()]
        if missing:
            raise CheckpointError(f"Missing shard {folder / missing[0]} listed in {index.name}.")
        return [folder / s for s in shards]
    if list(folder.glob("*.bin")) or list(folder.glob("*.pt")) or list(folder.glob("*.ckpt")):
        raise CheckpointError(
            f"{folder} holds only pickle weights (.bin/.pt/.ckpt); difforge reads safetensors only - convert them first."
        )
    raise CheckpointError(f"No {name}.safetensors (or shard index) in {folder}.")


def load_component_state_dict(
    folder: Path, name: str = WEIGHTS_NAME, device: str | torch.device = "cpu"
) -> dict[str, torch.Tensor]:
    """Merge all weight files of a component folder into one state dict."""
    state: dict[str, torch.Tensor] = {}
    for path in weight_files(folder, name):
        state.update(load_safetensors(path, device=device))
    return state


def safetensors_keys(path: Path) -> list[str]:
    check_safetensors_header(path)
    with safe_open(str(path), framework="pt") as fh:
        return list(fh.keys())
