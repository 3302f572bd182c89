"""Check a Qwen-Image-Edit model folder before diffusers sees it.

diffusers and transformers report a missing shard or a truncated download as a long traceback
from deep inside their loaders (or, for some components, not at all until the first forward).
Here every component the pipeline needs is checked up front: its folder, its config, and the
header and length of each safetensors file, so a broken checkpoint becomes one sentence naming
the file.  Only the component classes the edit pipelines use are accepted, so nothing named in a
downloaded ``model_index.json`` can make diffusers import code from the folder; and no config of
the folder may carry an ``auto_map`` or name a class its library does not ship, so transformers'
Auto classes cannot be talked into importing a ``.py`` beside a processor or tokenizer config.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...errors import CheckpointError
from ..checkpoint import (
    WEIGHTS_NAME,
    check_component_folder,
    check_safetensors_header,
    check_tree,
    config_class_names,
    config_files,
    read_json,
    weight_files,
)
from ..families import detect_family
from .configs import check_config_values
from .fp8 import FLOAT_HEADER_DTYPES

#: component -> (library, class) exactly as the official model_index.json files spell them.
COMPONENTS: dict[str, tuple[str, str]] = {
    "processor": ("transformers", "Qwen2VLProcessor"),
    "scheduler": ("diffusers", "FlowMatchEulerDiscreteScheduler"),
    "text_encoder": ("transformers", "Qwen2_5_VLForConditionalGeneration"),
    "tokenizer": ("transformers", "Qwen2Tokenizer"),
    "transformer": ("diffusers", "QwenImageTransformer2DModel"),
    "vae": ("diffusers", "AutoencoderKLQwenImage"),
}
#: component -> (config file, weights base name or None when it has no weights)
_FILES: dict[str, tuple[str | None, str | None]] = {
    "processor": (None, None),
    "scheduler": ("scheduler_config.json", None),
    "text_encoder": ("config.json", "model"),
    "tokenizer": ("tokenizer_config.json", None),
    "transformer": ("config.json", WEIGHTS_NAME),
    "vae": ("config.json", WEIGHTS_NAME),
}


@dataclass(frozen=True)
class CheckedFolder:
    """A folder that passed :func:`check_model_folder`, with what was learnt on the way."""

    path: Path
    family: str  # families.QWEN_EDIT or families.QWEN_EDIT_PLUS
    pipeline_class: str
    weight_bytes: dict[str, int]  # component -> bytes of its safetensors files


def check_model_folder(folder: Path, skip_weights: frozenset[str] = frozenset()) -> CheckedFolder:
    """Validate ``folder`` for a Qwen edit pipeline; ``skip_weights`` names components supplied elsewhere."""
    folder = Path(folder)
    check_tree(folder)  # every file any library will open: inside the folder, regular, not over its cap
    family = detect_family(folder)
    check_configs(folder)
    check_config_values(folder)
    index = read_json(folder / "model_index.json", root=folder)
    sizes: dict[str, int] = {}
    for name, expected in COMPONENTS.items():
        entry = index.get(name)
        if not (isinstance(entry, list) and len(entry) == 2 and tuple(entry) == expected):
            raise CheckpointError(
                f"{folder / 'model_index.json'} lists {name} as {entry!r}; difforge only loads {list(expected)} there."
            )
        sub = folder / name
        check_component_folder(sub, "; the checkpoint download is incomplete")
        config_name, weights_name = _FILES[name]
        if config_name is not None:
            read_json(sub / config_name, root=folder)
        if weights_name is None or name in skip_weights:
            continue
        total = 0
        for path in weight_files(sub, weights_name):
            _check_float_weights(path, check_safetensors_header(path))
            total += path.stat().st_size
        sizes[name] = total
    check_processor_files(folder / "processor")
    return CheckedFolder(folder, family, str(index["_class_name"]), sizes)


#: The published processor/ folder's video processor config (see :func:`check_processor_files`).
VIDEO_PROCESSOR_FILE = "video_preprocessor_config.json"


def processor_builds_video() -> bool:
    """Whether transformers will build ``Qwen2VLProcessor``'s video processor here.

    It does wherever torchvision is installed (difforge's shim drops the slot only without it), and
    then reads the video processor's config from the processor folder.  Asked of transformers itself
    (``get_attributes`` in 5.x, ``attributes`` in 4.x), so the answer follows the installed version.
    """
    from transformers import Qwen2VLProcessor

    from .compat import apply_processor_shim

    apply_processor_shim()
    getter = getattr(Qwen2VLProcessor, "get_attributes", None)
    names = getter() if callable(getter) else getattr(Qwen2VLProcessor, "attributes", [])
    return "video_processor" in names


def check_processor_files(processor: Path) -> None:
    """A processor folder transformers' video branch cannot read is one sentence, not an OSError wall.

    transformers takes the video processor's settings from ``video_preprocessor_config.json``, a
    ``video_processor`` nested in ``processor_config.json``, or (5.x) the image processor's
    ``preprocessor_config.json``.  A folder with none of them (what transformers 5 saves without
    torchvision) fails only where torchvision is installed - as on the 2026-12-04 H200.
    """
    if (processor / VIDEO_PROCESSOR_FILE).is_file() or (processor / "preprocessor_config.json").is_file():
        return
    nested = processor / "processor_config.json"
    if nested.is_file() and isinstance(read_json(nested, root=processor.parent).get("video_processor"), dict):
        return
    if processor_builds_video():
        raise CheckpointError(
            f"{processor} has no {VIDEO_PROCESSOR_FILE}, which transformers' Qwen2VLProcessor reads wherever"
            " torchvision is installed; copy it (and preprocessor_config.json) from the published model's processor/."
        )


def check_configs(folder: Path) -> None:
    """Refuse code and unknown classes in every config of ``folder`` before any library reads one.

    See :func:`~difforge.models.checkpoint.config_class_names` for ``auto_map``.  A diffusers
    ``_class_name`` must be the class model_index.json lists for that component; a transformers
    class key (tokenizer_class, processor_class, image_processor_type, architectures ...) must name a
    class transformers itself provides - anything else could only come from the folder's code.
    """
    for path in config_files(folder):
        names = config_class_names(path, read_json(path, root=folder))
        if path.name == "model_index.json":
            continue  # its pipeline class and entries are checked by detect_family and COMPONENTS
        component = path.parent.name if path.parent != folder else None
        for key, name in names:
            if key == "_class_name":
                allowed = [COMPONENTS[component][1]] if component in COMPONENTS else [c for _, c in COMPONENTS.values()]
                if name not in allowed:
                    raise CheckpointError(
                        f"{path} names _class_name '{name}'; difforge loads only {' or '.join(allowed)} there."
                    )
            elif not _transformers_has(name):
                raise CheckpointError(
                    f"{path} names {key} '{name}', which transformers does not provide; difforge loads library"
                    " classes only, never code from the model folder."
                )


def _transformers_has(name: str) -> bool:
    """Whether ``transformers`` exports a class called ``name`` (its own lookup, aliases included).

    The lookup imports only transformers' own modules; its deprecation and fallback notices are
    kept off stderr like the rest of loading (see :func:`.loader.quiet_hf`).
    """
    import transformers
    from transformers.utils import logging as tlog

    level = tlog.get_verbosity()
    tlog.set_verbosity_error()
    try:
        return isinstance(getattr(transformers, name, None), type)
    except Exception:  # an optional dependency of that class is missing: transformers could not load it either
        return False
    finally:
        tlog.set_verbosity(level)


def _check_float_weights(path: Path, header: dict) -> None:
    """Every tensor of an edit-pipeline component is floating point; refuse int/bool ones by key and dtype.

    diffusers would silently cast an int8 or bool tensor of the right shape to the compute dtype.
    """
    for key, meta in header.items():
        if key != "__metadata__" and meta.get("dtype") not in FLOAT_HEADER_DTYPES:
            raise CheckpointError(
                f"{path} weight '{key}' has dtype {meta.get('dtype')}; the model expects floating-point weights."
            )
