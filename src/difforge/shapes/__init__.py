"""The shapes world, its rule-based checker and prompt sets.

A procedural world of flat shapes on flat backgrounds (:mod:`.world`), a checker that reads a picture
back by colour segmentation and image moments (:mod:`.checker`), and the prompt-set file format a
semantic validation rung scores (:mod:`.prompts`).  numpy and PIL only: no torch, no learned weights,
no network, so the checker judges a model without depending on anything a port could break.

The common names are re-exported lazily (so ``python -m difforge.shapes.checker`` does not import the
module twice); docs/shapes.md describes them.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "world": (
        "COLOURS", "EDIT_KINDS", "HELDOUT_COMBOS", "PALETTE", "POSITIONS", "SHAPES", "VOCAB", "Edit", "Item",
        "Scene", "caption", "edits", "parse_caption", "render", "sample_edit", "sample_scene", "scenes",
    ),
    "checker": (
        "Analysis", "Expectation", "ExpectedItem", "Found", "Score", "analyse", "edit_expectation",
        "score_caption", "score_edit",
    ),
    "prompts": (
        "PromptItem", "PromptSet", "heldout_caption_set", "heldout_edit_set", "load_prompt_set", "score",
        "write_prompt_set",
    ),
}
_MODULE_OF = {name: module for module, names in _WHERE.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'difforge.shapes' has no attribute {name!r}")
    return getattr(importlib.import_module(f"difforge.shapes.{module}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
