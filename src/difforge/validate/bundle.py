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
from ..runtime.hashes import file_sha256, model_file_hashes
from ..runtime.record import sha256_file
from ..version import __version__
from .schema import (
    CAPTURE_DATA,
    CAPTURE_MANIFEST,
    GOLDEN_DATA,
    GOLDEN_MANIFEST,
    SchemaError,
    check,
    referenced_files,
)

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


def default_limits() -> dict[str, int]:
    """The sampling limits a :class:`Reducer` starts from (the module's constants, read when it is made); a
    bundle stores the ones it was written with."""
    return {"full": FULL_LIMIT, "sample": SAMPLE, "block_full": BLOCK_FULL, "block_sample": BLOCK_SAMPLE}


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

    def __init__(self, plans: dict[str, torch.Tensor] | None = None, frozen: bool = False,
                 limits: dict[str, int] | None = None) -> None:
        self.plans: dict[str, torch.Tensor] = dict(plans or {})
        self.frozen = frozen
        lim = {**default_limits(), **(limits or {})}
        #: This bundle's limits (a capture under ``--max-bytes`` keeps fewer block elements): stored with the
        #: plans, so the judge cuts its side exactly where the bundle's writer cut.
        self.full, self.sample = int(lim["full"]), int(lim["sample"])
        self.block_full, self.block_sample = int(lim["block_full"]), int(lim["block_sample"])

    @property
    def limits(self) -> dict[str, int]:
        return {"full": self.full, "sample": self.sample, "block_full": self.block_full,
                "block_sample": self.block_sample}

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
        if not isinstance(t, torch.Tensor) or t.numel() <= self.full:
            return t
        shape = tuple(t.shape)
        last = shape[-1] if t.dim() >= 2 else 0
        if 0 < last <= self.sample // 16:
            rows = t.numel() // last
            idx = self._plan("rows", shape, rows, max(1, self.sample // last))
            return t if idx is None else t.reshape(rows, last)[idx].contiguous()
        idx = self._plan("elements", shape, t.numel(), self.sample)
        return t if idx is None else t.reshape(-1)[idx].contiguous()

    def block(self, flat: torch.Tensor) -> torch.Tensor:
        """A flattened transformer-block output: whole up to BLOCK_FULL, else BLOCK_SAMPLE elements."""
        if flat.numel() <= self.block_full:
            return flat
        idx = self._plan("block", (flat.numel(),), flat.numel(), self.block_sample)
        return flat if idx is None else flat[idx].contiguous()


# ---- nested values <-> JSON + tensors ---------------------------------------------------------
def _content(t: torch.Tensor) -> tuple[str, tuple[int, ...], str]:
    """A stored tensor's identity by content (dtype, shape, sha256 of its bytes)."""
    import hashlib

    raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return str(t.dtype), tuple(t.shape), hashlib.sha256(raw).hexdigest()


def pack(value: Any, key: str, tensors: dict[str, torch.Tensor],
         seen: dict[tuple[str, tuple[int, ...], str], str] | None = None) -> Any:
    """``value`` as JSON, its tensors moved into ``tensors`` under keys derived from ``key``.

    ``seen`` (content -> name): a tensor equal in dtype, shape and bytes to one already stored is stored once and
    named twice (a run's step inputs are also its teacher-forcing states; a step's outputs, the teacher of its
    post-network step): the reader gets equal tensors, the bundle holds their bytes once."""
    if isinstance(value, torch.Tensor):
        t = value.detach().to("cpu").contiguous().clone()
        ident = _content(t) if seen is not None else None
        if ident is not None and ident in seen and seen[ident] in tensors:
            return {"__tensor__": seen[ident]}
        name = key
        n = 1
        while name in tensors:
            n += 1
            name = f"{key}#{n}"
        tensors[name] = t
        if ident is not None:
            seen[ident] = name
        return {"__tensor__": name}
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise TypeError(f"cannot store a dict with non-string keys at {key}")
        return {"__dict__": {k: pack(v, f"{key}/{k}", tensors, seen) for k, v in value.items()}}
    if isinstance(value, list | tuple):
        return {"__tuple__" if isinstance(value, tuple) else "__list__":
                [pack(v, f"{key}/{i}", tensors, seen) for i, v in enumerate(value)]}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise TypeError(f"cannot store a {type(value).__name__} at {key}")


#: How deep a bundle's stored structure may nest (the writers nest a few levels; JSON allows ~1000).
MAX_DEPTH = 64


def unpack(obj: Any, tensors: dict[str, torch.Tensor], depth: int = 0) -> Any:
    """``pack``'s JSON back into values, each ``{"__tensor__": name}`` replaced by that tensor.

    A structure that is not ``pack``'s (a name the tensors file lacks, a list where an object belongs, nesting past
    :data:`MAX_DEPTH`) is a ValueError naming it: :func:`open_bundle` turns it into one GoldenError line."""
    if depth > MAX_DEPTH:
        raise ValueError(f"it nests deeper than {MAX_DEPTH} levels")
    if isinstance(obj, dict):
        if "__tensor__" in obj:
            name = obj["__tensor__"]
            if not isinstance(name, str) or name not in tensors:
                raise ValueError(f"it names a tensor {str(name)[:60]!r} that {TENSORS} does not hold")
            return tensors[name]
        for tag, kind in (("__dict__", dict), ("__list__", list), ("__tuple__", list)):
            if tag in obj and not isinstance(obj[tag], kind):
                raise ValueError(f"a {tag} holds {type(obj[tag]).__name__}, not {kind.__name__}")
        if "__dict__" in obj:
            return {k: unpack(v, tensors, depth + 1) for k, v in obj["__dict__"].items()}
        if "__list__" in obj:
            return [unpack(v, tensors, depth + 1) for v in obj["__list__"]]
        if "__tuple__" in obj:
            return tuple(unpack(v, tensors, depth + 1) for v in obj["__tuple__"])
        return {k: unpack(v, tensors, depth + 1) for k, v in obj.items()}  # the bundle's own plain structure
    if isinstance(obj, list):
        return [unpack(v, tensors, depth + 1) for v in obj]
    return obj


# ---- hashes -------------------------------------------------------------------------------------
def weight_hashes(folder: Path, transformer_file: str | None = None) -> dict[str, str]:
    """sha256 of every file of the model folder (relative path -> digest), and of ``--transformer``.

    Every file counts (configs as well as weights), through links and hidden paths alike
    (:func:`~difforge.runtime.hashes.model_file_hashes`, the one rule of a model's identity): a bundle
    made from another model, or the same model with one changed file, is refused.
    """
    out = model_file_hashes(folder)
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
            return f"the model folder has no file {name}, which the bundle's weights list"
        if name not in want:
            return f"the model folder's file {name} is not in the bundle's weights"
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
        self._seen: dict[tuple[str, tuple[int, ...], str], str] = {}

    def put(self, value: Any, key: str) -> Any:
        """Store ``value`` (nested dicts/lists of tensors and scalars); returns its JSON form."""
        before = set(self.tensors)
        packed = pack(value, key, self.tensors, self._seen)
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

    def mark(self) -> tuple[set[str], set[str], int, int]:
        """A point to :meth:`rollback` to (a capture under a byte budget retries its bounded parts)."""
        return set(self.tensors), set(self.reducer.plans), len(self.files), self.bytes

    def rollback(self, mark: tuple[set[str], set[str], int, int]) -> None:
        """Forget the tensors and sampling plans made since ``mark`` (files written since are deleted): a retry
        with other limits makes its own plans."""
        names, plans, files, nbytes = mark
        for name in set(self.tensors) - names:
            del self.tensors[name]
        self._seen = {ident: name for ident, name in self._seen.items() if name in names}
        for key in set(self.reducer.plans) - plans:
            del self.reducer.plans[key]
        for path in self.files[files:]:
            path.unlink(missing_ok=True)
        del self.files[files:]
        self.bytes = nbytes

    def size(self, manifest: dict[str, Any], data: dict[str, Any]) -> int:
        """The bytes :meth:`finish` would write for ``manifest`` and ``data`` (every file of the bundle: the
        safetensors file with its header, the JSON files, the pictures and SHA256SUMS), computed without writing."""
        plans = {k: {"__tensor__": f"plans/{k}"} for k in self.reducer.plans}
        tensors = {**self.tensors, **{f"plans/{k}": v for k, v in self.reducer.plans.items()}}
        data = {**data, "plans": plans, "reducer": self.reducer.limits}
        offset, header = 0, {}
        for name in sorted(tensors):
            t = tensors[name]
            n = t.numel() * t.element_size()
            header[name] = {"dtype": "BF16", "shape": list(t.shape), "data_offsets": [offset, offset + n]}
            offset += n
        head = len(json.dumps(header, separators=(",", ":"))) + 8
        files = [len(json.dumps(data, separators=(",", ":"))),
                 len(json.dumps({**manifest, "bytes": 10**12}, indent=2, default=str)),
                 *(p.stat().st_size for p in self.files)]
        names = [TENSORS, DATA, MANIFEST, *(p.relative_to(self.folder).as_posix() for p in self.files)]
        sums = sum(64 + 2 + len(n) + 1 for n in names)
        return offset + head + 8 + sum(files) + sums

    def _check_size(self) -> None:
        if self.bytes > MAX_BYTES:
            raise GoldenError(f"the golden bundle would exceed {MAX_BYTES >> 30} GiB; use fewer --steps, prompts "
                              "or seeds, or a smaller size.")

    def finish(self, manifest: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
        from safetensors.torch import save_file

        data = {**data, "plans": {k: pack(v, f"plans/{k}", self.tensors) for k, v in self.reducer.plans.items()},
                "reducer": self.reducer.limits}
        manifest = {**manifest, "bytes": self.bytes}
        save_file(self.tensors, str(self.folder / TENSORS))
        (self.folder / DATA).write_text(json.dumps(data, separators=(",", ":")), encoding="utf-8")
        (self.folder / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str), encoding="utf-8")
        names = [TENSORS, DATA, MANIFEST, *(p.relative_to(self.folder).as_posix() for p in self.files)]
        lines = [f"{sha256_file(self.folder / n)}  {n}" for n in sorted(names)]
        (self.folder / SUMS).write_text("\n".join(lines) + "\n", encoding="utf-8")
        return manifest


# ---- reading ------------------------------------------------------------------------------------
class Bundle:
    """A verified bundle: :func:`open_bundle` checked every file's hash, the format and the version."""

    def __init__(self, folder: Path, manifest: dict[str, Any], data: dict[str, Any],
                 tensors: dict[str, torch.Tensor], digest: str = "", digest_checked: bool = False,
                 listed: set[str] | None = None) -> None:
        self.folder = folder
        #: The files SHA256SUMS lists (verified): the only names :meth:`path` hands out (None: not restricted).
        self.listed = listed
        #: The flag that named the bundle (``--golden``, ``--capture``), for messages.
        self.flag = "--golden"
        #: sha256 of the SHA256SUMS this bundle was verified with (:func:`bundle_digest`), and whether the user
        #: gave the same digest from outside the bundle (``--golden-digest``).
        self.digest = digest
        self.digest_checked = digest_checked
        self.manifest = manifest
        self.tensors = tensors
        self.data = unpack(data, tensors)
        self.reducer = Reducer(self.data.get("plans", {}), frozen=True, limits=self.data.get("reducer"))

    def path(self, name: str) -> Path:
        """The file (or folder of files) ``name`` of this bundle: one it lists and verified, inside it after every
        link; a name from ``data.json`` or the manifest that is not (``/etc/passwd``, ``../x``) is a GoldenError."""
        from ..runtime.reading import resolve_inside

        if self.listed is not None and not _holds(self.listed, name):
            raise GoldenError(f"the bundle {self.folder} names {str(name)[:80]!r}, a file it does not hold; make the "
                              "bundle again.")
        return resolve_inside(self.folder, self.folder / name, f"{str(name)[:80]!r} of the bundle {self.folder}",
                              error=GoldenError)

    def image(self, name: str) -> Image.Image:
        with Image.open(self.path(name)) as img:
            return img.convert("RGB")

    def images(self, names: list[str]) -> list[Image.Image]:
        return [self.image(n) for n in names]


def _listed(folder: Path, flag: str = "--golden", maker: str = "difforge golden") -> tuple[dict[str, str], str]:
    """``SHA256SUMS`` as {relative path: sha256}, and the bundle's digest (the sha256 of those very bytes)."""
    import hashlib

    from ..runtime.reading import read_bytes

    try:  # the one reading rule: a FIFO or device named SHA256SUMS is refused, not waited on
        raw = read_bytes(folder / SUMS, limit=MAX_SUMS_BYTES, what=f"{flag} {folder}: {SUMS}", error=GoldenError,
                         root=folder)
        text = raw.decode("utf-8")
    except (GoldenError, UnicodeDecodeError):
        kind = "golden bundle" if flag == "--golden" else "capture bundle"
        raise GoldenError(f"{flag} {folder} is not a {kind} (no readable {SUMS}); make one with '{maker}'.") from None
    listed: dict[str, str] = {}
    for line in text.splitlines():
        digest, sep, name = line.partition("  ")
        if not sep or len(digest) != 64 or not name or Path(name).is_absolute() or ".." in Path(name).parts:
            raise GoldenError(f"{flag} {folder}: {SUMS} is damaged (line {line[:60]!r}); make the bundle again.")
        listed[name] = digest
    return listed, hashlib.sha256(raw).hexdigest()


def bundle_digest(folder: str | Path) -> str:
    """A bundle's identity: the sha256 of its ``SHA256SUMS``, which names the sha256 of every other file.

    ``difforge golden`` / ``capture`` print it; ``validate --golden-digest`` / ``--capture-digest`` compare it.
    SHA256SUMS alone proves only that a bundle's files agree with each other (whoever edits a file can
    recompute the sums); this digest, kept outside the bundle, proves it is the bundle that was made.
    """
    import hashlib

    return hashlib.sha256((Path(folder) / SUMS).read_bytes()).hexdigest()


def identity_notes(golden: Bundle | None, capture: Bundle | None) -> list[str]:
    """The report's notes on every bundle a validation read whose digest nobody checked (see :func:`identity_note`)."""
    notes = [identity_note(b, flag) for b, flag in ((golden, "--golden"), (capture, "--capture")) if b is not None]
    return [n for n in notes if n]


#: The flag that gives each bundle kind's digest (``--golden G --golden-digest HEX``).
DIGEST_FLAGS = {"--golden": "--golden-digest", "--capture": "--capture-digest"}


def parse_digest(value: Any, flag: str) -> str | None:
    """``--golden-digest`` / ``--capture-digest``: 64 hex digits (``sha256:`` prefix allowed), lower-cased; None
    when not given.  InputError (exit 2) otherwise."""
    if value is None:
        return None
    text = str(value).strip().lower().removeprefix("sha256:")
    if len(text) != 64 or any(c not in "0123456789abcdef" for c in text):
        raise InputError(f"{flag} takes the 64 hex digits 'difforge golden' or 'difforge capture' printed, got "
                         f"{str(value)[:80]!r}.")
    return text


def identity_note(bundle: Bundle, flag: str) -> str | None:
    """The report's line on a bundle whose digest was not compared with one kept outside it (None when it was)."""
    if bundle.digest_checked:
        return None
    kind = "golden bundle" if flag == "--golden" else "capture"
    return (f"the {kind} {bundle.folder} was not checked against an external digest (no {DIGEST_FLAGS[flag]}): its "
            f"{SUMS} shows only that its files agree with one another, and a bundle changed with its sums recomputed "
            f"would pass too; its digest is {bundle.digest}")


def _holds(listed: set[str], name: Any) -> bool:
    """``name`` is a listed file, or a folder of listed files (an msprobe dump)."""
    if not isinstance(name, str) or not name or Path(name).is_absolute() or ".." in Path(name).parts:
        return False
    return name in listed or any(n.startswith(name.rstrip("/") + "/") for n in listed)


#: Most bytes of a bundle's SHA256SUMS, manifest.json and data.json (the tensors are in tensors.safetensors).
MAX_SUMS_BYTES = 16 << 20
MAX_MANIFEST_BYTES = 16 << 20
MAX_DATA_BYTES = 512 << 20


def _read_json(root: Path, name: str, limit: int, flag: str) -> Any:
    """A bundle's JSON file by the one reading rule (a regular file inside the bundle, size-capped)."""
    from ..runtime.reading import read_text

    text = read_text(root / name, limit=limit, what=f"{flag} {root}: {name}", error=GoldenError, root=root)
    try:
        return json.loads(text)
    except ValueError as exc:
        raise GoldenError(f"{flag} {root}: {name} is not JSON ({' '.join(str(exc).split())[:100]}); make the bundle "
                          "again.") from None
    except RecursionError:
        raise GoldenError(f"{flag} {root}: {name} is nested too deeply to be a bundle's; make the bundle "
                          "again.") from None


def _files(folder: Path) -> Iterator[str]:
    for path in folder.rglob("*"):
        if path.is_file() or path.is_symlink():
            yield path.relative_to(folder).as_posix()


def open_bundle(folder: str | Path, fmt: str = FORMAT, flag: str = "--golden", maker: str = "difforge golden",
                digest: str | None = None) -> Bundle:
    """Read and verify a bundle of format ``fmt`` (a golden bundle, or a capture with ``flag`` ``--capture``);
    any damage, tampering or version mismatch is one GoldenError line naming ``flag``.

    ``digest`` (``--golden-digest``, as :func:`parse_digest` returns it): the bundle must be the one whose digest
    its maker printed; compared first, before any other file is read."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    root = Path(folder)
    kind = "golden bundle" if fmt == FORMAT else "capture bundle"
    if not root.is_dir():
        what = "is a file" if root.exists() else "does not exist"
        raise GoldenError(f"{flag} {root} {what}; give the folder '{maker} --out' wrote.")
    listed, own_digest = _listed(root, flag, maker)
    if digest is not None and digest != own_digest:
        raise GoldenError(f"{flag} {root} is not the bundle {DIGEST_FLAGS[flag]} names: its digest is "
                          f"{own_digest[:16]}..., not {digest[:16]}... (it was changed or replaced since '{maker}' "
                          "printed it); use the bundle that was made, or make it again.")
    for name in (MANIFEST, DATA, TENSORS):
        if name not in listed:
            raise GoldenError(f"{flag} {root} is not a {kind} ({name} is not listed in {SUMS}).")
    extra = sorted(set(_files(root)) - set(listed) - {SUMS})
    if extra:
        raise GoldenError(f"{flag} {root} holds a file the bundle does not list ({extra[0]}): it was changed "
                          f"after '{maker}' wrote it; make the bundle again.")
    from ..runtime.reading import resolve_inside

    for name, want in sorted(listed.items()):
        path = root / name
        resolve_inside(root, path, f"{flag} {root}: {name}", error=GoldenError)  # no folder of it links outside
        if path.is_symlink() or not path.is_file():
            raise GoldenError(f"{flag} {root}: {name} is missing; make the bundle again.")
        if sha256_file(path) != want:
            raise GoldenError(f"{flag} {root}: {name} does not match its sha256 in {SUMS} (the bundle was changed "
                              "or damaged); make the bundle again.")
    manifest = _read_json(root, MANIFEST, MAX_MANIFEST_BYTES, flag)
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
    data = _read_json(root, DATA, MAX_DATA_BYTES, flag)
    try:
        tensors = load_file(str(root / TENSORS))
    except (SafetensorError, OSError, ValueError) as exc:
        raise GoldenError(f"{flag} {root}: {TENSORS} cannot be read ({exc}).") from None
    try:
        bundle = Bundle(root, manifest, data, tensors, digest=own_digest, digest_checked=digest is not None,
                        listed=set(listed))
    except (ValueError, TypeError, KeyError, RecursionError) as exc:
        raise GoldenError(f"{flag} {root}: {DATA} is malformed ({' '.join(str(exc).split())[:120]}); make the "
                          "bundle again.") from None
    bundle.flag = flag
    return bundle


def check_shape(bundle: Bundle) -> None:
    """The bundle holds everything a validation reads from it, in the shape it reads it (:mod:`.schema`), and every
    file it names is one it lists.  Called by :func:`~.golden.open_golden` and :func:`~.captured.open_capture`
    before anything loads; one GoldenError line otherwise."""
    golden = bundle.manifest.get("format") == FORMAT
    where = f"{bundle.flag} {bundle.folder}"
    for name, value, spec in ((MANIFEST, bundle.manifest, GOLDEN_MANIFEST if golden else CAPTURE_MANIFEST),
                              (DATA, bundle.data, GOLDEN_DATA if golden else CAPTURE_DATA)):
        try:
            check(value, spec)
        except SchemaError as exc:
            raise GoldenError(f"{where}: {name} is malformed at {exc}; make the bundle again.") from None
    if not golden:
        from ..runtime.record import RunRecord

        try:
            RunRecord.from_dict(bundle.data["load_record"])
        except (ValueError, TypeError, KeyError) as exc:
            raise GoldenError(f"{where}: {DATA} is malformed (its load record: {' '.join(str(exc).split())[:100]}); "
                              "make the bundle again.") from None
    for name in referenced_files(bundle.manifest, bundle.data):
        if not _holds(bundle.listed or set(), name):
            raise GoldenError(f"{where} names {str(name)[:80]!r}, a file it does not hold (every file it names must "
                              f"be one its {SUMS} lists); make the bundle again.")


def is_bundle_folder(folder: Path) -> bool:
    """True when ``folder`` is a golden or capture bundle that lists exactly its files (so replacing it loses nothing)."""
    try:
        listed, _digest = _listed(folder)
    except GoldenError:
        return False
    import hashlib

    from ..runtime.reading import read_bytes

    try:
        raw = read_bytes(folder / MANIFEST, limit=MAX_MANIFEST_BYTES, what=str(folder / MANIFEST), error=GoldenError,
                         root=folder)
        if MANIFEST not in listed or hashlib.sha256(raw).hexdigest() != listed[MANIFEST]:
            return False
        manifest = json.loads(raw)
    except (GoldenError, ValueError, RecursionError):
        return False
    if not isinstance(manifest, dict) or manifest.get("format") not in (FORMAT, CAPTURE_FORMAT):
        return False
    return set(_files(folder)) == {*listed, SUMS}


__all__ = [
    "BLOCK_SAMPLE",
    "CAPTURE_FORMAT",
    "FULL_LIMIT",
    "default_limits",
    "SAMPLE",
    "Bundle",
    "BundleWriter",
    "GoldenError",
    "Reducer",
    "bundle_digest",
    "check_shape",
    "identity_note",
    "identity_notes",
    "parse_digest",
    "image_hash",
    "open_bundle",
    "weight_hashes",
]
