"""The shapes world: vocabulary, determinism, the held-out split and edits."""

from __future__ import annotations

import hashlib
import itertools

import numpy as np
import pytest

from difforge.shapes import world as w

# Pinned so that anyone who trains on the world learns when it changes (a change breaks their data).
SCENES_SHA256 = "e4164b0b332053d5772842f1b0725722ba74cb0d6a8a07bb956e885e1337f21d"
EDITS_SHA256 = "57c0d46cb893641b34dca062c267bf73ec0b0ad0b6372a77101773e637806263"


def _scene_digest(seed: int) -> str:
    h = hashlib.sha256()
    for s in w.scenes(seed, 20, max_items=2):
        h.update(w.render(s).tobytes())
        h.update(w.caption(s).encode())
    return h.hexdigest()


def _edit_digest(seed: int) -> str:
    h = hashlib.sha256()
    for e in w.edits(seed, 20):
        h.update(w.render(e.source).tobytes())
        h.update(w.render(e.target).tobytes())
        h.update(e.instruction.encode())
    return h.hexdigest()


def test_vocabulary_is_small_and_fixed() -> None:
    assert w.SHAPES == ("circle", "square", "triangle", "cross")
    assert w.COLOURS == ("red", "green", "blue", "yellow", "white", "black")
    assert w.POSITIONS == ("left", "right", "top", "bottom", "centre")
    assert len(w.VOCAB) == len(set(w.VOCAB)) <= 30


def test_every_word_of_captions_and_instructions_is_in_the_vocabulary() -> None:
    words: set[str] = set()
    for s in w.scenes(1, 100, max_items=2):
        words |= set(w.caption(s).split())
    for e in w.edits(1, 150):
        words |= set(e.instruction.split()) | set(w.caption(e.target).split())
    assert words <= set(w.VOCAB)
    assert set(w.SHAPES) | set(w.COLOURS) <= words


def test_captions_follow_the_template() -> None:
    one = w.Scene("blue", (w.Item("circle", "red", 32, 32, 20),))
    assert w.caption(one) == "a red circle on a blue background"
    two = w.Scene("blue", (w.Item("square", "green", 48, 20, 16), w.Item("circle", "red", 16, 40, 16)))
    assert w.caption(two) == "a red circle and a green square on a blue background"


def test_same_seed_same_bytes_and_pinned() -> None:
    assert _scene_digest(7) == _scene_digest(7) == SCENES_SHA256
    assert _edit_digest(7) == EDITS_SHA256
    assert _scene_digest(8) != SCENES_SHA256


def test_render_is_flat_colour_with_background_border() -> None:
    for s in w.scenes(2, 30, max_items=2, size=96):
        img = w.render(s)
        assert img.shape == (96, 96, 3) and img.dtype == np.uint8
        colours = {tuple(int(v) for v in c) for c in np.unique(img.reshape(-1, 3), axis=0)}
        assert colours == {w.PALETTE[s.background]} | {w.PALETTE[i.colour] for i in s.items}
        ring = np.concatenate([img[:2].reshape(-1, 3), img[-2:].reshape(-1, 3), img[:, :2].reshape(-1, 3),
                               img[:, -2:].reshape(-1, 3)])
        assert (ring == w.PALETTE[s.background]).all()


def test_shape_masks_have_their_textbook_fill() -> None:
    fills = {sh: w.mask(w.Item(sh, "red", 32, 32, 24), 64).sum() / 24**2 for sh in w.SHAPES}
    assert fills["square"] == 1.0
    assert abs(fills["circle"] - np.pi / 4) < 0.02
    assert abs(fills["triangle"] - 0.5) < 0.03
    assert abs(fills["cross"] - 5 / 9) < 0.03


def test_bad_scenes_are_refused() -> None:
    with pytest.raises(ValueError, match="background's colour"):
        w.Scene("red", (w.Item("circle", "red", 32, 32, 20),))
    with pytest.raises(ValueError, match="overlap"):
        w.Scene("red", (w.Item("circle", "blue", 32, 32, 20), w.Item("square", "blue", 36, 36, 20)))
    with pytest.raises(ValueError, match="different shapes"):
        w.Scene("red", (w.Item("circle", "blue", 16, 16, 14), w.Item("circle", "green", 48, 48, 14)))
    with pytest.raises(ValueError, match="leaves"):
        w.Scene("red", (w.Item("circle", "blue", 4, 32, 20),))
    with pytest.raises(ValueError, match="split"):
        w.scenes(0, 1, split="test")


def test_heldout_split_is_disjoint_by_combination() -> None:
    assert len(w.HELDOUT_COMBOS) == 12
    assert {k[0] for k in w.HELDOUT_COMBOS} == set(w.SHAPES)
    train_combos = set(w._all_combos()) - w.HELDOUT_COMBOS
    for a, b in itertools.combinations(range(3), 2):  # every pair of a held-out combo is still taught
        for k in w.HELDOUT_COMBOS:
            assert any(t[a] == k[a] and t[b] == k[b] for t in train_combos), (k, a, b)
    for s in w.scenes(3, 200, max_items=2):
        assert not w.is_heldout(s)
    held = w.scenes(3, 100, max_items=2, split="heldout")
    assert all(w.is_heldout(s) for s in held)
    assert {k for s in held for k in w.combos(s)} & w.HELDOUT_COMBOS == w.HELDOUT_COMBOS
    for e in w.edits(3, 60):
        assert not w.edit_is_heldout(e)
    assert all(w.edit_is_heldout(e) for e in w.edits(3, 60, split="heldout"))


def test_sample_scene_respects_max_items_and_size() -> None:
    rng = np.random.default_rng(0)
    got = [w.sample_scene(rng, size=96, max_items=2) for _ in range(60)]
    assert {len(s.items) for s in got} == {1, 2}
    lo, hi = w.size_range(96)
    assert all(s.size == 96 and lo <= it.size <= hi for s in got for it in s.items)
    assert all(len(s.items) == 1 for s in w.scenes(0, 20))


def test_edits_change_what_they_say() -> None:
    got = w.edits(4, 240)
    assert {e.kind for e in got} == set(w.EDIT_KINDS)
    for e in got:
        src, tgt, words = e.source, e.target, e.instruction.split()
        if e.kind == "recolour":
            assert tgt.item(words[2]).colour == words[3] != src.item(words[2]).colour
            assert tgt.background == src.background
        elif e.kind == "background":
            assert tgt.background == words[-1] != src.background and tgt.items == src.items
        elif e.kind == "move":
            it = tgt.item(words[2])
            assert w.position_of(it.cx, it.cy, tgt.size) == words[-1]
            assert w.position_of(src.item(words[2]).cx, src.item(words[2]).cy, src.size) != words[-1]
        elif e.kind == "add":
            assert len(src.items) == 1 and len(tgt.items) == 2
            assert tgt.item(words[-1]).colour == words[-2]
        elif e.kind == "remove":
            assert len(src.items) == 2 and len(tgt.items) == 1
            assert words[-1] not in {i.shape for i in tgt.items}
        elif e.kind == "reshape":
            assert words[-1] in {i.shape for i in tgt.items} and words[2] not in {i.shape for i in tgt.items}


def test_position_rule() -> None:
    assert w.position_of(32, 32, 64) == "centre"
    for p in w.POSITIONS:
        assert w.position_of(*w.anchor(p, 64), 64) == p
        assert w.position_of(*w.anchor(p, 96), 96) == p


def test_captions_parse_back() -> None:
    for s in w.scenes(6, 40, max_items=2):
        bg, things = w.parse_caption(w.caption(s))
        assert bg == s.background and things == tuple((i.colour, i.shape) for i in w.ordered(s.items))
    for bad in ("a red circle", "a red star on a blue background", "red circle on a blue background",
                "a red circle or a blue square on a green background", "a red circle on a blue sky"):
        with pytest.raises(ValueError, match="caption"):
            w.parse_caption(bad)


def test_package_reexports_and_stays_free_of_torch() -> None:
    import subprocess
    import sys

    import difforge.shapes as shapes

    assert all(getattr(shapes, name) is not None for name in shapes.__all__)
    code = "import sys, difforge.shapes as s; s.analyse; s.load_prompt_set; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_edit_scenes_sit_on_anchors_at_one_size() -> None:
    """Edit sources and targets put every item, at the edit size, on one of the five anchors (what a small
    edit model can learn to copy); caption scenes keep free placement and sizes."""
    for size in (64, 96):
        anchors = {w.anchor(p, size) for p in w.POSITIONS}
        side = w.edit_item_size(size)
        for split in ("train", "heldout"):
            for e in w.edits(6, 120, size=size, split=split):
                for it in (*e.source.items, *e.target.items):
                    assert (it.cx, it.cy) in anchors and it.size == side, (e, it)
    placed = {(it.cx, it.cy, it.size) for s in w.scenes(6, 60) for it in s.items}
    assert len(placed) > 20
