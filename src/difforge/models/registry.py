"""``--model`` to a folder and family, and each family to its pipeline and probe classes.

The one place that knows every family: it sits above the family packages (importing each lazily, so
one family's import cost or failure stays its own) and below the engine and validate, which ask it
instead of naming a family themselves.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import DifforgeError, ModelFamilyError, ModelNotFoundError
from .families import QWEN_EDIT, QWEN_EDIT_PLUS, TASK_FAMILIES, URSA, detect_family
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
    if task is not None and family not in TASK_FAMILIES[task]:
        want = " or ".join(TASK_FAMILIES[task])
        raise ModelFamilyError(f"{model} is a {family} model, but 'difforge {task}' needs a {want} model.")
    return folder, family


def family_of(model: str) -> str:
    """The family of ``--model`` without building or reading anything heavy (built-in names need no build)."""
    return BUILT_IN[model] if model in BUILT_IN else resolve_model(model)[1]


def pipeline_class(family: str) -> Any:
    """The pipeline class of ``family`` (``from_pretrained(folder, backend, dtype, cfg, record, op_overrides)``)."""
    if family == URSA:
        from .ursa import URSAPipeline

        return URSAPipeline
    if family in (QWEN_EDIT, QWEN_EDIT_PLUS):
        from .qwen_edit import QwenEditPipeline

        return QwenEditPipeline
    raise DifforgeError(f"No pipeline for model family '{family}'.")


def probe_class(family: str) -> Any:
    """The :class:`~difforge.models.probing.Probe` class validation wraps around a ``family`` pipeline."""
    if family == URSA:
        from .ursa.probe import URSAProbe

        return URSAProbe
    if family in (QWEN_EDIT, QWEN_EDIT_PLUS):
        from .qwen_edit.probe import QwenEditProbe

        return QwenEditProbe
    raise DifforgeError(f"No validation probe for model family '{family}'.")


def check_speed_names(family: str, disable: list[str], fast: list[str], compile: bool = False) -> None:
    """Refuse ``--disable`` / ``--fast`` names ``family`` does not know, with the family's own InputError
    (the check ``generate``/``edit`` reach at load or run time), before anything loads."""
    if family == URSA:
        from .ursa.call import check_optimisation_names

        check_optimisation_names(disable, fast)
    elif family in (QWEN_EDIT, QWEN_EDIT_PLUS):
        from .qwen_edit.loop import SpeedOptions

        SpeedOptions.parse(disable, fast, compile)
    else:
        raise DifforgeError(f"No pipeline for model family '{family}'.")


def same_stream_names(family: str, stream_default: str, disable: list[str], fast: list[str]) -> tuple[list[str], list[str]]:
    """``(disable, fast)`` names that put another side of a comparison (a reference, a floor) on the random
    stream a run with ``disable``/``fast`` draws from on a backend whose default is ``stream_default``
    (``Backend.random_stream``).  URSA: ``philox-rng`` either way; other families draw every number from
    the CPU generator on every device, so they need none."""
    if family != URSA:
        return [], []
    from .ursa.call import PHILOX_RNG, random_stream

    if random_stream(stream_default, disable, fast) == "philox":
        return [], [PHILOX_RNG]
    return [PHILOX_RNG], []


def probe_for(pipeline: Any) -> Any:
    """The probe of a loaded pipeline (its ``family`` attribute picks the class)."""
    return probe_class(pipeline.family)(pipeline)


__all__ = ["QWEN_EDIT", "QWEN_EDIT_PLUS", "URSA", "check_speed_names", "detect_family", "family_of", "pipeline_class",
           "probe_class", "probe_for", "resolve_model", "same_stream_names"]


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

