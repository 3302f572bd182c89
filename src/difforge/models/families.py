"""The model families difforge runs, and which family a checkpoint folder holds.

One name per family, shared by the registry, the pipelines and the probes.  The family is read from
``model_index.json``'s ``_class_name``; the library/module element is ignored and nothing is ever
imported from the folder.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import CheckpointError, ModelFamilyError
from .checkpoint import read_json

URSA = "ursa"
QWEN_EDIT = "qwen-edit"
QWEN_EDIT_PLUS = "qwen-edit-plus"
#: Which families each job accepts.
TASK_FAMILIES = {"generate": (URSA,), "edit": (QWEN_EDIT, QWEN_EDIT_PLUS)}
#: ``model_index.json`` ``_class_name`` -> family.
PIPELINE_CLASSES = {
    "URSAPipeline": URSA,
    "QwenImageEditPipeline": QWEN_EDIT,
    "QwenImageEditPlusPipeline": QWEN_EDIT_PLUS,
}


def detect_family(folder: Path) -> str:
    index = folder / "model_index.json"
    if not os.path.lexists(index):
        raise ModelFamilyError(f"{folder} has no model_index.json; point --model at a diffusers-style model folder.")
    name = read_json(index, root=folder).get("_class_name")
    if not isinstance(name, str):  # a list or object here is unhashable: the lookup below would crash
        raise CheckpointError(f"{index} has no string _class_name (found {repr(name)[:60]}); it is not a pipeline index.")
    if name not in PIPELINE_CLASSES:
        known = ", ".join(PIPELINE_CLASSES)
        raise ModelFamilyError(f"{folder} holds a '{name}' model; difforge supports {known}.")
    return PIPELINE_CLASSES[name]
