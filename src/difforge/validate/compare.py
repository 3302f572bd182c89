"""``difforge compare A B``: images made elsewhere, judged the way the trajectory rung judges a run.

A port is often run by another engine on the device (MindIE-SD, vLLM-Omni, a vendor script), and what
comes back is a folder of pictures.  This pairs the pictures of two folders (or two files) by name,
measures each pair (RMSE in 0-255 levels, PSNR, SSIM, share of pixels within 1/4/16 levels, as
:func:`~.metrics.image_compare`), and judges it:

* with ``--floor F`` (pictures of a trusted run at the device's precision - a second device, or the
  reference computed at the device dtype - named like B's): the floor rule of the rungs on the image
  RMSE, ``rmse(A, B) / rmse(F, B)`` <= 2 PASS, <= 3 WARN, beyond FAIL (the floor raised to 1 level, the
  quantisation step).  A floor that *is* A (the same folder, a byte- or pixel-identical picture) would
  vouch for the device itself at 1.00x by construction: refused, as validate refuses a self-comparison;
* without one: **no precision verdict**.  validate computes its own floor (the reference's kernels
  rounding like the device) and judges the distance against it; compare has only pictures, and a
  clean bfloat16 port's picture can sit far beyond diffusers' fp16-vs-fp32 bound (cosine distance
  0.05) when its trajectory is chaotic (the shapes models), while a broken one can sit within it.  So
  each pair is a WARN that states its distance and that bound as information, and the comparison says
  why no verdict is possible and how to get one.  Only what no precision explains still FAILs: sizes
  that differ, a picture of A that is blank or saturated where B's is not (the smoke rung's rule).

Pictures are refused from their header, before any pixel is decoded, above :data:`MAX_PIXELS`: the
measures cost about 0.9 GB of memory per megapixel of a pair, and two 777 KB PNGs of 9999x9999 would
otherwise decode to tens of gigabytes.
"""

from __future__ import annotations

import filecmp
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError

from ..errors import InputError
from ..runtime.images import load_images
from ..runtime.reading import open_file
from .metrics import image_compare, image_health
from .thresholds import (
    BLANK_STD_LEVELS,
    FLOOR_MIN_RMSE_LEVELS,
    NO_FLOOR_COS_DIST,
    RATIO_FAIL,
    RATIO_PASS,
    SATURATED_SHARE,
)
from .trajectory import image_cos_distance, judge_ratio
from .verdict import Verdict

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")
#: Pairs one comparison reads (each picture is decoded with the input-image limits of runtime/images).
MAX_PAIRS = 10_000
#: Largest picture compare decodes: 2048 x 2048.  The measures (SSIM above all) cost about 0.9 GB per
#: megapixel of a pair (measured: 0.97 GB at 1024 x 1024, 0.30 GB at 512 x 512), so this keeps one pair
#: under about 4 GB; the diffusion models difforge ports make at most 1328 x 1328 (Qwen-Image).
MAX_PIXELS = 2048 * 2048
#: Largest picture file compare opens (a PNG of MAX_PIXELS, uncompressed, is 12.6 MB).
MAX_FILE_BYTES = 64 << 20
#: Why compare gives no precision verdict without a floor (printed, and in report.json as ``no_floor``).
NO_FLOOR_WHY = ("no --floor: without pictures of a trusted run at the device's precision nothing separates "
                "what the dtype costs from a fault (a clean bfloat16 picture can sit beyond diffusers' "
                f"fp16-vs-fp32 bound, cosine distance {NO_FLOOR_COS_DIST:g}, and a broken one within it), "
                "so no pair can PASS or FAIL on precision; validate computes that floor itself. Give --floor: "
                "the reference's pictures at the device's dtype (difforge generate/edit --device cpu --dtype "
                "bfloat16 with the same seeds) or a second device's")


@dataclass
class Pair:
    name: str
    a: Path
    b: Path
    floor: Path | None
    metrics: dict[str, Any] = field(default_factory=dict)
    floor_metrics: dict[str, Any] | None = None
    ratio: float | None = None
    verdict: Verdict = Verdict.FAIL
    why: str = ""


@dataclass
class Comparison:
    a: Path
    b: Path
    floor: Path | None
    pairs: list[Pair]
    only_a: list[str]
    only_b: list[str]
    verdict: Verdict = Verdict.FAIL
    report_paths: dict[str, Path] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return 1 if self.verdict is Verdict.FAIL else 0

    @property
    def no_floor(self) -> str | None:
        """Why there is no precision verdict (None with a floor)."""
        return None if self.floor else NO_FLOOR_WHY

    def to_dict(self) -> dict[str, Any]:
        return {
            "a": str(self.a), "b": str(self.b), "floor": str(self.floor) if self.floor else None,
            "verdict": str(self.verdict), "exit_code": self.exit_code, "only_a": self.only_a, "only_b": self.only_b,
            "no_floor": self.no_floor,
            "rule": (f"rmse(A, B) / rmse(floor, B) <= {RATIO_PASS:g} PASS, <= {RATIO_FAIL:g} WARN, else FAIL "
                     f"(floor raised to {FLOOR_MIN_RMSE_LEVELS:g} level)") if self.floor else
                    ("no floor: no precision verdict, every pair WARN with its cosine distance (diffusers' "
                     f"fp16-vs-fp32 bound {NO_FLOOR_COS_DIST:g} shown as information); FAIL only for differing "
                     f"sizes or a picture of A blank (std < {BLANK_STD_LEVELS:g} levels) or saturated "
                     f"(> {SATURATED_SHARE:.0%}) where B's is not"),
            "pairs": [{"name": p.name, "a": str(p.a), "b": str(p.b), "floor": str(p.floor) if p.floor else None,
                       "metrics": p.metrics, "floor_metrics": p.floor_metrics, "ratio": p.ratio,
                       "verdict": str(p.verdict), "why": p.why} for p in self.pairs],
        }


def _images(path: Path, flag: str) -> dict[str, Path]:
    """Name -> file for a folder's pictures (or the one file given)."""
    if path.is_file():
        return {path.name: path}
    if not path.is_dir():
        raise InputError(f"{flag} {path} does not exist; give a folder of images or an image file.")
    found = {p.name: p for p in sorted(path.iterdir()) if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES}
    if not found:
        raise InputError(f"{flag} {path} holds no image ({', '.join(IMAGE_SUFFIXES)}).")
    return found


def pair_up(a: Path, b: Path, floor: Path | None = None) -> tuple[list[Pair], list[str], list[str]]:
    """Match A's and B's pictures by file name (two single files always pair); the floor's by B's names."""
    ia, ib = _images(a, "A"), _images(b, "B")
    if a.is_file() and b.is_file():
        ia, ib = {"image": a}, {"image": b}
    names = sorted(set(ia) & set(ib))
    if not names:
        raise InputError(f"no picture of {a} has a namesake in {b}; compare folders whose files are named alike.")
    if len(names) > MAX_PAIRS:
        raise InputError(f"{len(names)} pairs; compare at most {MAX_PAIRS} at once.")
    fl: dict[str, Path] = {}
    if floor is not None:
        fl = _images(floor, "--floor")
        if floor.is_file():
            fl = {name: floor for name in names} if len(names) == 1 else {}
        missing = [n for n in names if n not in fl]
        if missing:
            raise InputError(f"--floor {floor} has no picture named {missing[0]} (the floor needs one per pair).")
        _refuse_self_floor(floor, a, {n: (ia[n], fl[n]) for n in names})
    pairs = [Pair(n, ia[n], ib[n], fl.get(n)) for n in names]
    return pairs, sorted(set(ia) - set(ib)), sorted(set(ib) - set(ia))


def _self_floor_error(floor: Path, why: str) -> InputError:
    return InputError(f"--floor {floor}: {why}, so it would vouch for the device itself (1.00x by construction); "
                      "give pictures of another run at the device's precision (the reference at the device's dtype).")


def _refuse_self_floor(floor: Path, a: Path, files: dict[str, tuple[Path, Path]]) -> None:
    """A floor that is A - the same folder or file, or a picture byte-identical to A's - is refused (exit 2)."""
    if floor.resolve() == a.resolve():
        raise _self_floor_error(floor, f"it is A ({a})")
    for name, (mine, theirs) in files.items():
        if filecmp.cmp(mine, theirs, shallow=False):  # compared in 8 KB blocks: no file is held whole
            raise _self_floor_error(floor, f"{name} is byte-identical to A's")


def image_size(path: Path) -> tuple[int, int]:
    """A picture's (width, height) from its header alone, refused above :data:`MAX_PIXELS` before decoding."""
    with open_file(path, what=f"the picture {path}", error=InputError, limit=MAX_FILE_BYTES) as fh:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                with Image.open(fh) as img:  # reads the header only
                    width, height = img.size
        except Image.DecompressionBombError:
            width = height = MAX_PIXELS  # beyond PIL's own limit: certainly beyond ours
        except (UnidentifiedImageError, OSError, ValueError):
            raise InputError(f"{path} is not an image difforge can decode (PNG, JPEG, WebP, ...).") from None
    if width * height > MAX_PIXELS:
        raise InputError(f"{path} is {width}x{height} ({width * height:,} pixels), more than the {MAX_PIXELS:,} "
                         "compare decodes (about 0.9 GB of memory per megapixel of a pair); downscale both sides "
                         "alike first.")
    return width, height


def _collapsed(img: Image.Image) -> str | None:
    """Why a picture is blank or saturated (the smoke rung's rule), or None."""
    h = image_health(img)
    if h["std_levels"] < BLANK_STD_LEVELS:
        return f"blank (std {h['std_levels']:.2f} levels < {BLANK_STD_LEVELS:g})"
    if h["saturated_share"] > SATURATED_SHARE:
        return f"saturated ({h['saturated_share']:.1%} of values at 0 or 255 > {SATURATED_SHARE:.0%})"
    return None


def judge_pair(pair: Pair) -> None:
    size_a, size_b = image_size(pair.a), image_size(pair.b)
    size_f = image_size(pair.floor) if pair.floor is not None else None
    if size_a != size_b:
        pair.verdict, pair.why = Verdict.FAIL, f"sizes differ: {size_a} vs {size_b}"
        return
    if size_f is not None and size_f != size_b:
        pair.verdict, pair.why = Verdict.FAIL, f"the floor's size {size_f} differs from B's {size_b}"
        return
    a, b = load_images([str(pair.a), str(pair.b)])
    if a.size != b.size:  # an EXIF rotation the headers did not show
        pair.verdict, pair.why = Verdict.FAIL, f"sizes differ: {a.size} vs {b.size}"
        return
    pair.metrics = image_compare(a, b)
    if pair.floor is None:
        dist = image_cos_distance(a, b)
        pair.metrics["cos_distance"] = dist
        broken, fine = _collapsed(a), _collapsed(b)
        if broken and not fine:
            pair.verdict, pair.why = Verdict.FAIL, f"A's picture is {broken} where B's is not"
            return
        side = "within" if dist < NO_FLOOR_COS_DIST else "beyond"
        pair.verdict = Verdict.WARN
        pair.why = (f"not judged (no floor): cosine distance {dist:.4f}, {side} diffusers' fp16-vs-fp32 bound "
                    f"{NO_FLOOR_COS_DIST:g} (information only)")
        return
    (f,) = load_images([str(pair.floor)])
    if f.size != b.size:
        pair.verdict, pair.why = Verdict.FAIL, f"the floor's size {f.size} differs from B's {b.size}"
        return
    if np.array_equal(np.asarray(f), np.asarray(a)):
        raise _self_floor_error(pair.floor, f"{pair.name} holds the same pixels as A's")
    pair.floor_metrics = image_compare(f, b)
    pair.ratio = pair.metrics["rmse"] / max(pair.floor_metrics["rmse"], FLOOR_MIN_RMSE_LEVELS)
    pair.verdict = judge_ratio(pair.ratio)
    pair.why = f"RMSE {pair.metrics['rmse']:.2f} levels = {pair.ratio:.2f}x the floor's"


def compare(a: str | Path, b: str | Path, floor: str | Path | None = None) -> Comparison:
    """Pair, measure and judge; the verdict is the worst pair's (unmatched files are listed, not judged)."""
    pairs, only_a, only_b = pair_up(Path(a), Path(b), Path(floor) if floor else None)
    for pair in pairs:
        judge_pair(pair)
    order = {Verdict.PASS: 0, Verdict.WARN: 1, Verdict.FAIL: 2}
    worst = max((p.verdict for p in pairs), key=lambda v: order.get(v, 2))
    return Comparison(Path(a), Path(b), Path(floor) if floor else None, pairs, only_a, only_b, worst)


__all__ = ["MAX_PIXELS", "NO_FLOOR_WHY", "Comparison", "Pair", "compare", "image_size", "pair_up"]
