"""The checker reads renders back (clean and damaged), refuses noise, and scores edits."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from PIL import Image

from difforge.errors import InputError
from difforge.shapes import checker as c
from difforge.shapes import world as w

# Tolerances (the measured figures over 500 scenes are in docs/shapes.md: 100 % clean, >= 99 % under
# each damage): the test asserts looser bounds on fewer scenes so it stays fast and never flaky.
CLEAN_MIN, DAMAGED_MIN = 0.97, 0.90


def test_clean_renders_are_read_back() -> None:
    acc, fails = c.accuracy(200, seed=11, kind="clean", max_items=2)
    assert acc >= CLEAN_MIN, fails[:5]


def test_damaged_renders_are_read_back() -> None:
    rng = np.random.default_rng(3)
    kinds = ("noise", "blur", "jitter", "jpeg")
    bad = []
    got = w.scenes(12, 200, max_items=2)
    for i, scene in enumerate(got):
        score = c.score_caption(c.perturb(w.render(scene), kinds[i % 4], rng), scene)
        if not score.correct:
            bad.append((kinds[i % 4], score.detail))
    assert 1 - len(bad) / len(got) >= DAMAGED_MIN, bad[:5]


def test_heavier_blur_than_a_generator_should_make_is_still_read() -> None:
    acc, fails = c.accuracy(40, seed=13, kind="blur1.5", max_items=2)
    assert acc >= DAMAGED_MIN, fails[:5]


def test_analysis_reports_attributes() -> None:
    scene = w.Scene("blue", (w.Item("triangle", "yellow", 16, 32, 20), w.Item("cross", "white", 48, 32, 20)))
    a = c.analyse(w.render(scene))
    assert a.background == "blue" and (a.width, a.height) == (64, 64)
    by_shape = {f.shape: f for f in a.items}
    assert set(by_shape) == {"triangle", "cross"}
    assert by_shape["triangle"].colour == "yellow" and by_shape["triangle"].position == "left"
    assert by_shape["cross"].colour == "white" and by_shape["cross"].position == "right"
    assert (by_shape["cross"].cx, by_shape["cross"].cy) == (48.0, 32.0)
    assert 0.5 < by_shape["cross"].confidence <= 1.0 and abs(sum(by_shape["cross"].scores.values()) - 1) < 1e-9


def test_wrong_captions_fail_on_the_right_check() -> None:
    scene = w.Scene("green", (w.Item("circle", "red", 32, 32, 22),))
    img = w.render(scene)
    assert c.score_caption(img, scene).correct
    assert c.score_caption(img, w.caption(scene)) == c.score_caption(img, scene)
    assert not c.score_caption(img, "a red square on a green background").correct
    it = scene.items[0]
    for changed, check in (
        (replace(scene, background="blue"), "background"),
        (replace(scene, items=(replace(it, colour="blue"),)), "colour"),
        (replace(scene, items=(replace(it, shape="square"),)), "shape"),
        (replace(scene, items=(it, w.Item("cross", "blue", 10, 10, 14))), "count"),
    ):
        s = c.score_caption(img, changed)
        assert not s.correct and s.checks[check] is False, (check, s)
    assert "wrong" in c.score_caption(img, replace(scene, background="blue")).detail


def test_noise_and_flat_pictures_score_incorrect() -> None:
    rng = np.random.default_rng(0)
    scene = w.scenes(0, 1)[0]
    for _ in range(5):
        noise = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)
        s = c.score_caption(noise, scene)
        assert not s.correct
    for colour in ((40, 80, 220), (128, 128, 128), (0, 0, 0)):
        flat = np.zeros((64, 64, 3), np.uint8) + np.array(colour, np.uint8)
        s = c.score_caption(flat, w.Scene("blue", scene.items if scene.background == "blue" else
                                          (w.Item("circle", "red", 32, 32, 20),)))
        assert not s.correct and s.checks["count"] is False
    assert c.analyse(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).background is None
    noisy_flat = np.clip(rng.normal(0, 20, (64, 64, 3)) + w.PALETTE["blue"], 0, 255).astype(np.uint8)
    a = c.analyse(noisy_flat)
    assert a.background == "blue" and a.items == ()


def test_edits_score_their_target_not_their_source() -> None:
    for e in w.edits(5, 36):
        assert c.score_edit(w.render(e.target), e).correct, (e.instruction, c.score_edit(w.render(e.target), e))
        s = c.score_edit(w.render(e.source), e)
        assert not s.correct, (e.kind, e.instruction, s)
    move = next(e for e in w.edits(5, 36) if e.kind == "move")
    where = move.instruction.split()[-1]
    assert [i.position for i in c.edit_expectation(move).items if i.position] == [where]


def test_inputs_of_every_common_kind_are_accepted() -> None:
    scene = w.Scene("white", (w.Item("square", "black", 30, 30, 20),))
    img = w.render(scene)
    for form in (img, Image.fromarray(img), img / 255.0, np.dstack([img, np.full((64, 64), 255, np.uint8)])):
        assert c.score_caption(form, scene).correct
    big = np.asarray(Image.fromarray(img).resize((256, 256), Image.Resampling.NEAREST))
    a = c.analyse(big)
    assert a.items[0].shape == "square" and a.items[0].position == "centre"
    assert abs(a.items[0].cx - 120) <= 2 and (a.width, a.height) == (256, 256)
    for bad in (np.zeros((64, 64, 2)), np.zeros((4, 4, 3)), np.full((16, 16, 3), np.nan), "x"):
        with pytest.raises(InputError):
            c.analyse(bad)  # type: ignore[arg-type]


def test_label_matches_a_flood_fill() -> None:
    rng = np.random.default_rng(1)
    for _ in range(5):
        m = rng.random((20, 23)) < 0.55
        lab, n = c.label(m)
        seen = np.zeros_like(m)
        count = 0
        for y, x in zip(*np.nonzero(m), strict=True):
            if seen[y, x]:
                continue
            count += 1
            stack, ids = [(y, x)], set()
            seen[y, x] = True
            while stack:
                cy, cx = stack.pop()
                ids.add(int(lab[cy, cx]))
                for ny, nx in ((cy + 1, cx), (cy - 1, cx), (cy, cx + 1), (cy, cx - 1)):
                    if 0 <= ny < 20 and 0 <= nx < 23 and m[ny, nx] and not seen[ny, nx]:
                        seen[ny, nx] = True
                        stack.append((ny, nx))
            assert len(ids) == 1 and 0 not in ids
        assert n == count and (lab[~m] == 0).all()
