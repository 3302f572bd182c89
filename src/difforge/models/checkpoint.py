"""Safe, strict reading of checkpoint folders.

Only ``.safetensors`` (and, for URSA's scheduler, a statically parsed ``.pth``) are read from a
model folder.  Nothing in a folder is imported or executed.  Every problem becomes one
:class:`~difforge.errors.CheckpointError` sentence naming the file.

A folder is treated as hostile input: configs may not ask a library for custom code
(``auto_map``) or name classes with anything but strings, shard indexes may not point outside
their folder, and weights must be finite.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file

from ..errors import CheckpointError

WEIGHTS_NAME = "diffusion_pytorch_model"


#: The optional per-model run settings file difforge reads from a model folder (plain JSON values, never code).
SETTINGS_FILE = "difforge.json"


def read_settings(folder: Path) -> dict[str, Any]:
    """The folder's ``difforge.json`` as a dict, ``{}`` when it has none (real checkpoints have none).

    One reader for every family, so the file is held to the same rules everywhere; each family
    validates the keys it knows and ignores the rest."""
    path = Path(folder) / SETTINGS_FILE
    return read_json(path) if path.is_file() else {}


def read_json(path: Path) -> dict[str, Any]:
    """Read a JSON config, turning every failure into one CheckpointError line."""
    if not path.is_file():
        raise CheckpointError(f"Missing file {path}.")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path} is not valid JSON ({exc.__class__.__name__}).") from None
    except RecursionError:  # json's C parser recurses per nesting level
        raise CheckpointError(f"{path} is nested too deeply to be a config file.") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} must hold a JSON object.")
    return data


#: safetensors' header errors, as the reason a user reads (its own text for any other).
_HEADER_ERRORS = {
    "header too small": "it is shorter than its 8-byte header length",
    "header too large": "its header length is over safetensors' 100 MB limit",
    "invalid header length": "its header runs past the end of the file",
    "recursion limit exceeded": "its header is nested too deeply",
    "expected struct HashMetadata": "its header is not a JSON object",
}


def check_safetensors_header(path: Path) -> dict[str, dict[str, Any]]:
    """Each tensor's ``{"dtype": "BF16", "shape": [...]}`` by name, read from the header alone.

    ``safe_open`` memory-maps the file, reads only the header and refuses every malformed one: a
    header length over 100 MB or past the end of the file (before any JSON is parsed), invalid
    JSON or UTF-8, unknown dtypes, shapes that do not match their bytes, overlapping or gapped
    offsets, and data shorter or longer than the offsets promise (a truncated download).  Each
    becomes one CheckpointError sentence naming the file.
    """
    try:
        with safe_open(str(path), framework="pt") as fh:
            tensors = {}
            for name in fh.keys():  # noqa: SIM118 - a safe_open handle is not iterable
                piece = fh.get_slice(name)
                tensors[name] = {"dtype": piece.get_dtype(), "shape": list(piece.get_shape())}
            return tensors
    except OSError as exc:  # missing, a folder, unreadable
        raise CheckpointError(f"{path} cannot be read ({str(exc).removesuffix(f': {path}')}).") from None
    except SafetensorError as exc:
        reason = " ".join(str(exc).removeprefix("Error while deserializing header: ").split())
    if "file not fully covered" in reason:
        raise CheckpointError(
            f"{path} is truncated or has bytes after its tensors (its size does not match its header);"
            " download it again."
        )
    reason = next((text for key, text in _HEADER_ERRORS.items() if key in reason), reason)
    raise CheckpointError(f"{path} is not a valid safetensors file ({reason}).")


def load_safetensors(path: Path, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Load one safetensors file with clear errors for missing / corrupt / truncated files."""
    if not path.is_file():
        raise CheckpointError(f"Missing weights file {path}.")
    check_safetensors_header(path)
    try:
        return load_file(str(path), device=str(device))
    except Exception as exc:  # safetensors raises SafetensorError / OSError for corrupt bodies
        raise CheckpointError(f"{path} could not be read as safetensors ({exc}).") from None


def _weight_roots(folder: Path) -> list[Path]:
    """Where the weights of ``folder`` may really live: the folder itself, after symlinks, and -
    for a Hugging Face cache snapshot - its repository's ``blobs`` store.

    ``huggingface_hub`` downloads into ``<repo>/snapshots/<rev>/...`` as symlinks to
    ``<repo>/blobs/<hash>``; those links are the cache's own layout, not an escape.  The store only
    counts when it is a real folder, so a ``blobs`` link to elsewhere opens nothing.
    """
    real = folder.resolve()
    roots = [real]
    snapshots = next((p for p in real.parents if p.name == "snapshots"), None)
    if snapshots is not None:
        blobs = snapshots.parent / "blobs"
        if blobs.is_dir() and not blobs.is_symlink():
            roots.append(blobs)
    return roots


def _inside(folder: Path, path: Path, what: str | None = None) -> Path:
    """``path`` when it resolves (after every symlink) inside ``folder``; else one CheckpointError.

    Without this a shard index naming ``../../x`` or ``/etc/shadow``, or a weights file linked to
    another place, makes difforge and diffusers open files the model folder does not hold.
    """
    what = what or str(path)
    try:
        real = path.resolve()
    except (OSError, RuntimeError, ValueError) as exc:  # symlink loop, NUL byte in a name
        raise CheckpointError(f"{what} cannot be resolved ({exc}).") from None
    if any(real.is_relative_to(root) for root in _weight_roots(folder)):
        return path
    raise CheckpointError(
        f"{what} resolves to {real}, outside {folder}; difforge reads weights only from inside the model folder."
    )


def _index_shards(folder: Path, index: Path) -> list[Path]:
    """The shard files an index names: strings, inside ``folder``, present."""
    weight_map = read_json(index).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index} has no weight_map.")
    for key, shard in weight_map.items():
        if not isinstance(shard, str) or not shard.strip():
            raise CheckpointError(f"{index} maps '{key}' to {shard!r}; weight_map values must be file names.")
    shards = [_inside(folder, folder / s, f"{index} names '{s}', which") for s in sorted(set(weight_map.values()))]
    missing = [s for s in shards if not s.is_file()]
    if missing:
        raise CheckpointError(f"Missing shard {missing[0]} listed in {index.name}.")
    return shards


def weight_files(folder: Path, name: str = WEIGHTS_NAME) -> list[Path]:
    """The safetensors files of a component folder: one file, or every shard of an index.

    Every file must resolve inside the folder (see :func:`_inside`).  With both a single file and
    an index present, diffusers loads the index and transformers the single file, so the index may
    then name only that file - otherwise the files checked here need not be the files loaded.
    """
    single = folder / f"{name}.safetensors"
    index = folder / f"{name}.safetensors.index.json"
    if index.is_file():
        shards = _index_shards(folder, index)
        if single.is_file() and shards != [single]:
            raise CheckpointError(
                f"{folder} holds both {single.name} and {index.name} naming other files; remove one so it is"
                " clear which weights load."
            )
        return shards
    if single.is_file():
        return [_inside(folder, single)]
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
    return list(check_safetensors_header(path))


#: Config keys through which diffusers and transformers pick a class by name.
CLASS_KEYS = frozenset({
    "_class_name", "architectures", "tokenizer_class", "processor_class", "image_processor_type",
    "video_processor_type", "feature_extractor_type",
})


def config_files(folder: Path) -> list[Path]:
    """``model_index.json`` and every ``*config.json`` at the top of ``folder`` and in its component folders.

    Those are the files diffusers and transformers read a class name or an ``auto_map`` from
    (config, tokenizer_config, preprocessor_config, processor_config, video_preprocessor_config,
    scheduler_config, generation_config ...); tokenizer.json and vocabularies are not among them.
    """
    files = [folder / "model_index.json"] if (folder / "model_index.json").is_file() else []
    for sub in [folder, *sorted(p for p in folder.iterdir() if p.is_dir())]:
        files.extend(sorted(p for p in sub.glob("*config.json") if p.is_file()))
    return files


def config_class_names(path: Path, data: dict[str, Any]) -> list[tuple[str, str]]:
    """Every class a config names, as ``(key, name)`` pairs, refusing what could run folder code.

    An ``auto_map`` anywhere (transformers also reads it from nested sub-configs) makes the Auto
    classes import a ``.py`` beside the config once someone answers the "run the custom code?"
    prompt with y, so it is refused outright.  A class key that is not a string (for
    ``architectures``: a list of strings) is refused too: the libraries look it up in their
    registries and crash with a TypeError.  ``null`` means unset and is skipped.  The walk is
    iterative, so a deeply nested but parseable file cannot exhaust the stack.
    """
    names: list[tuple[str, str]] = []
    stack: list[Any] = [data]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        if "auto_map" in node:
            raise CheckpointError(
                f"{path} has an auto_map, which asks to run Python code from the model folder; difforge never runs"
                " model code, so it refuses the folder."
            )
        for key, value in node.items():
            if key in CLASS_KEYS and value is not None:
                values = value if key == "architectures" and isinstance(value, list) else [value]
                for name in values:
                    if not isinstance(name, str):
                        raise CheckpointError(f"{path} sets {key} to {repr(value)[:60]}; a class name must be a string.")
                    names.append((key, name))
            elif isinstance(value, dict | list):
                stack.append(value)
    return names


def check_finite(where: str | Path, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Refuse the first floating-point tensor that holds a NaN or an infinity, naming its key.

    A corrupt or maliciously edited weight otherwise surfaces much later as a NaN image or a
    crash in sampling.  One ``torch.aminmax`` per tensor decides it: NaN propagates into both
    results and an infinity shows in one of them, so two finite scalars prove the tensor finite.
    That reads each weight once without allocating (measured 0.1-0.3 s per GiB on two CPU
    threads, about 20x cheaper than ``isfinite().all()``, which builds a mask first).  One-byte
    float8 storage is skipped: its codes mean something only with their scale, which the fp8
    loader checks (see :mod:`.qwen_edit.loader`).
    """
    for key, tensor in tensors:
        if not tensor.is_floating_point() or tensor.element_size() < 2 or tensor.numel() == 0 or tensor.is_meta:
            continue
        try:
            low, high = torch.aminmax(tensor)
            finite = bool(torch.isfinite(low) & torch.isfinite(high))
        except (RuntimeError, NotImplementedError):  # a backend without aminmax for this dtype
            finite = bool(torch.isfinite(tensor).all())
        if not finite:
            raise CheckpointError(
                f"{where} weight '{key}' holds NaN or infinite values; the checkpoint is corrupt, download it again."
            )
