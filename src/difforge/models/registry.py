"""Which family a checkpoint folder is, and the built-in tiny model names.

The family is read from ``model_index.json``'s ``_class_name``; component classes are keyed on
the class name only (the library/module element is ignored and nothing is ever imported from
the folder).
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import CheckpointError, ModelFamilyError, ModelNotFoundError
from .checkpoint import read_json

URSA = "ursa"
QWEN_EDIT = "qwen-edit"
QWEN_EDIT_PLUS = "qwen-edit-plus"

PIPELINE_CLASSES = {
    "URSAPipeline": URSA,
    "QwenImageEditPipeline": QWEN_EDIT,
    "QwenImageEditPlusPipeline": QWEN_EDIT_PLUS,
}
BUILTIN_MODELS = {
    "tiny-ursa": URSA,
    "tiny-ursa-video": URSA,
    "tiny-qwen-edit": QWEN_EDIT,
    "tiny-qwen-edit-plus": QWEN_EDIT_PLUS,
}
TASK_FAMILIES = {"generate": (URSA,), "edit": (QWEN_EDIT, QWEN_EDIT_PLUS)}


def difforge_home() -> Path:
    """Cache folder for built tiny checkpoints (``DIFFORGE_HOME``, default ``~/.cache/difforge``)."""
    return Path(os.environ.get("DIFFORGE_HOME") or Path.home() / ".cache" / "difforge")


def detect_family(folder: Path) -> str:
    index = folder / "model_index.json"
    if not index.is_file():
        raise ModelFamilyError(f"{folder} has no model_index.json; point --model at a diffusers-style model folder.")
    name = read_json(index).get("_class_name")
    if not isinstance(name, str):  # a list or object here is unhashable: the lookup below would crash
        raise CheckpointError(f"{index} has no string _class_name (found {repr(name)[:60]}); it is not a pipeline index.")
    if name not in PIPELINE_CLASSES:
        known = ", ".join(PIPELINE_CLASSES)
        raise ModelFamilyError(f"{folder} holds a '{name}' model; difforge supports {known}.")
    return PIPELINE_CLASSES[name]


def resolve_model(model: str, task: str | None = None) -> tuple[Path, str]:
    """Turn ``--model`` (a built-in name or a folder) into (folder, family), building tiny models."""
    if model in BUILTIN_MODELS:
        from .tiny import ensure_tiny

        folder, family = ensure_tiny(model), BUILTIN_MODELS[model]
    else:
        folder = Path(model).expanduser()
        if not folder.exists():
            names = ", ".join(BUILTIN_MODELS)
            raise ModelNotFoundError(f"Model '{model}' not found: no such folder, and not a built-in name ({names}).")
        if not folder.is_dir():
            raise ModelNotFoundError(f"--model must be a folder, but {folder} is a file.")
        family = detect_family(folder)
    if task is not None and family not in TASK_FAMILIES[task]:
        want = " or ".join(TASK_FAMILIES[task])
        raise ModelFamilyError(f"{model} is a {family} model, but 'difforge {task}' needs a {want} model.")
    return folder, family
