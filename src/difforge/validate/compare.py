"""``difforge compare A B``: images made elsewhere, judged the way the trajectory rung judges a run.

A port is often run by another engine on the device (MindIE-SD, vLLM-Omni, a vendor script), and what
comes back is a folder of pictures.  This pairs the pictures of two folders (or two files) by name,
measures each pair (RMSE in 0-255 levels, PSNR, SSIM, share of pixels within 1/4/16 levels, as
:func:`~.metrics.image_compare`), and judges it:

* with ``--floor F`` (pictures of a trusted run at the device's precision - a second device, or the
  reference computed at the device dtype - named like B's): the floor rule of the rungs on the image
  RMSE, ``rmse(A, B) / rmse(F, B)`` <= 2 PASS, <= 3 WARN, beyond FAIL (the floor raised to 1 level, the
  quantisation step);
* without one: nothing proves the precision, so a pair within diffusers' fp16-vs-fp32 bound (cosine
  distance < 0.05) is only a WARN, beyond it a FAIL, as the trajectory rung does without a floor.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..runtime.images import load_images
from .metrics import image_compare
from .thresholds import FLOOR_MIN_RMSE_LEVELS, NO_FLOOR_COS_DIST, RATIO_FAIL, RATIO_PASS
from .trajectory import image_cos_distance, judge_ratio, judge_without_floor
from .verdict import Verdict

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")
#: Pairs one comparison reads (each picture is decoded with the input-image limits of runtime/images).
MAX_PAIRS = 10_000


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

    def to_dict(self) -> dict[str, Any]:
        return {
            "a": str(self.a), "b": str(self.b), "floor": str(self.floor) if self.floor else None,
            "verdict": str(self.verdict), "exit_code": self.exit_code, "only_a": self.only_a, "only_b": self.only_b,
            "rule": (f"rmse(A, B) / rmse(floor, B) <= {RATIO_PASS:g} PASS, <= {RATIO_FAIL:g} WARN, else FAIL "
                     f"(floor raised to {FLOOR_MIN_RMSE_LEVELS:g} level)") if self.floor else
                    (f"no floor: cosine distance < {NO_FLOOR_COS_DIST:g} WARN (never PASS), else FAIL"),
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
    pairs = [Pair(n, ia[n], ib[n], fl.get(n)) for n in names]
    return pairs, sorted(set(ia) - set(ib)), sorted(set(ib) - set(ia))


def judge_pair(pair: Pair) -> None:
    a, b = load_images([str(pair.a), str(pair.b)])
    if a.size != b.size:
        pair.verdict, pair.why = Verdict.FAIL, f"sizes differ: {a.size} vs {b.size}"
        return
    pair.metrics = image_compare(a, b)
    if pair.floor is None:
        dist = image_cos_distance(a, b)
        pair.metrics["cos_distance"] = dist
        pair.verdict = judge_without_floor(dist)
        pair.why = f"no floor: cosine distance {dist:.4f} {'<' if pair.verdict is Verdict.WARN else '>='} " \
                   f"{NO_FLOOR_COS_DIST:g}"
        return
    (f,) = load_images([str(pair.floor)])
    if f.size != b.size:
        pair.verdict, pair.why = Verdict.FAIL, f"the floor's size {f.size} differs from B's {b.size}"
        return
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


__all__ = ["Comparison", "Pair", "compare", "pair_up"]
