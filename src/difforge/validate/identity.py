"""Off-identity: an optimisation called *exact* must give, on the device under test, the very bytes its off
state gives (MindIE-SD's "off-identity" check).

A label is a claim about arithmetic, and arithmetic belongs to the device: an exact optimisation on one
kernel library (a sliced LM head, a cached rotary table, a batched CFG pass) may reorder a reduction on
another and move the last bits.  So validate proves the label where the port runs: the validated
configuration is run once more with every exact optimisation it used switched off (the random stream kept,
since a stream switch draws other numbers by design), and the pictures are compared byte for byte.

The verdicts are three, and none can come out of nothing:

* **identical** - the pictures are bitwise equal: the exact label holds on this device;
* **differs** - they are not, and the device's own reruns of the same configuration are bitwise equal (so
  the difference is the optimisations', not a race): on this device the optimisations named are
  approximate, and the report says so beside the row and in its notes; each one is then run off alone to
  name the ones that move the bytes;
* **undecided** - the device's reruns of the same configuration already differ (the determinism rung's
  finding), so no bitwise claim can be proven or refuted; or the check could not run (a capture holds only
  the validated runs; nothing exact was in use).

``--compile`` is never claimed exact here: a compiled run is judged by the rungs like any approximate
optimisation (on the H200 of 2026-12-04, compiled fp16 URSA drew other tokens than eager).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from PIL import Image

from ..config import RunConfig

#: ``Identity.status`` values.
IDENTICAL, DIFFERS, UNDECIDED = "identical", "differs", "undecided"

#: One run of the device under test: a config in, its pictures out.
RunFn = Callable[[RunConfig], list[Image.Image]]


@dataclass
class PictureDiff:
    """How far two runs' pictures are apart (0-255 levels, all pictures of the run together)."""

    identical: bool
    pixels_differing: float = 0.0
    max_abs_levels: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"identical": self.identical, "pixels_differing": self.pixels_differing,
                "max_abs_levels": self.max_abs_levels}


def picture_diff(a: Sequence[Image.Image], b: Sequence[Image.Image]) -> PictureDiff:
    """Bitwise comparison of two runs' pictures; another count or size of pictures is a difference."""
    if len(a) != len(b) or any(x.size != y.size for x, y in zip(a, b, strict=True)):
        return PictureDiff(False, 1.0, 255)
    if not a:
        return PictureDiff(True)
    diffs = [np.abs(np.asarray(x.convert("RGB"), dtype=np.int16) - np.asarray(y.convert("RGB"), dtype=np.int16))
             for x, y in zip(a, b, strict=True)]
    differing = sum(int((d > 0).any(axis=-1).sum()) for d in diffs) / sum(d.shape[0] * d.shape[1] for d in diffs)
    top = max(int(d.max()) for d in diffs)
    return PictureDiff(top == 0, float(differing), top)


@dataclass
class Identity:
    """The off-identity finding for one validated configuration."""

    status: str
    #: The exact optimisations the validated run used (those switched off for the off run).
    names: list[str] = field(default_factory=list)
    #: Why the check is undecided (empty otherwise).
    reason: str = ""
    diff: PictureDiff | None = None
    #: ``differs``: each name run off alone, and whether that alone moved the bytes.
    each: dict[str, bool] = field(default_factory=dict)
    #: The ``--disable`` list of the off run.
    off_disable: list[str] = field(default_factory=list)

    @property
    def breaking(self) -> list[str]:
        """The optimisations that alone move the bytes (all of them when none does alone: only together)."""
        alone = [n for n, moved in self.each.items() if moved]
        return alone or list(self.names)

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "names": list(self.names), "reason": self.reason,
                "diff": self.diff.to_dict() if self.diff is not None else None, "each": dict(self.each),
                "breaking": self.breaking if self.status == DIFFERS else [], "off_disable": list(self.off_disable)}

    def note(self) -> str | None:
        """The report's note (English; report/zh_text translates it), None when the labels hold."""
        if self.status == DIFFERS:
            assert self.diff is not None
            return (f"Off-identity: on this device the exact optimisations {', '.join(self.breaking)} change the "
                    f"picture ({self.diff.pixels_differing * 100:.2f} % of pixels differ, up to "
                    f"{self.diff.max_abs_levels} levels) against their off state, so here they are approximate "
                    "optimisations; the rungs above judged the validated run with them on.")
        if self.status == UNDECIDED and self.names:
            return f"Off-identity not decided: {self.reason}."
        return None


def exact_in_use(cfg: RunConfig, exact: Sequence[str], stream_names: Sequence[str]) -> list[str]:
    """The exact optimisations a run of ``cfg`` uses: the family's exact names it did not ``--disable``, less
    the random-stream switch (another stream draws other numbers by design; it is not an arithmetic claim)."""
    return [n for n in exact if n not in cfg.disable and n not in stream_names]


def off_identity(run: RunFn, cfg: RunConfig, on_runs: Sequence[Sequence[Image.Image]], exact: Sequence[str],
                 stream_names: Sequence[str], localise: bool = True) -> Identity:
    """Prove or refute the exact label of the optimisations ``cfg`` uses on the device ``run`` drives.

    ``on_runs``: the device's runs of ``cfg`` (same seed) made already (the smoke run, the benchmark's
    rounds); two or more that differ make the check undecided.  ``stream_names``: the family's names that
    switch the random stream (kept as ``cfg`` has them).  Costs one run, plus one per optimisation when the
    pictures differ (to name the ones that move the bytes) when ``localise`` (a capture skips it: each of those
    runs would be one more picture in a bundle under its ``--max-bytes``; the note then names them together).
    """
    names = exact_in_use(cfg, exact, stream_names)
    if not names:
        return Identity(UNDECIDED, [], "no exact optimisation was in use (all switched off)")
    if not on_runs:
        return Identity(UNDECIDED, names, "the device under test made no picture")
    first = list(on_runs[0])
    for again in on_runs[1:]:
        if not picture_diff(first, list(again)).identical:
            return Identity(UNDECIDED, names, "the device's reruns of the same configuration already differ "
                                              "(see the determinism rung), so no bitwise claim can be tested")
    off_disable = sorted({*cfg.disable, *names})
    diff = picture_diff(first, run(replace(cfg, disable=off_disable)))
    if diff.identical:
        return Identity(IDENTICAL, names, diff=diff, off_disable=off_disable)
    if len(names) == 1 or not localise:  # one name: the off run above was that one alone
        each = {names[0]: True} if len(names) == 1 else {}
        return Identity(DIFFERS, names, diff=diff, each=each, off_disable=off_disable)
    each = {n: not picture_diff(first, run(replace(cfg, disable=sorted({*cfg.disable, n})))).identical
            for n in names}
    return Identity(DIFFERS, names, diff=diff, each=each, off_disable=off_disable)
