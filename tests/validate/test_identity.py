"""Off-identity (validate/identity.py): an optimisation labelled exact is proven bitwise equal to its off state on
the device under test, and a label that does not hold there is refuted, named and reported."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from difforge.config import RunConfig
from difforge.models.ursa.pipeline import URSAPipeline
from difforge.report.i18n import TEXT
from difforge.report.render import _speed_accuracy
from difforge.report.zh_text import translate
from difforge.validate import ValidateOptions, Verdict
from difforge.validate.identity import DIFFERS, IDENTICAL, UNDECIDED, off_identity, picture_diff

from .ladder_run import run_validation

EXACT = ("slice", "cache", "pinned", "stream")
STREAM = ["stream"]


def _picture(value: int = 0, where: tuple[int, int] | None = None) -> Image.Image:
    arr = np.full((8, 8, 3), 100, dtype=np.uint8)
    if where is not None:
        arr[where] = value
    return Image.fromarray(arr)


class FakeDevice:
    """Runs a config into pictures: each name in ``inexact`` moves one pixel while it is on."""

    def __init__(self, inexact: tuple[str, ...] = ()) -> None:
        self.inexact = inexact
        self.configs: list[RunConfig] = []

    def __call__(self, cfg: RunConfig) -> list[Image.Image]:
        self.configs.append(cfg)
        on = [n for n in self.inexact if n not in cfg.disable]
        return [_picture(100 + 3 * len(on), (0, 0) if on else None)]

    def on_run(self) -> list[Image.Image]:
        return self(RunConfig(model="m"))


def test_picture_diff_is_bitwise_and_counts_what_moved() -> None:
    assert picture_diff([_picture()], [_picture()]).identical
    diff = picture_diff([_picture()], [_picture(103, (2, 3))])
    assert not diff.identical and diff.max_abs_levels == 3 and diff.pixels_differing == pytest.approx(1 / 64)
    assert not picture_diff([_picture()], [_picture(), _picture()]).identical
    assert not picture_diff([_picture()], [Image.new("RGB", (4, 4))]).identical


def test_exact_optimisations_that_keep_the_bytes_are_proven_with_one_off_run() -> None:
    device = FakeDevice()
    first = device.on_run()
    found = off_identity(device, RunConfig(model="m"), [first, device.on_run()], EXACT, STREAM)
    assert found.status == IDENTICAL and found.names == ["slice", "cache", "pinned"]
    off = device.configs[-1]
    assert len(device.configs) == 3  # the two on runs given, one off run
    # every exact optimisation off, the random-stream switch kept as the run had it (another stream draws other numbers)
    assert off.disable == ["cache", "pinned", "slice"] and "stream" not in off.disable
    assert found.note() is None


def test_an_inexact_label_is_refuted_and_the_optimisation_named() -> None:
    device = FakeDevice(inexact=("cache",))
    found = off_identity(device, RunConfig(model="m"), [device.on_run()], EXACT, STREAM)
    assert found.status == DIFFERS and found.breaking == ["cache"]
    assert found.each == {"slice": False, "cache": True, "pinned": False}
    assert found.diff is not None and found.diff.max_abs_levels == 3
    note = found.note()
    assert note is not None and "cache" in note and "approximate" in note
    zh = translate(note, "zh")
    assert zh != note and "cache" in zh and "近似优化" in zh


def test_two_that_only_move_the_bytes_together_are_both_named() -> None:
    class Together(FakeDevice):
        def __call__(self, cfg: RunConfig) -> list[Image.Image]:
            self.configs.append(cfg)
            both = "slice" not in cfg.disable and "cache" not in cfg.disable
            return [_picture(1, (1, 1) if both else None)]

    device = Together()
    first = device(RunConfig(model="m"))
    device.configs.clear()
    found = off_identity(device, RunConfig(model="m", disable=["pinned"]), [first], EXACT, STREAM)
    assert found.names == ["slice", "cache"]  # pinned was off already: not the run's to claim
    assert found.status == DIFFERS and found.each == {"slice": True, "cache": True}
    # switching off either one alone restores the bytes, so each moves them; the note names both
    assert sorted(found.breaking) == ["cache", "slice"]


def test_a_device_whose_reruns_differ_decides_nothing_and_runs_nothing() -> None:
    device = FakeDevice()
    found = off_identity(device, RunConfig(model="m"), [[_picture()], [_picture(7, (0, 0))]], EXACT, STREAM)
    assert found.status == UNDECIDED and "reruns" in found.reason
    assert device.configs == []


def test_nothing_exact_in_use_decides_nothing() -> None:
    device = FakeDevice()
    found = off_identity(device, RunConfig(model="m", disable=["slice", "cache", "pinned"]), [[_picture()]],
                         EXACT, STREAM)
    assert found.status == UNDECIDED and device.configs == []


def test_the_speed_table_carries_the_finding_beside_the_exact_rows() -> None:
    t = TEXT["en"]
    row = {"kind": "baseline", "name": "--disable a", "validated": False}
    same = {"status": "identical", "names": ["a", "b"]}
    moved = {"status": "differs", "names": ["a", "b"], "breaking": ["b"]}
    assert _speed_accuracy(row, t, "PASS", None) == t["perf_acc_exact"]
    assert "bitwise the same" in _speed_accuracy(row, t, "PASS", same)
    assert "approximate on this device: b change" in _speed_accuracy(row, t, "PASS", moved)
    validated = {"kind": "exact", "name": "defaults", "validated": True}
    assert _speed_accuracy(validated, t, "PASS", moved).startswith("judged by this report: PASS; approximate")
    approximate = {"kind": "approximate", "name": "--fast x", "validated": False}
    assert _speed_accuracy(approximate, t, "PASS", moved) == t["perf_acc_none"].format(name="--fast x")


def _opts(out: Path) -> ValidateOptions:
    return ValidateOptions(model="tiny-ursa", device="cpu", dtype="bfloat16", quick=True, out=out, quiet=True,
                           reference="cpu:float32", speed_table=False, height=128, width=128, rounds=1, warmup=0)


@pytest.mark.slow  # two validations end to end (make test-slow)
def test_clean_tiny_ursa_proves_its_exact_labels_and_a_planted_inexact_one_is_reported(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clean = run_validation(_opts(tmp_path / "clean"))
    found = clean.rungs["benchmark"].data["off_identity"]
    assert found["status"] == "identical", found
    assert found["names"] == ["lm-head-slice", "reuse-first-forward", "rope-cache", "pinned-draws"]
    assert "philox-rng" not in found["off_disable"]

    # a port whose sliced LM head rounds otherwise than the full one: the exact label does not hold here
    forward = URSAPipeline.forward_logits

    def inexact_slice(self, ids, pos, n_img, sliced, *rest):  # type: ignore[no-untyped-def]
        out = forward(self, ids, pos, n_img, sliced, *rest)
        return out * 1.25 if sliced else out

    monkeypatch.setattr(URSAPipeline, "forward_logits", inexact_slice)
    planted = run_validation(_opts(tmp_path / "planted"))
    found = planted.rungs["benchmark"].data["off_identity"]
    assert found["status"] == "differs" and found["breaking"] == ["lm-head-slice"], found
    md = planted.report_paths["markdown"].read_text()
    assert "Off-identity: on this device the exact optimisations lm-head-slice change the picture" in md
    assert planted.rungs["benchmark"].verdict is not Verdict.FAIL  # a label finding, not a broken benchmark


def test_a_capture_does_not_search_one_by_one_and_names_them_together() -> None:
    device = FakeDevice(inexact=("cache",))
    found = off_identity(device, RunConfig(model="m"), [device.on_run()], EXACT, STREAM, localise=False)
    assert found.status == DIFFERS and found.each == {} and found.breaking == ["slice", "cache", "pinned"]
    assert len(device.configs) == 2  # the on run made here and the one off run: no search
