"""Prompt sets: the held-out sets, the file round trip, scoring, and refusal of bad files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from difforge.errors import InputError
from difforge.shapes import checker as c
from difforge.shapes import prompts as p
from difforge.shapes import world as w


def test_heldout_caption_set_is_held_out_and_scores_its_own_renders() -> None:
    ps = p.heldout_caption_set(n=40, seed=0)
    assert ps.kind == "caption" and len(ps.items) == 40 and len({i.id for i in ps.items}) == 40
    drawn = w.scenes(0, 40, split="heldout")
    held = [drawn[i.meta["index"]] for i in ps.items]  # the same 40 draws, distinct captions first
    assert sorted(i.meta["index"] for i in ps.items) == list(range(40))
    for item, scene in zip(ps.items, held, strict=True):
        assert item.prompt == w.caption(scene) and item.image is None
        assert w.is_heldout(scene)
    assert all(p.score(w.render(s), i).correct for s, i in zip(held[:10], ps.items[:10], strict=True))
    assert p.heldout_caption_set(n=40, seed=0).to_json() == ps.to_json()
    assert p.heldout_caption_set(n=40, seed=1).to_json() != ps.to_json()


def test_edit_set_round_trips_and_scores_like_score_edit(tmp_path: Path) -> None:
    ps = p.heldout_edit_set(n=12, seed=2)
    out = p.write_prompt_set(tmp_path / "set", ps)
    assert out.name == "prompts.json"
    back = p.load_prompt_set(tmp_path / "set")
    assert back.to_json() == ps.to_json() and back.kind == "edit"
    p.write_prompt_set(tmp_path / "set", back)  # in place
    p.write_prompt_set(tmp_path / "copy", back)  # elsewhere: the pictures travel along
    again = p.load_prompt_set(tmp_path / "copy" / "prompts.json")
    assert np.array_equal(again.source_image(again.items[3]), back.source_image(back.items[3]))
    drawn = w.edits(2, p.POOL, split="heldout")
    for item, edit in zip(back.items, [drawn[i.meta["index"]] for i in back.items], strict=True):
        assert item.prompt == edit.instruction and item.meta["edit"] == edit.kind
        assert np.array_equal(back.source_image(item), w.render(edit.source))
        for picture in (w.render(edit.target), w.render(edit.source)):
            assert p.score(picture, item) == c.score_edit(picture, edit)
        assert p.score(w.render(edit.target), item).correct


def test_a_hand_written_set_checks_only_what_it_names(tmp_path: Path) -> None:
    doc = {"format": p.FORMAT, "kind": "caption", "name": "mine", "items": [
        {"id": "one", "prompt": "a photo of a red ball", "expect": {"items": [{"colour": "red"}]}},
        {"id": "two", "prompt": "something square", "expect": {"background": "white",
                                                             "items": [{"shape": "square", "position": "left"}]}},
    ]}
    (tmp_path / "prompts.json").write_text(json.dumps(doc))
    ps = p.load_prompt_set(tmp_path / "prompts.json")
    red = w.render(w.Scene("blue", (w.Item("circle", "red", 32, 32, 20),)))
    s = p.score(red, ps.items[0])
    assert s.correct and set(s.checks) == {"count", "colour"}
    left = w.render(w.Scene("white", (w.Item("square", "green", 16, 32, 20),)))
    right = w.render(w.Scene("white", (w.Item("square", "green", 48, 32, 20),)))
    assert p.score(left, ps.items[1]).correct
    s = p.score(right, ps.items[1])
    assert not s.correct and s.checks == {"background": True, "count": True, "shape": True, "position": False}


def _write(folder: Path, doc: object) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "prompts.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


def _edit_doc(image: str) -> dict:
    return {"format": p.FORMAT, "kind": "edit", "items": [
        {"id": "e", "prompt": "remove the square", "image": image,
         "expect": {"background": "red", "items": [{"shape": "circle", "colour": "blue"}]}}]}


GOOD = {"id": "a", "prompt": "a red circle on a blue background",
        "expect": {"background": "blue", "items": [{"shape": "circle", "colour": "red"}]}}


@pytest.mark.parametrize(("doc", "needle"), [
    ("{not json", "not UTF-8 JSON"),
    ([], "JSON object"),
    ({"format": "other/1", "kind": "caption", "items": [GOOD]}, "'format'"),
    ({"format": p.FORMAT, "kind": "video", "items": [GOOD]}, "'kind'"),
    ({"format": p.FORMAT, "kind": "caption", "items": []}, "non-empty"),
    ({"format": p.FORMAT, "kind": "caption", "items": [GOOD], "extra": 1}, "unknown top-level"),
    ({"format": p.FORMAT, "kind": "caption", "items": [GOOD, GOOD]}, "twice"),
    ({"format": p.FORMAT, "kind": "caption", "items": [{**GOOD, "id": "../x"}]}, "'id'"),
    ({"format": p.FORMAT, "kind": "caption", "items": [{**GOOD, "prompt": " "}]}, "'prompt'"),
    ({"format": p.FORMAT, "kind": "caption", "items": [{**GOOD, "expect": {"background": "pink"}}]}, "pink"),
    ({"format": p.FORMAT, "kind": "caption", "items": [{**GOOD, "expect": {"items": [{"shape": "star"}]}}]}, "star"),
    ({"format": p.FORMAT, "kind": "caption", "items": [{**GOOD, "expect": {}}]}, "nothing could be checked"),
    ({"format": p.FORMAT, "kind": "caption", "items": [{**GOOD, "image": "a.png"}]}, "only edit sets"),
    ({"format": p.FORMAT, "kind": "caption", "items": [{**GOOD, "colour": "red"}]}, "unknown keys"),
])
def test_bad_sets_are_one_sentence_input_errors(tmp_path: Path, doc: object, needle: str) -> None:
    with pytest.raises(InputError) as err:
        p.load_prompt_set(_write(tmp_path, doc))
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_edit_images_must_be_pngs_inside_the_folder(tmp_path: Path) -> None:
    outside = tmp_path / "outside.png"
    outside.write_bytes(b"\x89PNG\r\n\x1a\n")
    folder = tmp_path / "set"
    folder.mkdir()
    (folder / "link.png").symlink_to(outside)
    (folder / "fake.png").write_text("not a png")
    for image, needle in (("../outside.png", "outside"), (str(outside), "relative"), ("link.png", "outside"),
                          ("missing.png", "not a file"), ("fake.png", "not a PNG")):
        with pytest.raises(InputError, match=needle):
            p.load_prompt_set(_write(folder, _edit_doc(image)))
    with pytest.raises(InputError, match="edit prompt 'e' needs an 'image'"):
        doc = _edit_doc("x.png")
        del doc["items"][0]["image"]
        p.load_prompt_set(_write(folder, doc))


def test_size_limit_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no prompt set"):
        p.load_prompt_set(tmp_path / "nope")
    big = tmp_path / "big"
    big.mkdir()
    (big / "prompts.json").write_bytes(b" " * (p.MAX_BYTES + 1))
    with pytest.raises(InputError, match="bytes"):
        p.load_prompt_set(big)
