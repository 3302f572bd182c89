"""The engine: load a pipeline onto an already-chosen backend, run it, check and save its outputs.

Below :mod:`difforge.api` and :mod:`difforge.validate`, which both call it: the API parses the user's
``--device``/``--dtype`` strings into a :class:`~difforge.devices.Backend` and a ``torch.dtype`` once,
validate parses its device-under-test and reference once, and every later step gets those objects -
so the backend that applied the environment presets is the one the record and the report read.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from .config import RunConfig
from .devices import Backend, dtype_name
from .errors import (
    DeviceOutOfMemoryError,
    DifforgeError,
    InputError,
    OutputError,
    is_out_of_memory,
    out_of_memory_message,
)
from .models.checkpoint import SETTINGS_FILE, read_settings
from .models.registry import pipeline_class, resolve_model
from .runtime.atomic import atomic_save
from .runtime.environment import environment_fingerprint
from .runtime.outputs import save_options
from .runtime.record import RunRecord
from .shapes.domain import PromptDomain, domain_from_settings

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".tif", ".tiff")
VIDEO_SUFFIXES = (".gif", ".webp", ".mp4")


@dataclass
class RunResult:
    """What a generation or edit returns: the images, the record, and where they were saved."""

    images: list[Image.Image]
    record: RunRecord
    paths: list[Path] = field(default_factory=list)

    @property
    def image(self) -> Image.Image:
        return self.images[0]


def load_pipeline(
    model: str,
    backend: Backend,
    dtype: torch.dtype,
    cfg: RunConfig | None = None,
    record: RunRecord | None = None,
    op_overrides: dict[str, Callable[..., Any]] | None = None,
    task: str | None = None,
) -> Any:
    """Load a model folder or built-in tiny model onto ``backend`` in ``dtype`` (both already parsed).

    ``task`` ("generate"/"edit") makes a model of the wrong family a clear error.  The backend's
    environment presets are applied here, on this very backend object, and logged in the record.
    The returned pipeline is reusable across calls to :func:`run_pipeline`.
    """
    cfg = cfg or RunConfig(model=model, device=str(backend.device), dtype=dtype_name(dtype))
    folder, family = resolve_model(model, task=task)
    asked = backend.opt_in_choices(cfg.presets)  # InputError for a name this backend has no opt-in preset for
    presets = backend.apply_env_presets(asked=asked)
    record = record if record is not None else RunRecord(kind=task or "run")
    record.backend = {**backend.describe(), "dtype": dtype_name(dtype)}
    for name, value in presets.items():
        if name in asked:  # an opt-in preset trades precision for speed: an approximate adaptation
            record.adapt(f"env {name}", value, exact=False, detail="opt-in preset asked for with --preset")
        else:
            record.adapt(f"env {name}", value, exact=True, detail="preset applied because it was unset")
    for name in sorted(set(asked) - set(presets)):
        record.adapt(f"env {name}", os.environ.get(name, ""), exact=False,
                     detail="--preset asked for it, but the user's exported value was kept")
    domain = domain_from_settings(read_settings(folder), Path(folder).name, str(Path(folder) / SETTINGS_FILE))
    try:
        pipe = pipeline_class(family).from_pretrained(folder, backend, dtype, cfg, record, op_overrides=op_overrides)
    except DifforgeError:
        raise
    except Exception as exc:
        if is_out_of_memory(exc):
            raise DeviceOutOfMemoryError(out_of_memory_message(str(backend), cfg.offload, family)) from None
        raise
    if domain is not None:
        _DOMAINS[pipe] = domain
    return pipe


#: The prompt domain a loaded pipeline's folder declares (``difforge.json`` ``prompt_domain``; shapes/domain.py).
_DOMAINS: weakref.WeakKeyDictionary[Any, PromptDomain] = weakref.WeakKeyDictionary()
#: (model, prompt) pairs already warned about in this process: validate runs one prompt many times.
_WARNED: set[tuple[str, str]] = set()


def note_prompt_domain(pipeline: Any, cfg: RunConfig, record: RunRecord) -> list[str]:
    """A prompt outside what the pipeline's model was trained on: kept in the record, one warning line once."""
    domain = _DOMAINS.get(pipeline)
    if domain is None:
        return []
    notes = [line for text in (cfg.prompt, cfg.negative_prompt) if isinstance(text, str)
             for line in [domain.warning(text)] if line]
    if notes:
        record.extra["prompt_domain"] = notes
        for line in notes:
            if (domain.name, line) not in _WARNED:
                _WARNED.add((domain.name, line))
                print(f"difforge: warning: {line}", file=sys.stderr)
    return notes


def run_pipeline(
    pipeline: Any,
    cfg: RunConfig,
    images: list[Image.Image] | None = None,
    record: RunRecord | None = None,
    step_hook: Callable[..., None] | None = None,
) -> RunResult:
    """Run a loaded pipeline once (no files written), turning OOM into a clear error."""
    record = record if record is not None else RunRecord(kind="edit" if images else "generate")
    record.config = cfg.to_dict()
    record.config["fingerprint"] = cfg.fingerprint()
    if not record.backend:
        record.backend = {**pipeline.backend.describe(), "dtype": dtype_name(pipeline.dtype)}
    record.environment = environment_fingerprint()
    note_prompt_domain(pipeline, cfg, record)
    try:
        out = pipeline(cfg, record, images=images, step_hook=step_hook)
    except DifforgeError:
        raise
    except Exception as exc:
        if is_out_of_memory(exc):
            raise DeviceOutOfMemoryError(
                out_of_memory_message(str(pipeline.backend), cfg.offload, getattr(pipeline, "family", None))
            ) from None
        raise
    return RunResult(images=list(out), record=record)


def save_images(images: list[Image.Image], output: str | Path, record: RunRecord) -> list[Path]:
    """Save one image (or an animation of frames) atomically and log path + sha256 in the record."""
    output = Path(output)
    suffix = output.suffix.lower()
    with record.phase("save"):
        if len(images) == 1 and suffix in IMAGE_SUFFIXES:
            atomic_save(output, lambda tmp: images[0].save(tmp, format=_pil_format(suffix),
                                                           **save_options(_pil_format(suffix))))
            paths = [output]
        elif len(images) > 1 and suffix in (".gif", ".webp"):
            atomic_save(
                output,
                lambda tmp: images[0].save(
                    tmp, format=_pil_format(suffix), save_all=True, append_images=images[1:], duration=125, loop=0,
                    **save_options(_pil_format(suffix)),
                ),
            )
            paths = [output]
        elif len(images) > 1 and suffix == ".mp4":
            paths = [_save_mp4(images, output)]
        elif len(images) > 1 and suffix in IMAGE_SUFFIXES:  # one file per frame: out_000.png ...
            paths = []
            for i, img in enumerate(images):
                p = output.with_name(f"{output.stem}_{i:03d}{suffix}")
                atomic_save(p, lambda tmp, img=img: img.save(tmp, format=_pil_format(suffix),
                                                             **save_options(_pil_format(suffix))))
                paths.append(p)
        else:
            raise InputError(f"Cannot write {output.name}: use .png/.jpg/.webp for images, .gif/.webp/.mp4 for video.")
    for p in paths:
        record.add_output(p)
    return paths


def _pil_format(suffix: str) -> str:
    return {".jpg": "JPEG", ".jpeg": "JPEG", ".tif": "TIFF", ".tiff": "TIFF"}.get(suffix, suffix[1:].upper())


def _save_mp4(frames: list[Image.Image], output: Path) -> Path:
    try:
        import imageio.v3 as iio  # optional: needs imageio + imageio-ffmpeg
    except ImportError:
        raise InputError("Writing .mp4 needs 'imageio[ffmpeg]'; install it or write .gif/.webp instead.") from None
    import numpy as np

    arr = np.stack([np.asarray(f) for f in frames])
    return atomic_save(output, lambda tmp: iio.imwrite(tmp, arr, fps=8, extension=".mp4"))


def check_output_path(path: str | Path, what: str, suffixes: tuple[str, ...] | None = None) -> Path:
    """Fail before any work when an output cannot be written: wrong suffix, a directory, no permission."""
    path = Path(path)
    if suffixes is not None and path.suffix.lower() not in suffixes:
        raise InputError(f"Cannot write {what} {path.name}: use one of {', '.join(suffixes)}.")
    if path.is_dir():
        raise OutputError(f"{what.capitalize()} path {path} is a directory; give a file name.")
    parent = path.parent if str(path.parent) else Path(".")
    probe = parent
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise OutputError(f"Cannot write {what} {path}: {probe} is not a writable folder.")
    return path


def _same_file(a: str | Path, b: str | Path) -> bool:
    """Whether two paths name one file: equal after resolving ``.``/``..`` and symlinks, or hard links."""
    a, b = Path(a), Path(b)
    if a.resolve() == b.resolve():
        return True
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def check_outputs(cfg: RunConfig) -> None:
    """Refuse, before any work, outputs that cannot be written or would overwrite an input or each other.

    ``--record`` on ``--output`` would replace the image with JSON; an output on an input image would
    destroy the user's original.
    """
    for flag, target in (("--output", cfg.output), ("--record", cfg.record), ("--perf-dump", cfg.perf_dump)):
        for image in cfg.images if target else ():
            if _same_file(target, image):
                raise OutputError(
                    f"{flag} {target} is the input image {image}; write to another file so the input is kept."
                )
    if cfg.output and cfg.record and _same_file(cfg.output, cfg.record):
        raise OutputError(
            f"--record {cfg.record} is the same file as --output {cfg.output}; the record would replace the"
            " image, so give it its own name (e.g. run.json)."
        )
    for a_flag, a, b_flag, b in (("--perf-dump", cfg.perf_dump, "--output", cfg.output),
                                 ("--perf-dump", cfg.perf_dump, "--record", cfg.record)):
        if a and b and _same_file(a, b):
            raise OutputError(f"{a_flag} {a} is the same file as {b_flag} {b}; give each its own name.")
    if cfg.output:
        suffixes = IMAGE_SUFFIXES + (VIDEO_SUFFIXES if cfg.num_frames > 1 else ())
        check_output_path(cfg.output, "output", tuple(dict.fromkeys(suffixes)))
        if Path(cfg.output).suffix.lower() == ".mp4" and importlib.util.find_spec("imageio_ffmpeg") is None:
            raise InputError("Writing .mp4 needs 'imageio[ffmpeg]' (pip install 'difforge[video]'); or write .gif/.webp.")
    if cfg.record:
        check_output_path(cfg.record, "record")
    if cfg.perf_dump:
        check_output_path(cfg.perf_dump, "perf-dump")
