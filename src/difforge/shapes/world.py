"""The shapes world: seeded scenes of one or two flat shapes on a flat background.

Why it exists: models with random weights draw coloured noise, so a port that scrambles meaning can
still pass every numeric check.  Tiny models trained on this world draw pictures whose meaning a
rule-based checker (:mod:`difforge.shapes.checker`) can read back, so "does the ported model still do
what it was asked" becomes a number.

Everything here is integer arithmetic on numpy arrays (no antialiasing, no floats in drawing or in
sampling: only ``Generator.integers``), so a seed gives byte-identical images on every CPU.  The
vocabulary is deliberately tiny (:data:`VOCAB`, 27 words) so a tiny text encoder can learn it.

Geometry conventions: pixel ``i`` covers ``[i, i+1)``; an item's ``size`` is the (even) side of its
square bounding box and ``(cx, cy)`` is the box centre, so the box is ``[cx - size/2, cx + size/2)``.

Caption scenes place items anywhere, at any size in :func:`size_range`; edit scenes (sources and
targets) put every item at one size (:func:`edit_item_size`) on one of the five :func:`anchor` points,
so two items sit on opposite sides (left/right or top/bottom).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace

import numpy as np

SHAPES: tuple[str, ...] = ("circle", "square", "triangle", "cross")
"""Chosen so that two moment features separate them at 64 px: the fill of the minimum-area bounding
rectangle (square 1, circle pi/4, triangle 1/2, cross 5/9) and solidity (area over convex-hull area:
cross 5/7, the others close to 1)."""

PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 220),
    "yellow": (240, 210, 40),
    "white": (240, 240, 240),
    "black": (25, 25, 25),
}
"""Named colours and the RGB the renderer paints; far apart in CIELAB (the closest pair is more than
60 Delta-E apart) so nearest-colour naming survives noise, blur, jitter and JPEG."""

COLOURS: tuple[str, ...] = tuple(PALETTE)
BACKGROUNDS: tuple[str, ...] = COLOURS
POSITIONS: tuple[str, ...] = ("left", "right", "top", "bottom", "centre")
EDIT_KINDS: tuple[str, ...] = ("recolour", "background", "move", "add", "remove", "reshape")
SPLITS: tuple[str, ...] = ("train", "heldout")
MAX_ITEMS = 2

_TEMPLATE_WORDS = ("a", "and", "on", "background", "make", "the", "move", "to", "add", "remove", "turn", "into")
VOCAB: tuple[str, ...] = _TEMPLATE_WORDS + SHAPES + COLOURS + POSITIONS
"""Every word a caption or an edit instruction can contain (27 words; no punctuation)."""


# ---- the scene model --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Item:
    """One flat shape: its bounding box is the square of side ``size`` centred at ``(cx, cy)``."""

    shape: str
    colour: str
    cx: int
    cy: int
    size: int

    def box(self) -> tuple[int, int, int, int]:
        """(left, top, right, bottom), right/bottom exclusive."""
        half = self.size // 2
        return self.cx - half, self.cy - half, self.cx - half + self.size, self.cy - half + self.size


@dataclass(frozen=True)
class Scene:
    """A background colour and one or two non-overlapping items on a ``size`` x ``size`` canvas."""

    background: str
    items: tuple[Item, ...]
    size: int = 64

    def __post_init__(self) -> None:
        # A scene that breaks the world's rules would train a model on pictures the checker cannot
        # read back, so bad scenes fail at construction, not later.
        if self.background not in PALETTE:
            raise ValueError(f"unknown background colour {self.background!r}; use one of {', '.join(COLOURS)}")
        if not 1 <= len(self.items) <= MAX_ITEMS:
            raise ValueError(f"a scene holds 1 to {MAX_ITEMS} items, not {len(self.items)}")
        if self.size < 32:
            raise ValueError(f"scene size {self.size} is too small; use 32 or more")
        for item in self.items:
            if item.shape not in SHAPES:
                raise ValueError(f"unknown shape {item.shape!r}; use one of {', '.join(SHAPES)}")
            if item.colour not in PALETTE:
                raise ValueError(f"unknown colour {item.colour!r}; use one of {', '.join(COLOURS)}")
            if item.colour == self.background:
                raise ValueError(f"the {item.shape} has the background's colour {item.colour}")
            if item.size < 4 or item.size % 2:
                raise ValueError(f"item size {item.size} must be even and at least 4")
            left, top, right, bottom = item.box()
            if left < 0 or top < 0 or right > self.size or bottom > self.size:
                raise ValueError(f"the {item.shape} at ({item.cx}, {item.cy}) leaves the {self.size} px canvas")
        if len(self.items) == 2:
            a, b = self.items
            if a.shape == b.shape:
                raise ValueError("the two items of a scene must have different shapes (edits name them by shape)")
            if _overlaps(a, b, 0):
                raise ValueError("the two items of a scene overlap")

    def item(self, shape: str) -> Item:
        """The scene's item of this shape (shapes are unique within a scene)."""
        for it in self.items:
            if it.shape == shape:
                return it
        raise KeyError(shape)


@dataclass(frozen=True)
class Edit:
    """An instruction that turns ``source`` into ``target`` (one attribute of one thing changes)."""

    kind: str
    instruction: str
    source: Scene
    target: Scene


# ---- geometry ---------------------------------------------------------------------------------------
def _margin(size: int) -> int:
    """Free pixels kept between an item and the canvas edge (so border pixels are background)."""
    return max(2, size // 24)


def _gap(size: int) -> int:
    """Free pixels kept between two items (so blur in a generated image does not merge them)."""
    return max(4, size // 10)


def size_range(size: int) -> tuple[int, int]:
    """Smallest and largest (even) item size on a canvas of ``size`` px: 14..24 at 64 px."""
    return 2 * ((11 * size + 50) // 100), 2 * ((3 * size) // 16)


def _overlaps(a: Item, b: Item, gap: int) -> bool:
    """Whether the bounding boxes, each grown by ``gap`` px, intersect."""
    al, at, ar, ab = a.box()
    bl, bt, br, bb = b.box()
    return not (ar + gap <= bl or br + gap <= al or ab + gap <= bt or bb + gap <= at)


def position_of(cx: float, cy: float, width: int, height: int | None = None) -> str:
    """Name the region a point falls in: ``centre`` inside the middle third square, else the side the
    point leans to most (ties go to left/right).  The checker uses the same rule on found blobs."""
    height = width if height is None else height
    dx = (cx - width / 2) / width
    dy = (cy - height / 2) / height
    if max(abs(dx), abs(dy)) < 1 / 6:
        return "centre"
    if abs(dx) >= abs(dy):
        return "left" if dx < 0 else "right"
    return "top" if dy < 0 else "bottom"


def anchor(position: str, size: int) -> tuple[int, int]:
    """Where a moved item's box centre lands: a quarter of the canvas in from the named side, so the
    point sits well inside its region (1/12 of the canvas from the nearest boundary)."""
    q, h = size // 4, size // 2
    return {"left": (q, h), "right": (size - q, h), "top": (h, q), "bottom": (h, size - q), "centre": (h, h)}[
        position
    ]


def mask(item: Item, size: int) -> np.ndarray:
    """Boolean ``size`` x ``size`` mask of the item, computed in exact integer (half-pixel) units."""
    out = np.zeros((size, size), dtype=bool)
    left, top, right, bottom = item.box()
    x0, y0, x1, y1 = max(left, 0), max(top, 0), min(right, size), min(bottom, size)
    if x0 >= x1 or y0 >= y1:
        return out
    y, x = np.mgrid[y0:y1, x0:x1].astype(np.int64)  # only the box: every shape lies inside it
    s = item.size
    # doubled coordinates: pixel centre 2x+1, box centre 2*cx
    dx2 = 2 * x + 1 - 2 * item.cx
    dy2 = 2 * y + 1 - 2 * item.cy
    if item.shape == "square":
        inside = np.ones_like(dx2, dtype=bool)
    elif item.shape == "circle":
        inside = dx2 * dx2 + dy2 * dy2 <= s * s
    elif item.shape == "triangle":
        # apex at the top centre, base along the bottom: half-width at row centre t+1/2 is (t+1/2)/2
        inside = 2 * np.abs(dx2) <= 2 * (y - top) + 1
    elif item.shape == "cross":
        # a plus sign whose arms are a third of the box wide
        inside = (3 * np.abs(dx2) <= s) | (3 * np.abs(dy2) <= s)
    else:
        raise ValueError(f"unknown shape {item.shape!r}")
    out[y0:y1, x0:x1] = inside
    return out


def render(scene: Scene) -> np.ndarray:
    """The scene as a ``size`` x ``size`` x 3 uint8 RGB array (flat colours, hard edges)."""
    img = np.empty((scene.size, scene.size, 3), dtype=np.uint8)
    img[:, :] = PALETTE[scene.background]
    for item in scene.items:
        img[mask(item, scene.size)] = PALETTE[item.colour]
    return img


# ---- words ------------------------------------------------------------------------------------------
def ordered(items: tuple[Item, ...]) -> tuple[Item, ...]:
    """Items in reading order (left to right, then top to bottom): the order captions name them."""
    return tuple(sorted(items, key=lambda it: (it.cx, it.cy, it.shape)))


def caption(scene: Scene) -> str:
    """``"a red circle on a blue background"`` / ``"a red circle and a green square on a blue background"``."""
    things = " and ".join(f"a {it.colour} {it.shape}" for it in ordered(scene.items))
    return f"{things} on a {scene.background} background"


def parse_caption(text: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """The background and the (colour, shape) pairs a world caption names: the inverse of
    :func:`caption`, so a caption alone is enough to score a picture.  Raises ValueError otherwise."""
    words = text.lower().split()
    if len(words) < 7 or words[-4:-1] != ["on", "a", words[-2]] or words[-1] != "background":
        raise ValueError(f"{text!r} is not a shapes-world caption ('a <colour> <shape> ... on a <colour> background')")
    background = words[-2]
    body = words[:-4]
    things: list[tuple[str, str]] = []
    while body:
        if len(body) < 3 or body[0] != "a" or body[1] not in PALETTE or body[2] not in SHAPES:
            raise ValueError(f"{text!r} is not a shapes-world caption ('a <colour> <shape> ... on a <colour> background')")
        things.append((body[1], body[2]))
        body = body[3:]
        if body:
            if body[0] != "and":
                raise ValueError(f"{text!r} is not a shapes-world caption (items are joined by 'and')")
            body = body[1:]
    if background not in PALETTE or not 1 <= len(things) <= MAX_ITEMS:
        raise ValueError(f"{text!r} is not a shapes-world caption (unknown background or too many items)")
    return background, tuple(things)


# ---- the split --------------------------------------------------------------------------------------
Combo = tuple[str, str, str]  # (shape, colour, background)


def _all_combos() -> list[Combo]:
    return [(s, c, b) for s in SHAPES for c in COLOURS for b in BACKGROUNDS if c != b]


def _heldout_combos(per_shape: int = 3) -> frozenset[Combo]:
    def digest(k: Combo) -> str:
        return hashlib.sha256("/".join(k).encode()).hexdigest()

    picked: list[Combo] = []
    for shape in SHAPES:
        picked += sorted((k for k in _all_combos() if k[0] == shape), key=digest)[:per_shape]
    return frozenset(picked)


HELDOUT_COMBOS: frozenset[Combo] = _heldout_combos()
"""The 12 of the 120 (shape, colour, background) combinations that only the held-out split shows: for
each shape, the 3 whose ``sha256("shape/colour/background")`` hex digest sorts first.  Every shape,
colour, background and every pair of them still appears in training, so a held-out caption asks for a
new combination of known parts."""


def combos(scene: Scene) -> set[Combo]:
    """The (shape, colour, background) combination of each item."""
    return {(it.shape, it.colour, scene.background) for it in scene.items}


def is_heldout(scene: Scene) -> bool:
    """A scene is held out when any of its items shows a held-out combination."""
    return bool(combos(scene) & HELDOUT_COMBOS)


def _check_split(split: str | None) -> None:
    if split is not None and split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; use 'train' or 'heldout'")


# ---- sampling ---------------------------------------------------------------------------------------
def _pick(rng: np.random.Generator, options: tuple[str, ...] | list[str]) -> str:
    return options[int(rng.integers(len(options)))]


def _place(rng: np.random.Generator, size: int, item_size: int) -> tuple[int, int]:
    half = item_size // 2
    lo, hi = _margin(size) + half, size - _margin(size) - half
    return int(rng.integers(lo, hi + 1)), int(rng.integers(lo, hi + 1))


def _sample_item(
    rng: np.random.Generator, size: int, *, shape: str, colour: str, others: tuple[Item, ...] = ()
) -> Item | None:
    """An item of this shape and colour at a random free place, or None after a few tries."""
    lo, hi = size_range(size)
    for _ in range(50):
        item_size = 2 * int(rng.integers(lo // 2, hi // 2 + 1))
        cx, cy = _place(rng, size, item_size)
        item = Item(shape, colour, cx, cy, item_size)
        if not any(_overlaps(item, o, _gap(size)) for o in others):
            return item
    return None


def edit_item_size(size: int) -> int:
    """The one item size of edit scenes: the largest caption size (24 px at 64 px)."""
    return size_range(size)[1]


def _anchored_item(
    rng: np.random.Generator, size: int, *, shape: str, colour: str, others: tuple[Item, ...] = ()
) -> Item | None:
    """An item of this shape and colour, at the edit size, centred on a free anchor (None if none is
    free).  Edit scenes are laid out on the five anchors because an edit model must copy everything
    the instruction does not name: with free placement and sizes, a model small enough to train on two
    CPU cores copied pictures as speckled blobs (2 of 40 held-out edits right); on anchors the copy is
    the same few layouts, and every kind keeps its meaning (a move already lands on an anchor)."""
    side = edit_item_size(size)
    free = []
    for position in POSITIONS:
        cx, cy = anchor(position, size)
        item = Item(shape, colour, cx, cy, side)
        if not any(_overlaps(item, o, _gap(size)) for o in others):
            free.append(item)
    return free[int(rng.integers(len(free)))] if free else None


def _any_scene(
    rng: np.random.Generator, size: int, n_items: int, first: Combo | None = None, *, anchored: bool = False
) -> Scene:
    """A random valid scene of ``n_items`` items (the first one of a given combination if asked);
    ``anchored``: every item at the edit size on an anchor (:func:`_anchored_item`)."""
    place = _anchored_item if anchored else _sample_item
    while True:
        if first is None:
            background = _pick(rng, BACKGROUNDS)
            shape = _pick(rng, SHAPES)
            colour = _pick(rng, [c for c in COLOURS if c != background])
        else:
            shape, colour, background = first
        items: list[Item] = []
        it = place(rng, size, shape=shape, colour=colour)
        if it is None:
            continue
        items.append(it)
        if n_items == 2:
            shape2 = _pick(rng, [s for s in SHAPES if s != shape])
            colour2 = _pick(rng, [c for c in COLOURS if c != background])
            it2 = place(rng, size, shape=shape2, colour=colour2, others=tuple(items))
            if it2 is None:
                continue
            items.append(it2)
        return Scene(background, ordered(tuple(items)), size)


def sample_scene(
    rng: np.random.Generator, *, size: int = 64, max_items: int = 1, split: str | None = None
) -> Scene:
    """One random scene of 1..``max_items`` items.  ``split=None`` draws from every combination;
    ``"train"`` never shows a held-out combination; ``"heldout"`` always shows one (its first item)."""
    _check_split(split)
    if not 1 <= max_items <= MAX_ITEMS:
        raise ValueError(f"max_items must be 1 or {MAX_ITEMS}")
    n_items = 1 if max_items == 1 else int(rng.integers(1, max_items + 1))
    if split == "heldout":
        first = sorted(HELDOUT_COMBOS)[int(rng.integers(len(HELDOUT_COMBOS)))]
        return _any_scene(rng, size, n_items, first)
    while True:
        scene = _any_scene(rng, size, n_items)
        if split != "train" or not is_heldout(scene):
            return scene


_NAMESPACE = {("scenes", "train"): 0, ("scenes", "heldout"): 1, ("edits", "train"): 2, ("edits", "heldout"): 3}


def _rng(seed: int, what: str, split: str) -> np.random.Generator:
    """Each (what, split) has its own stream, so train and held-out never share a draw for a seed."""
    _check_split(split)
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, not {seed!r}")
    return np.random.default_rng([seed, _NAMESPACE[(what, split)]])


def scenes(seed: int, n: int, *, size: int = 64, max_items: int = 1, split: str = "train") -> list[Scene]:
    """``n`` scenes of a split, the same for the same arguments on every machine."""
    rng = _rng(seed, "scenes", split)
    return [sample_scene(rng, size=size, max_items=max_items, split=split) for _ in range(n)]


# ---- edits ------------------------------------------------------------------------------------------
def _edit_once(rng: np.random.Generator, size: int, kind: str) -> Edit | None:
    """One try at an edit of this kind, or None when the random source does not allow it."""
    gap = _gap(size)
    if kind == "remove":
        src = _any_scene(rng, size, 2, anchored=True)
        gone = src.items[int(rng.integers(2))]
        tgt = replace(src, items=tuple(it for it in src.items if it is not gone))
        return Edit(kind, f"remove the {gone.shape}", src, tgt)
    if kind == "add":
        src = _any_scene(rng, size, 1, anchored=True)
        (it,) = src.items
        shape = _pick(rng, [s for s in SHAPES if s != it.shape])
        colour = _pick(rng, [c for c in COLOURS if c != src.background])
        # the new item mirrors the old one through the centre, same size: a target a model can learn
        new = Item(shape, colour, size - it.cx, size - it.cy, it.size)
        if _overlaps(new, it, gap):
            return None
        return Edit(kind, f"add a {colour} {shape}", src, replace(src, items=ordered((it, new))))
    src = _any_scene(rng, size, int(rng.integers(1, 3)), anchored=True)
    it = src.items[int(rng.integers(len(src.items)))]
    rest = tuple(o for o in src.items if o is not it)
    if kind == "recolour":
        colour = _pick(rng, [c for c in COLOURS if c not in (it.colour, src.background)])
        tgt = replace(src, items=ordered((*rest, replace(it, colour=colour))))
        return Edit(kind, f"make the {it.shape} {colour}", src, tgt)
    if kind == "background":
        used = {o.colour for o in src.items}
        background = _pick(rng, [c for c in BACKGROUNDS if c != src.background and c not in used])
        return Edit(kind, f"make the background {background}", src, replace(src, background=background))
    if kind == "reshape":
        present = {o.shape for o in src.items}
        shape = _pick(rng, [s for s in SHAPES if s not in present])
        tgt = replace(src, items=ordered((*rest, replace(it, shape=shape))))
        return Edit(kind, f"turn the {it.shape} into a {shape}", src, tgt)
    if kind == "move":
        here = position_of(it.cx, it.cy, size)
        where = _pick(rng, [p for p in POSITIONS if p != here])
        cx, cy = anchor(where, size)
        moved = replace(it, cx=cx, cy=cy)
        if any(_overlaps(moved, o, gap) for o in rest):
            return None
        tgt = replace(src, items=ordered((*rest, moved)))
        return Edit(kind, f"move the {it.shape} to the {where}", src, tgt)
    raise ValueError(f"unknown edit kind {kind!r}; use one of {', '.join(EDIT_KINDS)}")


def edit_is_heldout(edit: Edit) -> bool:
    """An edit is held out when its source or its target shows a held-out combination."""
    return is_heldout(edit.source) or is_heldout(edit.target)


def sample_edit(
    rng: np.random.Generator, *, size: int = 64, split: str | None = None, kind: str | None = None
) -> Edit:
    """One random edit (kind uniform over :data:`EDIT_KINDS` unless given).  ``"train"`` edits show no
    held-out combination in source or target; ``"heldout"`` edits show one in either."""
    _check_split(split)
    if kind is not None and kind not in EDIT_KINDS:
        raise ValueError(f"unknown edit kind {kind!r}; use one of {', '.join(EDIT_KINDS)}")
    chosen = kind if kind is not None else _pick(rng, EDIT_KINDS)
    while True:
        edit = _edit_once(rng, size, chosen)
        if edit is None:
            continue
        if split is None or (split == "heldout") == edit_is_heldout(edit):
            return edit


def edits(seed: int, n: int, *, size: int = 64, split: str = "train") -> list[Edit]:
    """``n`` edits of a split (items on anchors, :func:`_anchored_item`), the same for the same arguments on
    every machine."""
    rng = _rng(seed, "edits", split)
    return [sample_edit(rng, size=size, split=split) for _ in range(n)]
