"""The golden bundle on disk: what a reference run stored, bounded in size, hashed, and checked on read.

A bundle is a folder:

- ``manifest.json``: format and difforge version, the settings and inputs the reference ran with,
  the sha256 of every weight file, the floor's label and the dtype plan it emulated;
- ``data.json``: the structure of everything stored (per seed the runs, per step the outputs, the
  component inputs and outputs, the transformer blocks, the gallery), tensors named by key;
- ``tensors.safetensors``: those tensors (safetensors: loading it can never run code);
- ``inputs/`` and ``images/``: the input pictures and the reference/floor images (PNG);
- ``SHA256SUMS``: the sha256 of every other file, so a tampered or truncated bundle is refused.

Why sampling: what validate compares must fit on a disk and travel to an NPU host.  A tensor of up
to :data:`FULL_LIMIT` elements is stored whole (inputs always are: the device replays them);
a larger output keeps a fixed, seeded sample (:class:`Reducer`) - whole rows of a ``(…, classes)``
tensor such as URSA's logits, so argmax agreement still means something, else single elements -
and validate reduces the device's output with the *same* indices, so both sides are compared on the
same elements.  Transformer-block outputs (first-divergence data, every step) keep at most
:data:`BLOCK_SAMPLE` elements each.  Cosine and relative L2 over 2^18 sampled elements estimate the
full tensor's within about 0.2 % (relative standard error ~ 1/sqrt(n)); max-abs is a lower bound.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from ..errors import InputError
from ..runtime.atomic import atomic_save
from ..runtime.hashes import file_sha256
from ..runtime.record import sha256_file
from ..version import __version__

FORMAT = "difforge-golden"
#: The device-under-test half of a validation (``difforge capture``, :mod:`.capture`): the same layout.
CAPTURE_FORMAT = "difforge-capture"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
DATA = "data.json"
TENSORS = "tensors.safetensors"
SUMS = "SHA256SUMS"
#: Outputs up to this many elements are stored whole (4 MiB in float32).
FULL_LIMIT = 1 << 20
#: Elements (or whole rows' worth of elements) kept from a larger output.
SAMPLE = 1 << 18
#: Transformer-block outputs up to this many elements are stored whole; larger ones keep BLOCK_SAMPLE.
BLOCK_FULL = 1 << 16
BLOCK_SAMPLE = 1 << 13
#: A bundle refuses to grow past this (tensors and images together).
MAX_BYTES = 4 << 30


class GoldenError(InputError):
    """A bundle that cannot be used for this validation (exit 2, one line)."""


def compatible_version(version: str) -> bool:
    """Bundles are read by the difforge release line (major.minor) that wrote them: a reference
    computed by other code may differ in what a step's outputs or components are."""
    return version.split(".")[:2] == __version__.split(".")[:2]


# ---- the sampling plan ------------------------------------------------------------------------
class Reducer:
    """Which elements of a large tensor are kept: one plan (sorted indices) per kind and shape.

    Made while the bundle is written, then read back, so the device's outputs are reduced with
    exactly the reference's indices.  ``frozen``: never make a new plan (a shape the bundle does not
    know is returned whole, and the comparison then reports the shape mismatch).
    """

    def __init__(self, plans: dict[str, torch.Tensor] | None = None, frozen: bool = False) -> None:
        self.plans: dict[str, torch.Tensor] = dict(plans or {})
        self.frozen = frozen

    @staticmethod
    def key(kind: str, shape: tuple[int, ...]) -> str:
        return f"{kind}:{'x'.join(str(s) for s in shape)}"

    def _plan(self, kind: str, shape: tuple[int, ...], rows: int, keep: int) -> torch.Tensor | None:
        key = self.key(kind, shape)
        if key not in self.plans:
            if self.frozen:
                return None
            gen = torch.Generator().manual_seed(zlib.crc32(key.encode()))
            self.plans[key] = torch.randperm(rows, generator=gen)[:keep].sort().values
        return self.plans[key]

    def output(self, t: torch.Tensor) -> torch.Tensor:
        """A step or component output: whole up to FULL_LIMIT, else sampled rows (or elements)."""
        if not isinstance(t, torch.Tensor) or t.numel() <= FULL_LIMIT:
            return t
        shape = tuple(t.shape)
        last = shape[-1] if t.dim() >= 2 else 0
        if 0 < last <= SAMPLE // 16:
            rows = t.numel() // last
            idx = self._plan("rows", shape, rows, max(1, SAMPLE // last))
            return t if idx is None else t.reshape(rows, last)[idx].contiguous()
        idx = self._plan("elements", shape, t.numel(), SAMPLE)
        return t if idx is None else t.reshape(-1)[idx].contiguous()

    def block(self, flat: torch.Tensor) -> torch.Tensor:
        """A flattened transformer-block output: whole up to BLOCK_FULL, else BLOCK_SAMPLE elements."""
        if flat.numel() <= BLOCK_FULL:
            return flat
        idx = self._plan("block", (flat.numel(),), flat.numel(), BLOCK_SAMPLE)
        return flat if idx is None else flat[idx].contiguous()


# ---- nested values <-> JSON + tensors ---------------------------------------------------------
def pack(value: Any, key: str, tensors: dict[str, torch.Tensor]) -> Any:
    """``value`` as JSON, its tensors moved into ``tensors`` under keys derived from ``key``."""
    if isinstance(value, torch.Tensor):
        name = key
        n = 1
        while name in tensors:
            n += 1
            name = f"{key}#{n}"
        tensors[name] = value.detach().to("cpu").contiguous().clone()
        return {"__tensor__": name}
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise TypeError(f"cannot store a dict with non-string keys at {key}")
        return {"__dict__": {k: pack(v, f"{key}/{k}", tensors) for k, v in value.items()}}
    if isinstance(value, list | tuple):
        return {"__tuple__" if isinstance(value, tuple) else "__list__":
                [pack(v, f"{key}/{i}", tensors) for i, v in enumerate(value)]}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise TypeError(f"cannot store a {type(value).__name__} at {key}")


def unpack(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, dict):
        if "__tensor__" in obj:
            return tensors[obj["__tensor__"]]
        if "__dict__" in obj:
            return {k: unpack(v, tensors) for k, v in obj["__dict__"].items()}
        if "__list__" in obj:
            return [unpack(v, tensors) for v in obj["__list__"]]
        if "__tuple__" in obj:
            return tuple(unpack(v, tensors) for v in obj["__tuple__"])
        return {k: unpack(v, tensors) for k, v in obj.items()}  # the bundle's own plain structure
    if isinstance(obj, list):
        return [unpack(v, tensors) for v in obj]
    return obj


# ---- hashes -------------------------------------------------------------------------------------
def weight_hashes(folder: Path, transformer_file: str | None = None) -> dict[str, str]:
    """sha256 of every file of the model folder (relative path -> digest), and of ``--transformer``.

    Every file counts (configs as well as weights): a bundle made from another model, or the same
    model with one changed file, is refused.  Hidden files and folders (caches) are left out.  Large
    files are hashed once (:func:`~difforge.runtime.hashes.file_sha256`, cached by size, mtime, inode).
    """
    out: dict[str, str] = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if any(part.startswith(".") for part in rel.parts) or not path.is_file():
            continue
        out[rel.as_posix()] = file_sha256(path)
    if transformer_file:
        out[f"--transformer {Path(transformer_file).name}"] = file_sha256(transformer_file)
    return out


def image_hash(img: Image.Image) -> str:
    """sha256 of a picture's decoded RGB pixels and size (the same picture re-encoded is the same input)."""
    import hashlib

    rgb = img.convert("RGB")
    h = hashlib.sha256(f"{rgb.size[0]}x{rgb.size[1]}".encode())
    h.update(rgb.tobytes())
    return h.hexdigest()


def first_difference(want: dict[str, str], have: dict[str, str]) -> str | None:
    """The first file that differs between two hash maps, as words; None when they are equal."""
    for name in sorted(set(want) | set(have)):
        if name not in have:
            return f"{name} is missing"
        if name not in want:
            return f"{name} is not in the bundle's weights"
        if want[name] != have[name]:
            return f"{name} differs"
    return None


# ---- writing ------------------------------------------------------------------------------------
class BundleWriter:
    """Collects a bundle in ``folder`` (a staging folder) and writes it whole in :meth:`finish`."""

    def __init__(self, folder: Path, reducer: Reducer) -> None:
        self.folder = folder
        self.reducer = reducer
        self.tensors: dict[str, torch.Tensor] = {}
        self.files: list[Path] = []
        self.bytes = 0

    def put(self, value: Any, key: str) -> Any:
        """Store ``value`` (nested dicts/lists of tensors and scalars); returns its JSON form."""
        before = set(self.tensors)
        packed = pack(value, key, self.tensors)
        for name in set(self.tensors) - before:
            t = self.tensors[name]
            self.bytes += t.numel() * t.element_size()
        self._check_size()
        return packed

    def image(self, img: Image.Image, name: str) -> str:
        """Save a PNG under ``images/`` or ``inputs/`` (``name`` includes the folder); returns the name."""
        path = self.folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_save(path, lambda tmp: img.save(tmp, format="PNG"))
        self.files.append(path)
        self.bytes += path.stat().st_size
        self._check_size()
        return name

    def _check_size(self) -> None:
        if self.bytes > MAX_BYTES:
            raise GoldenError(f"the golden bundle would exceed {MAX_BYTES >> 30} GiB; use fewer --steps, prompts "
                              "or seeds, or a smaller size.")

    def finish(self, manifest: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
        from safetensors.torch import save_file

        data = {**data, "plans": {k: pack(v, f"plans/{k}", self.tensors) for k, v in self.reducer.plans.items()}}
        manifest = {**manifest, "bytes": self.bytes}
        save_file(self.tensors, str(self.folder / TENSORS))
        (self.folder / DATA).write_text(json.dumps(data, indent=1), encoding="utf-8")
        (self.folder / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str), encoding="utf-8")
        names = [TENSORS, DATA, MANIFEST, *(p.relative_to(self.folder).as_posix() for p in self.files)]
        lines = [f"{sha256_file(self.folder / n)}  {n}" for n in sorted(names)]
        (self.folder / SUMS).write_text("\n".join(lines) + "\n", encoding="utf-8")
        return manifest


# ---- reading ------------------------------------------------------------------------------------
class Bundle:
    """A verified bundle: :func:`open_bundle` checked every file's hash, the format and the version."""

    def __init__(self, folder: Path, manifest: dict[str, Any], data: dict[str, Any],
                 tensors: dict[str, torch.Tensor]) -> None:
        self.folder = folder
        self.manifest = manifest
        self.tensors = tensors
        self.data = unpack(data, tensors)
        self.reducer = Reducer(self.data.get("plans", {}), frozen=True)

    def path(self, name: str) -> Path:
        return self.folder / name

    def image(self, name: str) -> Image.Image:
        with Image.open(self.folder / name) as img:
            return img.convert("RGB")

    def images(self, names: list[str]) -> list[Image.Image]:
        return [self.image(n) for n in names]


def _listed(folder: Path, flag: str = "--golden", maker: str = "difforge golden") -> dict[str, str]:
    try:
        text = (folder / SUMS).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        kind = "golden bundle" if flag == "--golden" else "capture bundle"
        raise GoldenError(f"{flag} {folder} is not a {kind} (no readable {SUMS}); make one with '{maker}'.") from None
    listed: dict[str, str] = {}
    for line in text.splitlines():
        digest, sep, name = line.partition("  ")
        if not sep or len(digest) != 64 or not name or Path(name).is_absolute() or ".." in Path(name).parts:
            raise GoldenError(f"{flag} {folder}: {SUMS} is damaged (line {line[:60]!r}); make the bundle again.")
        listed[name] = digest
    return listed


def _files(folder: Path) -> Iterator[str]:
    for path in folder.rglob("*"):
        if path.is_file() or path.is_symlink():
            yield path.relative_to(folder).as_posix()


def open_bundle(folder: str | Path, fmt: str = FORMAT, flag: str = "--golden", maker: str = "difforge golden") -> Bundle:
    """Read and verify a bundle of format ``fmt`` (a golden bundle, or a capture with ``flag`` ``--capture``);
    any damage, tampering or version mismatch is one GoldenError line naming ``flag``."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    root = Path(folder)
    kind = "golden bundle" if fmt == FORMAT else "capture bundle"
    if not root.is_dir():
        what = "is a file" if root.exists() else "does not exist"
        raise GoldenError(f"{flag} {root} {what}; give the folder '{maker} --out' wrote.")
    listed = _listed(root, flag, maker)
    for name in (MANIFEST, DATA, TENSORS):
        if name not in listed:
            raise GoldenError(f"{flag} {root} is not a {kind} ({name} is not listed in {SUMS}).")
    extra = sorted(set(_files(root)) - set(listed) - {SUMS})
    if extra:
        raise GoldenError(f"{flag} {root} holds a file the bundle does not list ({extra[0]}): it was changed "
                          f"after '{maker}' wrote it; make the bundle again.")
    for name, digest in sorted(listed.items()):
        path = root / name
        if path.is_symlink() or not path.is_file():
            raise GoldenError(f"{flag} {root}: {name} is missing; make the bundle again.")
        if sha256_file(path) != digest:
            raise GoldenError(f"{flag} {root}: {name} does not match its sha256 in {SUMS} (the bundle was changed "
                              "or damaged); make the bundle again.")
    try:
        manifest = json.loads((root / MANIFEST).read_text(encoding="utf-8"))
        data = json.loads((root / DATA).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise GoldenError(f"{flag} {root}: cannot read the bundle ({exc}).") from None
    if not isinstance(manifest, dict) or manifest.get("format") != fmt:
        raise GoldenError(f"{flag} {root} is not a {kind} (manifest format "
                          f"{manifest.get('format') if isinstance(manifest, dict) else None!r}).")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise GoldenError(f"{flag} {root} is bundle format {manifest.get('format_version')}; this difforge reads "
                          f"format {FORMAT_VERSION}: make the bundle again with this version.")
    made_by = str(manifest.get("difforge", "?"))
    if not compatible_version(made_by):
        raise GoldenError(f"{flag} {root} was made by difforge {made_by}; this is difforge {__version__} (another "
                          "release line may compute differently): make the bundle again.")
    try:
        tensors = load_file(str(root / TENSORS))
    except (SafetensorError, OSError, ValueError) as exc:
        raise GoldenError(f"{flag} {root}: {TENSORS} cannot be read ({exc}).") from None
    return Bundle(root, manifest, data, tensors)


def is_bundle_folder(folder: Path) -> bool:
    """True when ``folder`` is a golden or capture bundle that lists exactly its files (so replacing it loses nothing)."""
    try:
        listed = _listed(folder)
    except GoldenError:
        return False
    try:
        if MANIFEST not in listed or sha256_file(folder / MANIFEST) != listed[MANIFEST]:
            return False
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(manifest, dict) or manifest.get("format") not in (FORMAT, CAPTURE_FORMAT):
        return False
    return set(_files(folder)) == {*listed, SUMS}


__all__ = [
    "BLOCK_SAMPLE",
    "CAPTURE_FORMAT",
    "FULL_LIMIT",
    "SAMPLE",
    "Bundle",
    "BundleWriter",
    "GoldenError",
    "Reducer",
    "image_hash",
    "open_bundle",
    "weight_hashes",
]
