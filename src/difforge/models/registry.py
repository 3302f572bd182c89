"""``--model`` to a folder and family, and each family to its pipeline and probe classes.

The one place the engine and validate ask about families: every answer is a lookup of the family's
:class:`~.family.Family` record (declared in :mod:`.families`, one line each; :func:`register` adds one
at run time), which names its pieces by dotted path, so one family's import cost or failure stays its
own.  Nothing here names a family.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import ModelFamilyError, ModelNotFoundError
from .families import (
    QWEN_EDIT,
    QWEN_EDIT_PLUS,
    URSA,
    detect_family,
    families,
    family_record,
    register,
    task_families,
)
from .family import Family
from .tiny import TINY_MODELS, ensure_tiny
from .trained import TRAINED_MODELS, default_prompt_set, default_prompts, default_source, trained_path

#: Every built-in name: the random-weight tiny models (built on demand) and the trained ones (committed).
BUILT_IN = {**TINY_MODELS, **TRAINED_MODELS}


def resolve_model(model: str, task: str | None = None) -> tuple[Path, str]:
    """Turn ``--model`` (a built-in name or a folder) into (folder, family), building tiny models; the
    trained built-ins are committed folders."""
    if model in TINY_MODELS:
        folder, family = ensure_tiny(model), TINY_MODELS[model]
    elif model in TRAINED_MODELS:
        folder, family = trained_path(model), TRAINED_MODELS[model]
    else:
        folder = Path(model).expanduser()
        if not folder.exists():
            names = ", ".join(BUILT_IN)
            raise ModelNotFoundError(f"Model '{model}' not found: no such folder, and not a built-in name ({names}).")
        if not folder.is_dir():
            raise ModelNotFoundError(f"--model must be a folder, but {folder} is a file.")
        family = detect_family(folder)
    if task is not None and family not in task_families(task):
        want = " or ".join(task_families(task))
        raise ModelFamilyError(f"{model} is a {family} model, but 'difforge {task}' needs a {want} model.")
    return folder, family


def family_of(model: str) -> str:
    """The family of ``--model`` without building or reading anything heavy (built-in names need no build)."""
    return BUILT_IN[model] if model in BUILT_IN else resolve_model(model)[1]


def pipeline_class(family: str) -> Any:
    """The pipeline class of ``family`` (``from_pretrained(folder, backend, dtype, cfg, record, op_overrides)``)."""
    return family_record(family).pipeline_class()


def probe_class(family: str) -> Any:
    """The :class:`~difforge.models.probing.Probe` class validation wraps around a ``family`` pipeline."""
    return family_record(family, "validation probe").probe_class()


def check_speed_names(family: str, disable: list[str], fast: list[str], compile: bool = False) -> None:
    """Refuse ``--disable`` / ``--fast`` names ``family`` does not know, with the family's own InputError
    (the check ``generate``/``edit`` reach at load or run time), before anything loads."""
    family_record(family).check_speed_names(disable, fast, compile)


def same_stream_names(family: str, stream_default: str, disable: list[str], fast: list[str]) -> tuple[list[str], list[str]]:
    """``(disable, fast)`` names that put another side of a comparison (a reference, a floor) on the random
    stream a run with ``disable``/``fast`` draws from on a backend whose default is ``stream_default``
    (``Backend.random_stream``): the family's stream rule (URSA: ``philox-rng`` either way); a family
    without one draws every number from the CPU generator on every device, so it needs none."""
    return family_record(family).same_stream_names(stream_default, disable, fast)


def primary_outputs() -> tuple[str, ...]:
    """The per-step output keys validation compares first, one per registered family's record (no repeats)."""
    return tuple(dict.fromkeys(f.primary_output for f in families()))


def probe_for(pipeline: Any) -> Any:
    """The probe of a loaded pipeline (its ``family`` attribute picks the class)."""
    return probe_class(pipeline.family)(pipeline)


__all__ = ["QWEN_EDIT", "QWEN_EDIT_PLUS", "URSA", "Family", "check_speed_names", "detect_family", "families",
           "family_of", "family_record", "pipeline_class", "primary_outputs", "probe_class", "probe_for", "register",
           "resolve_model", "same_stream_names"]


def prompt_set_for(model: str, n: int) -> Any:
    """The semantic rung's default prompt set for ``--model`` (a :class:`~difforge.shapes.prompts.PromptSet`
    of ``n`` items), or None when the model has none."""
    return default_prompt_set(model, n)


def validation_prompts(model: str) -> list[str] | None:
    """validate's default prompts for ``--model`` when it has its own (the trained models), else None."""
    return default_prompts(model)


def validation_image(model: str) -> Any:
    """validate's input picture for ``--model`` without ``--image`` when it has its own (a PIL image: the
    trained edit model's held-out source), else None (the generic synthetic picture)."""
    return default_source(model)

