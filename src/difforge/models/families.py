"""The model families difforge runs (one :class:`~.family.Family` record each), and which one a folder holds.

One name per family, shared by the registry, the pipelines and the probes.  ``FAMILIES`` is the one
list of records: adding a family is one package plus one line there (``docs/architecture.md``, "Adding
a family"); :func:`register` adds one at run time (a test's toy family) and hands back its undo.  The
family of a folder is read from ``model_index.json``'s ``_class_name``; the library/module element is
ignored and nothing is ever imported from the folder.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from ..errors import CheckpointError, DifforgeError, ModelFamilyError
from .checkpoint import read_json
from .family import Family

URSA = "ursa"
QWEN_EDIT = "qwen-edit"
QWEN_EDIT_PLUS = "qwen-edit-plus"

_URSA_RULES = "difforge.models.ursa.family_rules"
_QWEN_RULES = "difforge.models.qwen_edit.family_rules"
_QWEN_PIPELINE, _QWEN_PROBE = "difforge.models.qwen_edit:QwenEditPipeline", "difforge.models.qwen_edit.probe:QwenEditProbe"

#: Every built-in family, one line each (the order is the order of the names an unknown folder is told).
FAMILIES: tuple[Family, ...] = (
    Family(URSA, ("URSAPipeline",), ("generate",), "difforge.models.ursa:URSAPipeline",
           "difforge.models.ursa.probe:URSAProbe", f"{_URSA_RULES}:check_speed_names", "logits",
           stream_names=f"{_URSA_RULES}:same_stream_names"),
    Family(QWEN_EDIT, ("QwenImageEditPipeline",), ("edit",), _QWEN_PIPELINE, _QWEN_PROBE,
           f"{_QWEN_RULES}:check_speed_names", "noise_pred"),
    Family(QWEN_EDIT_PLUS, ("QwenImageEditPlusPipeline",), ("edit",), _QWEN_PIPELINE, _QWEN_PROBE,
           f"{_QWEN_RULES}:check_speed_names", "noise_pred"),
)

_known: dict[str, Family] = {f.name: f for f in FAMILIES}


def register(family: Family) -> Callable[[], None]:
    """Add ``family`` for this process (its name and folder class names must be new); returns the undo."""
    taken = [n for n in family.class_names if n in class_names()]
    if family.name in _known or taken:
        raise DifforgeError(f"Model family '{family.name}' ({', '.join(family.class_names)}) is already registered.")
    _known[family.name] = family

    def undo() -> None:
        _known.pop(family.name, None)

    return undo


def family_record(name: str, what: str = "pipeline") -> Family:
    """The record of family ``name``; an unknown name is one DifforgeError line (``what`` it was wanted for)."""
    try:
        return _known[name]
    except (KeyError, TypeError):
        raise DifforgeError(f"No {what} for model family '{name}'.") from None


def families() -> tuple[Family, ...]:
    """Every registered family, built-ins first."""
    return tuple(_known.values())


def class_names() -> dict[str, str]:
    """``model_index.json`` ``_class_name`` -> family, over every registered family."""
    return {cls: f.name for f in _known.values() for cls in f.class_names}


def task_families(task: str) -> tuple[str, ...]:
    """The families a job (``generate``, ``edit``) accepts."""
    return tuple(f.name for f in _known.values() if task in f.tasks)


def detect_family(folder: Path) -> str:
    index = folder / "model_index.json"
    if not os.path.lexists(index):
        raise ModelFamilyError(f"{folder} has no model_index.json; point --model at a diffusers-style model folder.")
    name = read_json(index, root=folder).get("_class_name")
    if not isinstance(name, str):  # a list or object here is unhashable: the lookup below would crash
        raise CheckpointError(f"{index} has no string _class_name (found {repr(name)[:60]}); it is not a pipeline index.")
    known = class_names()
    if name not in known:
        raise ModelFamilyError(f"{folder} holds a '{name}' model; difforge supports {', '.join(known)}.")
    return known[name]
