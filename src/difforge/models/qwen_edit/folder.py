"""Check a Qwen-Image-Edit model folder before diffusers sees it.

diffusers and transformers report a missing shard or a truncated download as a long traceback
from deep inside their loaders (or, for some components, not at all until the first forward).
Here every component the pipeline needs is checked up front: its folder, its config, and the
header and length of each safetensors file, so a broken checkpoint becomes one sentence naming
the file.  Only the component classes the edit pipelines use are accepted, so nothing named in a
downloaded ``model_index.json`` can make diffusers import code from the folder.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...errors import CheckpointError
from ..checkpoint import WEIGHTS_NAME, check_safetensors_header, read_json, weight_files
from ..registry import detect_family

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
    family: str  # registry.QWEN_EDIT or registry.QWEN_EDIT_PLUS
    pipeline_class: str
    weight_bytes: dict[str, int]  # component -> bytes of its safetensors files


def check_model_folder(folder: Path, skip_weights: frozenset[str] = frozenset()) -> CheckedFolder:
    """Validate ``folder`` for a Qwen edit pipeline; ``skip_weights`` names components supplied elsewhere."""
    folder = Path(folder)
    family = detect_family(folder)
    index = read_json(folder / "model_index.json")
    sizes: dict[str, int] = {}
    for name, expected in COMPONENTS.items():
        entry = index.get(name)
        if not (isinstance(entry, list) and len(entry) == 2 and tuple(entry) == expected):
            raise CheckpointError(
                f"{folder / 'model_index.json'} lists {name} as {entry!r}; difforge only loads {list(expected)} there."
            )
        sub = folder / name
        if not sub.is_dir():
            raise CheckpointError(f"Missing component folder {sub}; the checkpoint download is incomplete.")
        config_name, weights_name = _FILES[name]
        if config_name is not None:
            read_json(sub / config_name)
        if weights_name is None or name in skip_weights:
            continue
        total = 0
        for path in weight_files(sub, weights_name):
            check_safetensors_header(path)
            total += path.stat().st_size
        sizes[name] = total
    return CheckedFolder(folder, family, str(index["_class_name"]), sizes)
