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
import math
import os
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file

from ..errors import CheckpointError
from ..runtime.reading import check_file, describe_size, kind_of, read_bytes, resolve_inside

WEIGHTS_NAME = "diffusion_pytorch_model"

#: The most bytes difforge (or a library it hands the folder to) may read of a model folder's small
#: files - one place for every loader.  Generous: the largest real ones are Qwen2's tokenizer.json
#: (7 MB) and a 20B model's shard index (about 200 KB); a file far beyond them is not that file.
#: A JSON config costs about 2.4x its size while parsed; a tokenizer far more (a 65 MB tokenizer.json
#: of short entries peaked at 1.37 GB), so tokenizer files are also bounded by their entry counts
#: (:data:`MAX_VOCAB`): with both bounds a Qwen folder's two largest accepted tokenizers load in
#: 801 MB (tests/models/test_model_folder_reading.py).
CONFIG_LIMIT = 16 << 20
TOKENIZER_LIMIT = 24 << 20
#: Tokenizer files, by name or suffix (vocabularies and merge lists are as large as tokenizer.json).
_TOKENIZER_FILES = frozenset({"tokenizer.json", "vocab.json", "merges.txt", "added_tokens.json"})
_TOKENIZER_SUFFIXES = (".txt", ".model", ".tiktoken")
_CONFIG_SUFFIXES = (".json", ".jinja", ".yaml", ".yml")
#: The most entries a tokenizer's vocabulary, merge list and added tokens may hold.  Bytes alone do not
#: bound a tokenizer's memory (short entries cost the tokenizers library and Python about 500 bytes
#: each: a 23 MB tokenizer.json of 1.1M entries held 530 MB, and Qwen folders load two); entries do.
#: Qwen2's vocabulary has 151,643 entries and 151,387 merges; the largest in use (Gemma's) 262,144.
MAX_VOCAB = 1 << 18
MAX_MERGES = 1 << 18
MAX_ADDED_TOKENS = 1 << 16
#: A model folder with more entries than this is not a model folder (the walk below would take minutes).
MAX_FOLDER_ENTRIES = 100_000
#: Bookkeeping folders of the tools that download models; no loader reads them.
SKIPPED_FOLDERS = frozenset({".git"})


def file_limit(name: str) -> int | None:
    """The size cap of a model-folder file called ``name``; None for weights (safetensors checks their own)."""
    if name in _TOKENIZER_FILES or name.endswith(_TOKENIZER_SUFFIXES):
        return TOKENIZER_LIMIT
    if name.endswith(_CONFIG_SUFFIXES):
        return CONFIG_LIMIT
    return None


#: The optional per-model run settings file difforge reads from a model folder (plain JSON values, never code).
SETTINGS_FILE = "difforge.json"


def read_settings(folder: Path) -> dict[str, Any]:
    """The folder's ``difforge.json`` as a dict, ``{}`` when it has none (real checkpoints have none).

    One reader for every family, so the file is held to the same rules everywhere; each family
    validates the keys it knows and ignores the rest."""
    path = Path(folder) / SETTINGS_FILE
    return read_json(path, root=folder) if os.path.lexists(path) else {}


def model_file(path: Path, root: Path | None = None, limit: int | None = None) -> Path:
    """``path`` once it is a regular file inside the model folder ``root`` (after every link, a Hugging
    Face snapshot's blob store counting as inside) of at most ``limit`` bytes; else one CheckpointError.

    ``root`` defaults to the folder above ``path``'s component folder.  For files a library opens
    itself; difforge's own reads go through :func:`read_model_bytes`.
    """
    root = Path(root) if root is not None else _default_root(path)
    if not os.path.lexists(path):
        raise CheckpointError(f"Missing file {path}.")
    check_file(path, what=str(path), error=CheckpointError, root=root, also=model_roots(root)[1:], limit=limit)
    return path


def check_component_folder(path: Path, missing_hint: str = "") -> Path:
    """``path`` when it is a folder; else one CheckpointError that says what it is (missing, a file, a FIFO)."""
    if path.is_dir():
        return path
    if not os.path.lexists(path):
        raise CheckpointError(f"Missing component folder {path}{missing_hint}.")
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:  # a dangling link or a loop
        raise CheckpointError(f"Component folder {path} cannot be opened ({exc.strerror or exc}).") from None
    raise CheckpointError(f"Component folder {path} is {kind_of(mode)}, not a folder.")


def read_model_bytes(path: Path, root: Path | None = None, limit: int = CONFIG_LIMIT) -> bytes:
    """The bytes of a model-folder file, by the one reading rule (:mod:`difforge.runtime.reading`): a regular
    file inside the model folder ``root`` after every link, at most ``limit`` bytes."""
    root = Path(root) if root is not None else _default_root(path)
    if not os.path.lexists(path):
        raise CheckpointError(f"Missing file {path}.")
    return read_bytes(path, limit=limit, what=str(path), error=CheckpointError, root=root,
                      also=model_roots(root)[1:])


def _default_root(path: Path) -> Path:
    """The model folder of a file given without one: the folder above its component folder, or its own
    folder for a top-level file (``model_index.json``)."""
    parent = Path(path).parent
    return parent if (parent / "model_index.json").exists() or parent.parent == parent else parent.parent


def read_json(path: Path, root: Path | None = None, limit: int = CONFIG_LIMIT) -> dict[str, Any]:
    """Read a JSON config of the model folder ``root``, turning every failure into one CheckpointError line."""
    raw = read_model_bytes(path, root, limit)
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
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
    if os.path.lexists(path):  # a FIFO would block safetensors' open forever: refuse it by name first
        check_file(path, what=str(path), error=CheckpointError)
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
    if not os.path.lexists(path):
        raise CheckpointError(f"Missing weights file {path}.")
    check_safetensors_header(path)
    try:
        return load_file(str(path), device=str(device))
    except Exception as exc:  # safetensors raises SafetensorError / OSError for corrupt bodies
        raise CheckpointError(f"{path} could not be read as safetensors ({exc}).") from None


def model_roots(folder: Path) -> list[Path]:
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
    """``path`` when it is a regular file that resolves (after every link) inside the model folder above
    the component folder ``folder``; else one CheckpointError.

    Without this a shard index naming ``../../x`` or ``/etc/shadow``, or a weights file linked to
    another place, makes difforge and diffusers open files the model folder does not hold.  The
    model folder, not the component folder, is the bound: a weights file linked to the same file of
    another component (a deduplicated download) stays inside.
    """
    what = what or str(path)
    root = folder.parent
    resolve_inside(root, path, what, CheckpointError, also=model_roots(root)[1:])
    return path


def _index_shards(folder: Path, index: Path) -> list[Path]:
    """The shard files an index names: strings, inside the model folder, present, regular files."""
    weight_map = read_json(index, root=folder.parent).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index} has no weight_map.")
    for key, shard in weight_map.items():
        if not isinstance(shard, str) or not shard.strip():
            raise CheckpointError(f"{index} maps '{key}' to {shard!r}; weight_map values must be file names.")
    shards = [_inside(folder, folder / s, f"{index} names '{s}', which") for s in sorted(set(weight_map.values()))]
    missing = [s for s in shards if not os.path.lexists(s)]
    if missing:
        raise CheckpointError(f"Missing shard {missing[0]} listed in {index.name}.")
    for shard in shards:
        model_file(shard, folder.parent)
    return shards


def weight_files(folder: Path, name: str = WEIGHTS_NAME) -> list[Path]:
    """The safetensors files of a component folder: one file, or every shard of an index.

    Every file must be a regular file that resolves inside the model folder (see :func:`_inside`).
    With both a single file and an index present, diffusers loads the index and transformers the
    single file, so the index may then name only that file - otherwise the files checked here need
    not be the files loaded.
    """
    single = folder / f"{name}.safetensors"
    index = folder / f"{name}.safetensors.index.json"
    if os.path.lexists(index):
        shards = _index_shards(folder, index)
        if os.path.lexists(single) and shards != [single]:
            raise CheckpointError(
                f"{folder} holds both {single.name} and {index.name} naming other files; remove one so it is"
                " clear which weights load."
            )
        return shards
    if os.path.lexists(single):
        _inside(folder, single)
        return [model_file(single, folder.parent)]
    if list(folder.glob("*.bin")) or list(folder.glob("*.pt")) or list(folder.glob("*.ckpt")):
        raise CheckpointError(
            f"{folder} holds only pickle weights (.bin/.pt/.ckpt); difforge reads safetensors only - convert them first."
        )
    raise CheckpointError(f"No {name}.safetensors (or shard index) in {folder}.")


def check_tree(folder: Path) -> None:
    """Every entry of the model folder, followed through every link, is a folder or a capped regular file
    inside it; else one CheckpointError naming the entry.

    diffusers and transformers open the files of a component folder themselves (configs, tokenizer
    files, vocabularies, weights), so difforge cannot route each of their reads through its own
    reader; it holds every file they could read to the same rule before handing the folder over: a
    component folder linked to elsewhere (``transformer/ -> /elsewhere``), a tokenizer file linked
    outside, a FIFO (which would block a library's open forever) or a device, and a config or
    tokenizer file over its cap (:func:`file_limit`) are refused.  Links that stay inside are fine,
    and so are a Hugging Face snapshot's links into its blob store.  ``.git`` is not walked: no
    loader reads it.
    """
    folder = Path(folder)
    roots = model_roots(folder)
    stack: list[tuple[Path, frozenset[Path]]] = [(folder, frozenset({roots[0]}))]
    count = 0
    while stack:
        current, above = stack.pop()
        try:
            entries = sorted(os.scandir(current), key=lambda e: e.name)
        except OSError as exc:
            raise CheckpointError(f"{current} cannot be listed ({exc.strerror or exc}).") from None
        for entry in entries:
            count += 1
            if count > MAX_FOLDER_ENTRIES:
                raise CheckpointError(f"{folder} holds more than {MAX_FOLDER_ENTRIES} entries (counting every path"
                                      " through its links); it is not a model folder.")
            path = Path(entry.path)
            real = resolve_inside(folder, path, str(path), CheckpointError, also=roots[1:])
            try:
                st = os.stat(path)
            except OSError as exc:
                raise CheckpointError(f"{path} cannot be read ({exc.strerror or exc}).") from None
            if stat.S_ISDIR(st.st_mode):
                if entry.name not in SKIPPED_FOLDERS and real not in above:  # a link to a folder above: a loop
                    stack.append((path, above | {real}))
                continue
            if not stat.S_ISREG(st.st_mode):
                check_file(path, what=str(path), error=CheckpointError)  # says what it is (FIFO, device, socket)
            limit = file_limit(entry.name)
            if limit is not None and st.st_size > limit:
                raise CheckpointError(
                    f"{path} is larger than {describe_size(limit)}, the most difforge reads for a file of its kind;"
                    " it cannot be the file it should be."
                )
            if entry.name in _COUNTED:
                check_tokenizer_counts(path, folder)


def _entries(value: Any) -> int:
    return len(value) if isinstance(value, dict | list) else 0


def check_tokenizer_counts(path: Path, root: Path) -> None:
    """Refuse a tokenizer file whose vocabulary, merges or added tokens outnumber :data:`MAX_VOCAB` and kin.

    ``tokenizer.json`` and ``vocab.json`` are parsed (at most :data:`TOKENIZER_LIMIT` bytes, about 2.4x
    that while parsing) and ``merges.txt`` counted by lines, before any tokenizer library holds them.
    """
    raw = read_model_bytes(path, root, TOKENIZER_LIMIT)
    if path.name == "merges.txt":
        counts = {"merges": raw.count(b"\n")}
    else:
        try:
            data = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            raise CheckpointError(f"{path} is not valid JSON.") from None
        if not isinstance(data, dict):
            raise CheckpointError(f"{path} must hold a JSON object.")
        if path.name == "vocab.json":
            counts = {"vocabulary": len(data)}
        else:
            model = data.get("model") if isinstance(data.get("model"), dict) else {}
            counts = {"vocabulary": _entries(model.get("vocab")), "merges": _entries(model.get("merges")),
                      "added tokens": _entries(data.get("added_tokens"))}
    bounds = {"vocabulary": MAX_VOCAB, "merges": MAX_MERGES, "added tokens": MAX_ADDED_TOKENS}
    for what, count in counts.items():
        if count > bounds[what]:
            raise CheckpointError(
                f"{path} holds {count} {what} entries, more than the {bounds[what]} difforge accepts (Qwen2's"
                " vocabulary has 151,643); it cannot be the tokenizer it should be."
            )


#: The tokenizer files whose entries are counted by :func:`check_tokenizer_counts`.
_COUNTED = frozenset({"tokenizer.json", "vocab.json", "merges.txt"})


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


def json_objects(data: Any) -> Iterator[dict[str, Any]]:
    """Every JSON object in ``data``, itself first, then those nested in its values and lists: an iterative
    walk, so a deeply nested but parseable file cannot exhaust the stack."""
    stack: list[Any] = [data]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            yield node
            stack.extend(v for v in node.values() if isinstance(v, dict | list))
        elif isinstance(node, list):
            stack.extend(node)


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
    for node in json_objects(data):
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
    return names


#: The lowest non-finite code of each one-byte float format among its positive codes (the sign bit
#: clear): e4m3fn has no infinity and spells NaN S.1111.111 (0x7F, 0xFF); e5m2 spells inf and NaN with
#: an all-ones exponent (0x7C-0x7F, 0xFC-0xFF).
FP8_FIRST_NON_FINITE = {torch.float8_e4m3fn: 0x7F, torch.float8_e5m2: 0x7C}
#: The "fnuz" formats have one NaN code, negative zero's (0x80), and no infinity.
_FNUZ = tuple(getattr(torch, n) for n in ("float8_e4m3fnuz", "float8_e5m2fnuz") if hasattr(torch, n))


def fp8_codes_finite(tensor: torch.Tensor) -> bool:
    """Whether a one-byte float tensor holds no NaN or infinity code, judged by its bits without a copy.

    The non-finite codes are the top codes of each sign, so two reductions find them: the int8
    maximum (positive codes) and the uint8 maximum (negative ones).  A NaN code is NaN whatever scale
    multiplies it, so this holds for scaled and plain fp8 weights alike.
    """
    if tensor.numel() == 0 or tensor.is_meta:
        return True
    if tensor.dtype in _FNUZ:
        return not bool(tensor.view(torch.uint8).eq(0x80).any())
    first_bad = FP8_FIRST_NON_FINITE.get(tensor.dtype)
    if first_bad is None:  # a one-byte format difforge does not know the codes of: decode it
        return bool(torch.isfinite(tensor.float()).all())
    return int(tensor.view(torch.int8).amax()) < first_bad and int(tensor.view(torch.uint8).amax()) < 0x80 + first_bad


def check_finite(where: str | Path, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Refuse the first floating-point tensor that holds a NaN or an infinity, naming its key.

    A corrupt or maliciously edited weight otherwise surfaces much later as a NaN image or a
    crash in sampling.  One ``torch.aminmax`` per tensor decides it: NaN propagates into both
    results and an infinity shows in one of them, so two finite scalars prove the tensor finite.
    That reads each weight once without allocating (measured 0.1-0.3 s per GiB on two CPU
    threads, about 20x cheaper than ``isfinite().all()``, which builds a mask first).  One-byte
    float8 storage is judged by its codes (:func:`fp8_codes_finite`): a NaN code is NaN whatever its
    scale, and whether finite codes stay finite once scaled is the fp8 loader's question (see
    :mod:`.qwen_edit.loader`).
    """
    for key, tensor in tensors:
        if not tensor.is_floating_point() or tensor.numel() == 0 or tensor.is_meta:
            continue
        if tensor.element_size() < 2:
            finite = fp8_codes_finite(tensor)
        else:
            try:
                low, high = torch.aminmax(tensor)
                finite = bool(torch.isfinite(low) & torch.isfinite(high))
            except (RuntimeError, NotImplementedError):  # a backend without aminmax for this dtype
                finite = bool(torch.isfinite(tensor).all())
        if not finite:
            raise CheckpointError(
                f"{where} weight '{key}' holds NaN or infinite values; the checkpoint is corrupt, download it again."
            )


#: The exception a Rust library (tokenizers) raises when it panics; it derives from BaseException, so
#: ``except Exception`` lets it through as a 60-line traceback.
PANIC_NAME = "PanicException"


@contextmanager
def library_panics(what: str) -> Iterator[None]:
    """Turn a Rust panic inside ``tokenizers`` (a hostile tokenizer.json: a normalizer or pre-tokenizer
    regex that backtracks without end, an inconsistent vocabulary) into one CheckpointError naming ``what``.

    Rust's panic hook writes its own message (and, with ``RUST_BACKTRACE`` set, a 60-line backtrace)
    straight to file descriptor 2 before Python sees the exception, so descriptor 2 is held in a
    temporary file while the library runs: dropped after a panic, written back otherwise.
    """
    import sys
    import tempfile

    sys.stderr.flush()
    try:
        saved = os.dup(2)
        held = tempfile.TemporaryFile()  # noqa: SIM115 - closed in the finally below, after the yield
        os.dup2(held.fileno(), 2)
    except OSError:  # no descriptor 2 to hold (a daemon): let the library write where it can
        saved, held = -1, None
    panicked = False
    try:
        yield
    except BaseException as exc:
        if type(exc).__name__ != PANIC_NAME:
            raise
        panicked = True
        reason = " ".join(str(exc).split())[:160] or "no reason given"
        raise CheckpointError(f"{what} made the tokenizers library fail ({reason}); the file is damaged or hostile.") from None
    finally:
        if held is not None:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            if not panicked:
                held.seek(0)
                data = held.read()
                if data:
                    os.write(2, data)
            held.close()


# ---- config values: one checker for every family's numeric and flag fields ---------------------------


def shown(value: Any) -> str:
    """A config value as the JSON file spells it (``true``, ``NaN``, ``64.5``), cut short."""
    try:
        return json.dumps(value)[:60]
    except (TypeError, ValueError):
        return repr(value)[:60]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class Int:
    """An integer (JSON ``true`` and ``2048.0`` are not) in ``[low, high]``."""

    low: int
    high: int

    def problem(self, value: Any) -> str | None:
        if not _is_int(value):
            return "must be an integer"
        return None if self.low <= value <= self.high else f"must be between {self.low} and {self.high}"


@dataclass(frozen=True)
class Num:
    """A finite number in ``[low, high]`` (``low`` itself excluded when ``open_low``); NaN and Infinity parse as JSON."""

    low: float
    high: float
    open_low: bool = False

    def problem(self, value: Any) -> str | None:
        if not _is_number(value):
            return "must be a finite number"
        if value > self.high or value < self.low or (self.open_low and value == self.low):
            side = "positive" if self.open_low and self.low == 0 else f"above {self.low:g}" if self.open_low else (
                f"at least {self.low:g}")
            return f"must be {side} and at most {self.high:g}"
        return None


@dataclass(frozen=True)
class OrNull:
    """``null`` (the library's "unset"), or a value of ``rule``."""

    rule: Any

    def problem(self, value: Any) -> str | None:
        return None if value is None else self.rule.problem(value)


@dataclass(frozen=True)
class Bool:
    """``true`` or ``false`` (a string "false" would be truthy)."""

    def problem(self, value: Any) -> str | None:
        return None if isinstance(value, bool) else "must be true or false"


@dataclass(frozen=True)
class Choice:
    """One of a few strings."""

    values: tuple[str, ...]

    def problem(self, value: Any) -> str | None:
        return None if value in self.values else f"must be one of {', '.join(self.values)}"


@dataclass(frozen=True)
class Items:
    """A list of ``each`` (of exactly ``length`` items when given, else ``least`` to ``most``)."""

    each: Any
    length: int | None = None
    most: int = 64
    least: int = 1

    def problem(self, value: Any) -> str | None:
        if not isinstance(value, list):
            return "must be a list"
        if self.length is not None and len(value) != self.length:
            return f"must hold {self.length} values, not {len(value)}"
        if self.length is None and not self.least <= len(value) <= self.most:
            return f"must hold {self.least} to {self.most} values"
        for item in value:
            inner = self.each.problem(item)
            if inner is not None:
                return f"must hold values that each {inner.removeprefix('must ')}"
        return None


@dataclass(frozen=True)
class Token:
    """A special token: a string, ``null``, or ``{"content": string}`` (an integer or a list crashes the library)."""

    def problem(self, value: Any) -> str | None:
        content = value.get("content") if isinstance(value, dict) else value
        return None if value is None or (isinstance(content, str) and content) else "must be a token string"


def check_values(path: Path | str, data: dict[str, Any], rules: dict[str, Any], nested: bool = False) -> None:
    """Refuse the first key of ``data`` whose value breaks its rule, naming the file, the key and the value.

    A key the file does not set is left to the library's default; ``null`` is a value like any
    other (a rule that allows it says so).  With ``nested`` the rules hold in every object of the
    file (transformers' sub-configs, a processor's nested image and video processors).
    """
    for node in json_objects(data) if nested else [data]:
        for key, value in node.items():
            rule = rules.get(key)
            if rule is not None:
                problem = rule.problem(value)
                if problem is not None:
                    raise CheckpointError(f"{path}: '{key}' {problem}, got {shown(value)}.")
