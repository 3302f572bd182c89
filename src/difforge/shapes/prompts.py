"""Prompt sets: prompts with the attributes a picture must show, in one small JSON file.

Why a file format: the semantic validation rung scores the device run and the reference over the same
prompts.  For the shapes models the sets come from the world's held-out split
(:func:`heldout_caption_set`, :func:`heldout_edit_set`); for any other model a person writes one by
hand with the attributes they expect, and :func:`score` judges both the same way.

The format (``difforge-prompt-set/1``)::

    {"format": "difforge-prompt-set/1", "kind": "caption" | "edit", "name": "optional",
     "items": [{"id": "c000", "prompt": "a red circle on a blue background",
                "expect": {"background": "blue", "items": [{"shape": "circle", "colour": "red"}]},
                "image": "images/e000.png",   # edit sets only: the source picture, relative
                "meta": {...}}]}              # optional, never interpreted

An expected item may leave out ``shape``, ``colour`` or ``position`` (not checked); ``background`` may
be null (not checked).  The count of items is always checked.  Loading is defensive: JSON only, at
most 4 MiB and 10 000 items, known keys only, names from the world's vocabulary, image paths relative
PNG files inside the set's folder; any fault is one :class:`~difforge.errors.InputError` sentence.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from difforge.errors import InputError, OutputError
from difforge.shapes.checker import (
    Expectation,
    Score,
    edit_expectation,
    expectation_from_json,
    score_caption,
)
from difforge.shapes.world import caption, edits, render, scenes

FORMAT = "difforge-prompt-set/1"
KINDS = ("caption", "edit")
FILE_NAME = "prompts.json"
MAX_BYTES = 4 * 1024 * 1024
MAX_ITEMS = 10_000
MAX_PROMPT_CHARS = 2_000
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@dataclass(frozen=True)
class PromptItem:
    """One prompt and what its picture must show.  ``image`` is the source picture of an edit,
    relative to the set's folder; ``source`` holds it in memory for a set not yet written."""

    id: str
    prompt: str
    expect: Expectation
    image: str | None = None
    meta: dict = field(default_factory=dict, hash=False, compare=False)
    source: np.ndarray | None = field(default=None, hash=False, compare=False, repr=False)


@dataclass(frozen=True)
class PromptSet:
    """A kind (``caption`` or ``edit``) and its items; ``root`` is the folder it was loaded from."""

    kind: str
    items: tuple[PromptItem, ...]
    name: str | None = None
    root: Path | None = None

    def source_image(self, item: PromptItem) -> np.ndarray:
        """An edit item's source picture as H x W x 3 uint8 (from memory, else from the folder)."""
        if item.source is not None:
            return item.source
        if item.image is None:
            raise InputError(f"prompt {item.id!r} has no source image; only edit prompts carry one.")
        if self.root is None:
            raise InputError(f"prompt {item.id!r} names {item.image!r} but the set was not loaded from a folder.")
        path = _inside(self.root, item.image, item.id)
        try:
            with Image.open(path) as im:
                return np.asarray(im.convert("RGB"))
        except (OSError, ValueError) as exc:
            raise InputError(f"the source image {path} of prompt {item.id!r} cannot be read ({exc}).") from exc

    def to_json(self) -> dict:
        out: dict = {"format": FORMAT, "kind": self.kind}
        if self.name:
            out["name"] = self.name
        rows = []
        for it in self.items:
            row: dict = {"id": it.id, "prompt": it.prompt, "expect": it.expect.to_json()}
            if it.image is not None:
                row["image"] = it.image
            if it.meta:
                row["meta"] = it.meta
            rows.append(row)
        out["items"] = rows
        return out


def score(image: np.ndarray | Image.Image, item: PromptItem) -> Score:
    """Score a generated picture against a prompt item: the checker against the item's expectation,
    for caption and edit items alike (an edit's expectation describes its target, with the moved
    item's position for a move), so a hand-written set is judged exactly like a generated one."""
    return score_caption(image, item.expect)


# ---- reading ----------------------------------------------------------------------------------------
def _inside(root: Path, rel: str, item_id: str) -> Path:
    """The path ``rel`` names under ``root``, refusing anything that resolves outside it."""
    if not isinstance(rel, str) or not rel or Path(rel).is_absolute() or "\\" in rel:
        raise InputError(f"prompt {item_id!r}: 'image' must be a relative path inside the set's folder.")
    base = root.resolve()
    path = (base / rel).resolve()
    if not path.is_relative_to(base):
        raise InputError(f"prompt {item_id!r}: the image {rel!r} resolves outside the set's folder {base}.")
    return path


def _bad(path: Path, why: str) -> InputError:
    return InputError(f"the prompt set {path} is not usable: {why}.")


#: Most pixels of an edit set's source picture (the shapes world draws 64 x 64; a photo set stays far below).
MAX_SOURCE_PIXELS = 4096 * 4096


def _check_decodes(p: Path, path: Path, image: str, item_id: str) -> None:
    """An edit item's source picture decodes whole now, so a damaged one is bad input (exit 2) before the run,
    not a semantic FAIL blamed on the device halfway through it."""
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as im:
                if im.width * im.height > MAX_SOURCE_PIXELS:
                    raise _bad(p, f"the image {image!r} of prompt {item_id!r} is {im.width}x{im.height}, more than "
                                  f"{MAX_SOURCE_PIXELS} pixels")
                im.load()
    except InputError:
        raise
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise _bad(p, f"the image {image!r} of prompt {item_id!r} cannot be decoded "
                      f"({' '.join(str(exc).split())[:120]})") from None


def load_prompt_set(path: str | Path) -> PromptSet:
    """Read a prompt set from its JSON file or from a folder holding ``prompts.json``."""
    p = Path(path)
    if p.is_dir():
        p = p / FILE_NAME
    if not p.is_file():
        raise InputError(f"no prompt set at {p}; give a {FILE_NAME} file or the folder that holds one.")
    size = p.stat().st_size
    if size > MAX_BYTES:
        raise _bad(p, f"it is {size} bytes, more than the {MAX_BYTES} a prompt set may have")
    try:
        data = json.loads(p.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _bad(p, f"it is not UTF-8 JSON ({exc})") from exc
    except RecursionError:  # [[[[...]]]] thousands deep: Python's JSON parser recurses once per level
        raise _bad(p, "it is nested too deeply to be a prompt set") from None
    if not isinstance(data, dict):
        raise _bad(p, "the top level must be a JSON object")
    if data.get("format") != FORMAT:
        raise _bad(p, f"'format' must be {FORMAT!r}, not {data.get('format')!r}")
    extra = set(data) - {"format", "kind", "name", "items"}
    if extra:
        raise _bad(p, f"unknown top-level keys {sorted(extra)}")
    kind = data.get("kind")
    if kind not in KINDS:
        raise _bad(p, f"'kind' must be 'caption' or 'edit', not {kind!r}")
    name = data.get("name")
    if name is not None and not isinstance(name, str):
        raise _bad(p, "'name' must be a string")
    rows = data.get("items")
    if not isinstance(rows, list) or not rows:
        raise _bad(p, "'items' must be a non-empty list")
    if len(rows) > MAX_ITEMS:
        raise _bad(p, f"it has {len(rows)} items, more than {MAX_ITEMS}")
    root = p.parent
    items: list[PromptItem] = []
    seen: set[str] = set()
    for n, row in enumerate(rows):
        where = f"item {n}"
        if not isinstance(row, dict):
            raise _bad(p, f"{where} is not an object")
        extra = set(row) - {"id", "prompt", "expect", "image", "meta"}
        if extra:
            raise _bad(p, f"{where} has unknown keys {sorted(extra)}")
        item_id = row.get("id")
        if not isinstance(item_id, str) or not _ID.match(item_id):
            raise _bad(p, f"{where} needs an 'id' of 1-64 letters, digits, '_', '-' or '.'")
        if item_id in seen:
            raise _bad(p, f"the id {item_id!r} appears twice")
        seen.add(item_id)
        prompt = row.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip() or len(prompt) > MAX_PROMPT_CHARS:
            raise _bad(p, f"prompt {item_id!r} needs a non-empty 'prompt' of at most {MAX_PROMPT_CHARS} characters")
        try:
            expect = expectation_from_json(row.get("expect"))
        except ValueError as exc:
            raise _bad(p, f"prompt {item_id!r}: {exc}") from exc
        meta = row.get("meta", {})
        if not isinstance(meta, dict):
            raise _bad(p, f"prompt {item_id!r}: 'meta' must be an object")
        image = row.get("image")
        if kind == "edit":
            if image is None:
                raise _bad(p, f"edit prompt {item_id!r} needs an 'image' (its source picture)")
            img_path = _inside(root, image, item_id)
            if not img_path.is_file():
                raise _bad(p, f"the image {image!r} of prompt {item_id!r} is not a file")
            with img_path.open("rb") as fh:
                if fh.read(8) != _PNG_MAGIC:
                    raise _bad(p, f"the image {image!r} of prompt {item_id!r} is not a PNG")
            _check_decodes(p, img_path, image, item_id)
        elif image is not None:
            raise _bad(p, f"caption prompt {item_id!r} has an 'image'; only edit sets carry source pictures")
        items.append(PromptItem(item_id, prompt, expect, image, meta))
    return PromptSet(kind, tuple(items), name, root)


# ---- writing ----------------------------------------------------------------------------------------
def write_prompt_set(folder: str | Path, prompt_set: PromptSet) -> Path:
    """Write ``prompts.json`` and the source pictures of edit items (as PNG, at their ``image`` paths,
    from memory or from the folder a loaded set came from) into ``folder``; returns the JSON file's
    path.  The written set loads back equal."""
    root = Path(folder)
    try:
        root.mkdir(parents=True, exist_ok=True)
        for it in prompt_set.items:
            if it.image is None:
                continue
            target = _inside(root, it.image, it.id)
            if it.source is None and prompt_set.root is not None and _inside(prompt_set.root, it.image, it.id) == target:
                continue  # rewriting a loaded set in place: the picture is already there
            picture = prompt_set.source_image(it)  # from memory, or from the folder it was loaded from
            target.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(np.asarray(picture, dtype=np.uint8)).save(target, format="PNG")
        out = root / FILE_NAME
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(json.dumps(prompt_set.to_json(), indent=1) + "\n", encoding="utf-8")
        tmp.replace(out)
    except OSError as exc:
        raise OutputError(f"cannot write the prompt set into {root} ({exc.strerror or exc}).") from exc
    return out


# ---- the world's held-out sets ------------------------------------------------------------------------
#: The held-out sets are drawn from this many draws (or ``n``, when more), then ordered so every distinct
#: prompt comes before any repeat: a small set (a contact sheet's 9 tiles, --quick's 4 semantic prompts)
#: shows as many different prompts as the draws hold, and the 40-prompt set stays the same 40 draws.
POOL = 40


def _distinct_first(keys: list[str]) -> list[int]:
    """Indices of ``keys`` in rounds: the first of each distinct key (in first-seen order), then the second
    of each, and so on - every prompt appears once before any appears twice."""
    groups: dict[str, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    order: list[int] = []
    depth = 0
    while len(order) < len(keys):
        order += [g[depth] for g in groups.values() if depth < len(g)]
        depth += 1
    return order


def heldout_caption_set(n: int = 40, seed: int = 0, *, size: int = 64, max_items: int = 1) -> PromptSet:
    """``n`` captions of held-out scenes (each shows a combination training never does), distinct captions
    first (:data:`POOL`); ``meta["index"]`` is the scene's draw."""
    drawn = scenes(seed, max(n, POOL), size=size, max_items=max_items, split="heldout")
    rows = []
    for i, k in enumerate(_distinct_first([caption(s) for s in drawn])[:n]):
        scene = drawn[k]
        rows.append(
            PromptItem(
                f"c{i:03d}",
                caption(scene),
                Expectation.from_scene(scene),
                meta={"seed": seed, "index": k, "size": size},
            )
        )
    return PromptSet("caption", tuple(rows), f"shapes held-out captions (seed {seed}, n {n})")


def heldout_edit_set(n: int = 40, seed: int = 0, *, size: int = 64) -> PromptSet:
    """``n`` held-out edits, distinct instructions first (:data:`POOL`): the source render (in memory,
    written by :func:`write_prompt_set`), the instruction, and the target's expectation; ``meta`` keeps the
    draw's index, the kind and both captions."""
    drawn = edits(seed, max(n, POOL), size=size, split="heldout")
    rows = []
    for i, k in enumerate(_distinct_first([e.instruction for e in drawn])[:n]):
        edit = drawn[k]
        rows.append(
            PromptItem(
                f"e{i:03d}",
                edit.instruction,
                edit_expectation(edit),
                image=f"images/e{i:03d}.png",
                meta={
                    "seed": seed,
                    "index": k,
                    "size": size,
                    "edit": edit.kind,
                    "source": caption(edit.source),
                    "target": caption(edit.target),
                },
                source=render(edit.source),
            )
        )
    return PromptSet("edit", tuple(rows), f"shapes held-out edits (seed {seed}, n {n})")
