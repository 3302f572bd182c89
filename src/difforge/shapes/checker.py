"""Read a picture of the shapes world back, and score it against a caption or an edit.

Why rules and not a classifier: the checker judges whether a ported model still means what it was
asked, so it must not depend on learned weights (which a port, a dtype or a library upgrade could
move) nor on the network.  It is numpy and PIL only, and it is built to read *generated* pictures:
noisy, blurred, slightly off-colour, JPEG-damaged, not only perfect renders.

Method (``analyse``):

1. background: every pixel of a thin border ring is named by its nearest :data:`~.world.PALETTE`
   colour in CIELAB; the majority name (if at least half the ring agrees) is the background, and the
   median of those pixels is the background's actual RGB;
2. foreground: pixels of a 3x3-smoothed copy farther than a fixed RGB distance from that actual
   background colour, grouped into 4-connected components; components under 0.8 % of the picture
   are specks and dropped;
3. each blob's colour is the median RGB of its core; its mask is then re-cut as "closer to the blob's
   colour than to the background's" (the midpoint of a blurred edge), which undoes blur growth;
4. its shape comes from three moments of that mask: the fill of its minimum-area bounding rectangle
   (square 1, circle pi/4, triangle 1/2, cross about 0.65 as the rectangle turns 45 degrees), its
   solidity, area over convex-hull area (cross about 0.73, the others above 0.93), and the offset of
   its centroid from the rectangle's centre (a triangle's is a sixth of its height, the others' none);
   the nearest of the prototypes measured on sharp and blurred renders wins;
5. its position is :func:`~.world.position_of` its bounding-box centre.
"""

from __future__ import annotations

import io
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from PIL import Image, ImageFilter

from difforge.errors import InputError
from difforge.shapes.world import (
    COLOURS,
    PALETTE,
    POSITIONS,
    SHAPES,
    Edit,
    Scene,
    parse_caption,
    position_of,
    render,
)

MAX_SIDE = 128  # larger pictures are box-downscaled first: the features need no more, and it stays fast
SPECK_FRACTION = 0.008  # components smaller than this share of the picture are noise, not shapes
FOREGROUND_DISTANCE = 60.0  # RGB distance from the background that marks a pixel as candidate foreground
BACKGROUND_MAJORITY = 0.5  # share of the border ring that must agree on one name to call a background
MAX_BLOBS = 8

# (minimum-area-rectangle fill, solidity, centroid offset) of each shape, as measured on renders
# sharp and blurred (PIL GaussianBlur radius 1, 1.5, 2: a small model's decoder blurs), and how far
# each feature may stray (the scale of the distance).  Blur fills a cross's notches, so a blurred
# cross drifts towards the square's fill, but its solidity stays below a circle's or a square's.
PROTOTYPES: dict[str, tuple[tuple[float, float, float], ...]] = {
    "square": ((1.0, 1.0, 0.0), (0.96, 0.994, 0.0)),
    "circle": ((0.80, 0.97, 0.0),),
    "triangle": ((0.53, 0.945, 0.144), (0.61, 0.954, 0.13), (0.68, 0.955, 0.105)),
    "cross": ((0.65, 0.73, 0.0), (0.69, 0.76, 0.0), (0.81, 0.85, 0.0), (0.87, 0.90, 0.0)),
}
_FEATURES = ("rect_fill", "solidity", "offset")
_FEATURE_SCALE = (0.10, 0.03, 0.035)


# ---- results ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Found:
    """One blob the checker found.  ``cx, cy`` are its bounding-box centre in the input's pixels
    (pixel i covers [i, i+1)), ``area`` its pixel count there; ``confidence`` is the winning share of
    ``scores`` (a softmax over the prototype distances); ``colour_distance`` is the CIELAB Delta-E of
    its median colour to the named colour."""

    shape: str
    colour: str
    cx: float
    cy: float
    area: int
    position: str
    confidence: float
    colour_distance: float
    scores: dict[str, float] = field(default_factory=dict, hash=False, compare=False)
    features: dict[str, float] = field(default_factory=dict, hash=False, compare=False)

    def describe(self) -> str:
        return f"a {self.colour} {self.shape} ({self.position})"


@dataclass(frozen=True)
class Analysis:
    """What a picture shows: the background's name (None when the border agrees on no colour) and the
    blobs, largest first."""

    background: str | None
    items: tuple[Found, ...]
    width: int
    height: int

    def describe(self) -> str:
        things = " and ".join(f.describe() for f in self.items) or "nothing"
        return f"{things} on {'a ' + self.background if self.background else 'no clear'} background"


@dataclass(frozen=True)
class ExpectedItem:
    """An item a picture should show; a None attribute is not checked."""

    shape: str | None = None
    colour: str | None = None
    position: str | None = None

    def describe(self) -> str:
        words = [w for w in (self.colour, self.shape or "shape") if w]
        return "a " + " ".join(words) + (f" ({self.position})" if self.position else "")


@dataclass(frozen=True)
class Expectation:
    """What a picture should show: the background (None: not checked) and exactly these items."""

    background: str | None
    items: tuple[ExpectedItem, ...]

    @classmethod
    def from_scene(cls, scene: Scene, *, positions: bool = False) -> Expectation:
        return cls(
            scene.background,
            tuple(
                ExpectedItem(it.shape, it.colour, position_of(it.cx, it.cy, scene.size) if positions else None)
                for it in scene.items
            ),
        )

    @classmethod
    def from_caption(cls, text: str) -> Expectation:
        """What a world caption (``"a red circle on a blue background"``) asks for."""
        background, things = parse_caption(text)
        return cls(background, tuple(ExpectedItem(shape, colour) for colour, shape in things))

    def to_json(self) -> dict:
        items = []
        for it in self.items:
            d = {k: v for k, v in (("shape", it.shape), ("colour", it.colour), ("position", it.position)) if v}
            items.append(d)
        return {"background": self.background, "items": items}

    def describe(self) -> str:
        things = " and ".join(it.describe() for it in self.items) or "nothing"
        return f"{things} on {'a ' + self.background if self.background else 'any'} background"


@dataclass(frozen=True)
class Score:
    """Whether a picture shows what was asked; ``checks`` names each attribute checked."""

    correct: bool
    checks: dict[str, bool]
    detail: str


# ---- colour -----------------------------------------------------------------------------------------
def to_lab(rgb: np.ndarray) -> np.ndarray:
    """sRGB (0..255, any leading shape, last axis 3) to CIELAB under D65."""
    c = np.asarray(rgb, dtype=np.float64) / 255.0
    lin = np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
    m = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]])
    xyz = lin @ m.T / np.array([0.95047, 1.0, 1.08883])
    f = np.where(xyz > (6 / 29) ** 3, np.cbrt(xyz), xyz / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.stack([116 * f[..., 1] - 16, 500 * (f[..., 0] - f[..., 1]), 200 * (f[..., 1] - f[..., 2])], -1)


_PALETTE_LAB = to_lab(np.array([PALETTE[c] for c in COLOURS], dtype=np.float64))


def name_colours(rgb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Index into :data:`COLOURS` of the nearest named colour of each RGB, and its Delta-E."""
    lab = to_lab(rgb)
    d = np.linalg.norm(lab[..., None, :] - _PALETTE_LAB, axis=-1)
    idx = d.argmin(-1)
    return idx, np.take_along_axis(d, idx[..., None], -1)[..., 0]


def nearest_colour(rgb: Sequence[float] | np.ndarray) -> str:
    """The named colour nearest (CIELAB) to one RGB triple."""
    idx, _ = name_colours(np.asarray(rgb, dtype=np.float64))
    return COLOURS[int(idx)]


# ---- pixels -----------------------------------------------------------------------------------------
def as_rgb(image: np.ndarray | Image.Image) -> np.ndarray:
    """The picture as an H x W x 3 float64 array on 0..255 (uint8, float 0..1, grey, RGBA accepted)."""
    if isinstance(image, Image.Image):
        image = np.asarray(image.convert("RGB"))
    if not isinstance(image, np.ndarray):
        raise InputError(f"the checker needs a numpy array or a PIL image, not {type(image).__name__}.")
    arr = image
    if arr.ndim == 2:
        arr = np.repeat(arr[..., None], 3, -1)
    if arr.ndim != 3 or arr.shape[-1] not in (3, 4) or min(arr.shape[:2]) < 8:
        raise InputError(f"the checker needs an H x W x 3 picture of at least 8 x 8 px, not shape {arr.shape}.")
    arr = arr[..., :3]
    if arr.dtype == np.uint8:
        return arr.astype(np.float64)
    if np.issubdtype(arr.dtype, np.floating):
        if not np.isfinite(arr).all():
            raise InputError("the picture holds NaN or infinite values; the model produced no image to check.")
        scale = 255.0 if arr.max() <= 1.0 + 1e-6 else 1.0
        return np.clip(arr.astype(np.float64) * scale, 0, 255)
    if np.issubdtype(arr.dtype, np.integer):
        return np.clip(arr.astype(np.float64), 0, 255)
    raise InputError(f"the checker cannot read a picture of dtype {arr.dtype}.")


def _smooth(rgb: np.ndarray) -> np.ndarray:
    """3x3 mean with edge padding: noise drops threefold, straight edges keep their midpoint."""
    p = np.pad(rgb, ((1, 1), (1, 1), (0, 0)), mode="edge")
    h, w = rgb.shape[:2]
    return sum(p[dy : dy + h, dx : dx + w] for dy in range(3) for dx in range(3)) / 9.0


def label(mask: np.ndarray) -> tuple[np.ndarray, int]:
    """4-connected components of a boolean mask: labels 1..n (0 background) and n.

    Union-find over horizontal runs (scipy is not a dependency): a picture of a few shapes has a few
    dozen runs, so this is fast in plain Python; labels are numbered in raster order of first pixel."""
    h, w = mask.shape
    padded = np.zeros((h, w + 2), dtype=np.int8)
    padded[:, 1:-1] = mask
    edges = np.diff(padded, axis=1)
    ry, rs = np.nonzero(edges == 1)
    _, re_ = np.nonzero(edges == -1)  # row-major order matches the starts one for one
    n_runs = len(rs)
    parent = list(range(n_runs))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    row_start = np.searchsorted(ry, np.arange(h + 1))
    for y in range(1, h):
        a0, a1 = int(row_start[y - 1]), int(row_start[y])
        b0, b1 = a1, int(row_start[y + 1])
        i, j = a0, b0
        while i < a1 and j < b1:  # runs of adjacent rows that share a column are one component
            if rs[i] < re_[j] and rs[j] < re_[i]:
                ri, rj = find(i), find(j)
                if ri != rj:
                    parent[max(ri, rj)] = min(ri, rj)
            if re_[i] < re_[j]:
                i += 1
            else:
                j += 1
    out = np.zeros((h, w), dtype=np.int64)
    ids: dict[int, int] = {}
    for k in range(n_runs):
        root = find(k)
        if root not in ids:
            ids[root] = len(ids) + 1
        out[ry[k], rs[k] : re_[k]] = ids[root]
    return out, len(ids)


def _fill_holes(blob: np.ndarray) -> np.ndarray:
    """The blob with every enclosed hole filled: non-blob parts of the window that do not reach the
    window's edge are holes."""
    outside = ~blob
    holes, n = label(outside)
    if n == 0:
        return blob
    edge = np.zeros_like(blob)
    edge[0, :] = edge[-1, :] = edge[:, 0] = edge[:, -1] = True
    reach = np.unique(holes[edge & outside])
    return blob | (outside & ~np.isin(holes, reach))


def _hull(points: np.ndarray) -> np.ndarray:
    """Convex hull (Andrew's monotone chain) of integer 2-D points, counter-clockwise."""
    pts = sorted({(int(x), int(y)) for x, y in points.tolist()})
    if len(pts) <= 2:
        return np.array(pts, dtype=np.float64)

    def cross(o: tuple[int, int], a: tuple[int, int], b: tuple[int, int]) -> int:
        return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])

    lower: list[tuple[int, int]] = []
    for p in pts:
        while len(lower) >= 2 and cross(lower[-2], lower[-1], p) <= 0:
            lower.pop()
        lower.append(p)
    upper: list[tuple[int, int]] = []
    for p in reversed(pts):
        while len(upper) >= 2 and cross(upper[-2], upper[-1], p) <= 0:
            upper.pop()
        upper.append(p)
    return np.array(lower[:-1] + upper[:-1], dtype=np.float64)


def shape_features(blob: np.ndarray) -> dict[str, float]:
    """Moments of a boolean mask that name the shape without caring where or how large it is.

    ``rect_fill``: area over the minimum-area bounding rectangle (rotating the frame to each hull
    edge); ``solidity``: area over convex-hull area, with
    the hull taken over pixel centres and its area counted in pixels (Pick's theorem), so a filled
    rectangle scores exactly 1; ``box_fill``: area over
    the axis-aligned box; ``aspect``: the rectangle's short over long side."""
    ys, xs = np.nonzero(blob)
    area = float(len(xs))
    # per row, the outermost pixel centres are enough for the hull; measuring on centres (with the
    # lattice correction below) keeps a staircase edge of a tilted shape from inflating the hull
    present = np.nonzero(blob.any(1))[0]
    first = blob[present].argmax(1)
    last = blob.shape[1] - 1 - blob[present, ::-1].argmax(1)
    hull = _hull(np.concatenate([np.stack([first, present], 1), np.stack([last, present], 1)]))
    if len(hull) < 3:
        return {"rect_fill": 1.0, "solidity": 1.0, "box_fill": 1.0, "aspect": 1.0, "offset": 0.0}
    x0, y0 = hull[:, 0], hull[:, 1]
    perimeter = float(np.hypot(*(np.roll(hull, -1, 0) - hull).T).sum())
    # Pick's theorem: a lattice polygon of area A and boundary B holds about A + B/2 + 1 lattice points
    hull_area = 0.5 * abs(float(np.dot(x0, np.roll(y0, -1)) - np.dot(y0, np.roll(x0, -1)))) + perimeter / 2 + 1
    best, aspect = np.inf, 1.0
    rect_centre = np.zeros(2)
    for i in range(len(hull)):
        e = hull[(i + 1) % len(hull)] - hull[i]
        norm = float(np.hypot(*e))
        if norm == 0:
            continue
        u = e / norm
        v = np.array([-u[1], u[0]])
        a, b = hull @ u, hull @ v
        la, lb = float(a.max() - a.min()) + 1, float(b.max() - b.min()) + 1
        if la * lb < best:
            best, aspect = la * lb, min(la, lb) / max(la, lb)
            rect_centre = u * (a.max() + a.min()) / 2 + v * (b.max() + b.min()) / 2 + 0.5
    box = float((xs.max() - xs.min() + 1) * (ys.max() - ys.min() + 1))
    # a triangle's centroid sits a sixth of its height off its rectangle's centre; the other
    # shapes are centrally symmetric
    centroid = np.array([xs.mean() + 0.5, ys.mean() + 0.5])
    centre = rect_centre if best < np.inf else centroid
    offset = float(np.hypot(*(centroid - centre)) / np.sqrt(best)) if best > 0 else 0.0
    return {
        "rect_fill": area / best if best > 0 else 1.0,
        "solidity": area / hull_area if hull_area > 0 else 1.0,
        "box_fill": area / box,
        "aspect": aspect,
        "offset": offset,
    }


def classify_shape(features: Mapping[str, float]) -> tuple[str, dict[str, float]]:
    """The nearest prototype in (rect_fill, solidity, offset), scaled by how much each feature
    wanders under damage, and a softmax share for every shape."""
    d2 = {
        name: min(
            sum(((features[f] - p) / sc) ** 2 for f, p, sc in zip(_FEATURES, proto, _FEATURE_SCALE, strict=True))
            for proto in protos
        )
        for name, protos in PROTOTYPES.items()
    }
    lo = min(d2.values())
    w = {k: float(np.exp(-(v - lo) / 2)) for k, v in d2.items()}
    total = sum(w.values())
    scores = {k: w[k] / total for k in SHAPES}
    return min(d2, key=d2.__getitem__), scores


# ---- analysis ---------------------------------------------------------------------------------------
def analyse(image: np.ndarray | Image.Image) -> Analysis:
    """Find the background and the shapes of a picture (see the module docstring for the method)."""
    rgb = as_rgb(image)
    height, width = rgb.shape[:2]
    scale = 1.0
    if max(height, width) > MAX_SIDE:
        scale = MAX_SIDE / max(height, width)
        small = Image.fromarray(np.clip(rgb + 0.5, 0, 255).astype(np.uint8)).resize(
            (max(8, round(width * scale)), max(8, round(height * scale))), Image.Resampling.BOX
        )
        rgb = np.asarray(small).astype(np.float64)
    h, w = rgb.shape[:2]
    smooth = _smooth(rgb)

    ring = max(1, min(h, w) // 32)
    border = np.ones((h, w), dtype=bool)
    border[ring:-ring, ring:-ring] = False
    border_px = smooth[border]
    names, _ = name_colours(border_px)
    counts = np.bincount(names, minlength=len(COLOURS))
    top = int(counts.argmax())
    background = COLOURS[top] if counts[top] >= BACKGROUND_MAJORITY * len(names) else None
    bg_px = border_px[names == top] if background else border_px
    bg_rgb = np.median(bg_px, axis=0)

    dist_bg = np.linalg.norm(smooth - bg_rgb, axis=-1)
    candidate = dist_bg > FOREGROUND_DISTANCE
    labels, n = label(candidate)
    min_area = max(6, int(SPECK_FRACTION * h * w))
    sizes = np.bincount(labels.ravel(), minlength=n + 1)
    keep = [i for i in range(1, n + 1) if sizes[i] >= min_area]
    keep = sorted(keep, key=lambda i: -sizes[i])[:MAX_BLOBS]

    found: list[Found] = []
    taken = np.zeros((h, w), dtype=bool)
    for i in keep:
        comp_full = labels == i
        d = dist_bg[comp_full]
        core = comp_full & (dist_bg >= 0.75 * np.percentile(d, 95))
        blob_rgb = np.median(rgb[core], axis=0)
        ys, xs = np.nonzero(comp_full)
        pad = 3
        y0, y1 = max(0, ys.min() - pad), min(h, ys.max() + pad + 1)
        x0, x1 = max(0, xs.min() - pad), min(w, xs.max() + pad + 1)
        win = (slice(y0, y1), slice(x0, x1))  # all per-blob work happens in this window
        comp = comp_full[win]
        others = (labels[win] > 0) & ~comp
        # the re-cut reads the unsmoothed pixels (smoothing would shave thin tips such as a
        # triangle's apex); the holes single noisy pixels leave are filled afterwards
        px = rgb[win]
        closer = np.linalg.norm(px - blob_rgb, axis=-1) < np.linalg.norm(px - bg_rgb, axis=-1)
        recut = closer & ~others & ~taken[win]
        sub, m = label(recut)
        if m == 0:
            continue
        overlap = np.bincount(sub[comp], minlength=m + 1)
        overlap[0] = 0
        local = _fill_holes(sub == int(overlap.argmax()))
        if local.sum() < min_area:
            continue
        blob = np.zeros((h, w), dtype=bool)
        blob[win] = local
        taken |= blob
        feats = shape_features(local)
        shape, scores = classify_shape(feats)
        cidx, cdist = name_colours(blob_rgb)
        bys, bxs = np.nonzero(blob)
        cx = (bxs.min() + bxs.max() + 1) / 2 / scale
        cy = (bys.min() + bys.max() + 1) / 2 / scale
        found.append(
            Found(
                shape=shape,
                colour=COLOURS[int(cidx)],
                cx=float(cx),
                cy=float(cy),
                area=round(float(blob.sum()) / scale**2),
                position=position_of(cx, cy, width, height),
                confidence=scores[shape],
                colour_distance=float(cdist),
                scores=scores,
                features=feats,
            )
        )
    found.sort(key=lambda f: -f.area)
    return Analysis(background, tuple(found), width, height)


# ---- scoring ----------------------------------------------------------------------------------------
def _matches(f: Found, e: ExpectedItem) -> dict[str, bool]:
    out = {}
    if e.shape is not None:
        out["shape"] = f.shape == e.shape
    if e.colour is not None:
        out["colour"] = f.colour == e.colour
    if e.position is not None:
        out["position"] = f.position == e.position
    return out


def score_analysis(analysis: Analysis, expect: Expectation) -> Score:
    """Score what was found against what was expected.

    Found blobs are paired with expected items by the assignment that satisfies the most attribute
    checks (any order: captions name items in reading order, a picture need not follow it).  Checks:
    ``background`` (when expected), ``count`` (exactly as many blobs as items), and ``shape`` /
    ``colour`` / ``position`` (every expected item's attribute, where expected, matches its pair).
    ``correct`` is all of them."""
    checks: dict[str, bool] = {}
    if expect.background is not None:
        checks["background"] = analysis.background == expect.background
    checks["count"] = len(analysis.items) == len(expect.items)
    attrs = [a for a in ("shape", "colour", "position") if any(getattr(e, a) for e in expect.items)]
    found = list(analysis.items)
    best: list[dict[str, bool]] | None = None
    best_key = (-1, -1)
    k = min(len(found), len(expect.items))
    for perm in itertools.permutations(range(len(found)), k) if len(found) <= 8 else [tuple(range(k))]:
        pairs = [_matches(found[j], expect.items[i]) for i, j in enumerate(perm)]
        key = (sum(all(p.values()) for p in pairs), sum(sum(p.values()) for p in pairs))
        if key > best_key:
            best, best_key = pairs, key
    for a in attrs:
        wanted = [i for i, e in enumerate(expect.items) if getattr(e, a) is not None]
        ok = best is not None and all(i < len(best) and best[i].get(a, False) for i in wanted)
        checks[a] = ok
    correct = all(checks.values())
    failed = [k for k, v in checks.items() if not v]
    detail = f"expected {expect.describe()}; found {analysis.describe()}"
    if failed:
        detail += f"; wrong: {', '.join(failed)}"
    return Score(correct, checks, detail)


def _expectation(expect: Scene | Expectation | Mapping | str) -> Expectation:
    if isinstance(expect, Expectation):
        return expect
    if isinstance(expect, str):
        return Expectation.from_caption(expect)
    if isinstance(expect, Scene):
        return Expectation.from_scene(expect)
    if isinstance(expect, Mapping):
        return expectation_from_json(expect)
    raise TypeError(f"cannot score against a {type(expect).__name__}")


def score_caption(image: np.ndarray | Image.Image, expect: Scene | Expectation | Mapping | str) -> Score:
    """Does the picture show the scene (or expectation, its JSON form, or a world caption's text) a
    caption describes?  Positions are only checked where the expectation names them (a caption does
    not)."""
    return score_analysis(analyse(image), _expectation(expect))


def edit_expectation(edit: Edit) -> Expectation:
    """What the edited picture must show: the target scene's background and items, and for a move
    the moved item's new position (the only edit whose meaning is a place)."""
    exp = Expectation.from_scene(edit.target)
    if edit.kind != "move":
        return exp
    before = {it.shape: (it.cx, it.cy) for it in edit.source.items}
    size = edit.target.size
    items = tuple(
        ExpectedItem(it.shape, it.colour, position_of(it.cx, it.cy, size) if before[it.shape] != (it.cx, it.cy) else None)
        for it in edit.target.items
    )
    return Expectation(exp.background, items)


def score_edit(image: np.ndarray | Image.Image, edit: Edit) -> Score:
    """Does the picture show the edit's target?  (Removal is the count and the survivor's shape; an
    addition the count and the new item; a move also the moved item's position.)"""
    return score_analysis(analyse(image), edit_expectation(edit))


def expectation_from_json(data: Mapping) -> Expectation:
    """An :class:`Expectation` from its JSON form; raises ValueError naming the first bad field."""
    if not isinstance(data, Mapping):
        raise ValueError("'expect' must be an object")
    extra = set(data) - {"background", "items"}
    if extra:
        raise ValueError(f"'expect' has unknown keys {sorted(extra)}")
    bg = data.get("background")
    if bg is not None and bg not in COLOURS:
        raise ValueError(f"expected background {bg!r} is not one of {', '.join(COLOURS)}")
    raw = data.get("items", [])
    if not isinstance(raw, list) or len(raw) > 4:
        raise ValueError("'expect.items' must be a list of at most 4 items")
    items = []
    for it in raw:
        if not isinstance(it, Mapping) or set(it) - {"shape", "colour", "position"}:
            raise ValueError("each expected item is an object with only 'shape', 'colour', 'position'")
        for key, allowed in (("shape", SHAPES), ("colour", COLOURS), ("position", POSITIONS)):
            v = it.get(key)
            if v is not None and v not in allowed:
                raise ValueError(f"expected {key} {v!r} is not one of {', '.join(allowed)}")
        items.append(ExpectedItem(it.get("shape"), it.get("colour"), it.get("position")))
    if bg is None and not items:
        raise ValueError("'expect' names neither a background nor any item, so nothing could be checked")
    return Expectation(bg, tuple(items))


# ---- robustness measurement -------------------------------------------------------------------------
PERTURBATIONS: tuple[str, ...] = ("clean", "noise", "blur", "jitter", "jpeg", "all", "blur1.5", "blur2")


def perturb(image: np.ndarray, kind: str, rng: np.random.Generator) -> np.ndarray:
    """Damage a render the way a generator might: ``noise`` (Gaussian, sigma 20/255), ``blur`` (PIL
    GaussianBlur radius 1), ``jitter`` (each flat colour region shifted up to +-25 per channel),
    ``jpeg`` (JPEG quantisation at quality 50, 4:4:4: chroma subsampling is left out because at 64 px
    it smears a 16 px shape of similar luminance into a blob no reader could name), ``all`` (jitter,
    blur, noise, then JPEG); ``blur1.5`` and ``blur2`` (radius 1.5 and 2: heavier than a generator
    should be, to show where reading stops)."""
    img = np.asarray(image, dtype=np.uint8)
    if kind == "clean":
        return img.copy()
    if kind == "noise":
        return np.clip(img + rng.normal(0, 20, img.shape), 0, 255).astype(np.uint8)
    if kind in ("blur", "blur1.5", "blur2"):
        radius = {"blur": 1.0, "blur1.5": 1.5, "blur2": 2.0}[kind]
        return np.asarray(Image.fromarray(img).filter(ImageFilter.GaussianBlur(radius)))
    if kind == "jitter":
        out = img.astype(np.int64)
        flat = img.reshape(-1, 3)
        for colour in np.unique(flat, axis=0):
            where = (img == colour).all(-1)
            out[where] += rng.integers(-25, 26, 3)
        return np.clip(out, 0, 255).astype(np.uint8)
    if kind == "jpeg":
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format="JPEG", quality=50, subsampling=0)
        return np.asarray(Image.open(io.BytesIO(buf.getvalue())).convert("RGB"))
    if kind == "all":
        for k in ("jitter", "blur", "noise", "jpeg"):
            img = perturb(img, k, rng)
        return img
    raise ValueError(f"unknown perturbation {kind!r}; use one of {', '.join(PERTURBATIONS)}")


def accuracy(
    n: int = 500, *, seed: int = 0, kind: str = "clean", size: int = 64, max_items: int = 2
) -> tuple[float, list[tuple[str, str]]]:
    """Share of ``n`` rendered training scenes the checker reads correctly after ``perturb(kind)``,
    and the (caption, detail) of each failure: how the numbers in docs/shapes.md are measured."""
    from difforge.shapes.world import caption, scenes

    rng = np.random.default_rng([seed, 99])
    failures: list[tuple[str, str]] = []
    for scene in scenes(seed, n, size=size, max_items=max_items):
        score = score_caption(perturb(render(scene), kind, rng), scene)
        if not score.correct:
            failures.append((caption(scene), score.detail))
    return 1 - len(failures) / n, failures


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m difforge.shapes.checker [n] [size]``: print the accuracy table."""
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    n = int(args[0]) if args else 500
    size = int(args[1]) if len(args) > 1 else 64
    for kind in PERTURBATIONS:
        for max_items in (1, 2):
            acc, fails = accuracy(n, kind=kind, size=size, max_items=max_items)
            print(f"{kind:7s} items<={max_items} n={n} size={size}: {acc:.3%}")
            for cap, detail in fails[:3]:
                print(f"    {cap}: {detail}")


if __name__ == "__main__":
    main()
