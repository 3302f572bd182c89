"""Issue 28.8: a model that ships its prompt domain says when a prompt leaves it (one line, and in the record)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from difforge import engine
from difforge.cli import app
from difforge.config import RunConfig
from difforge.errors import CheckpointError
from difforge.models.checkpoint import read_settings
from difforge.models.trained import trained_path
from difforge.runtime.record import RunRecord
from difforge.shapes.domain import PromptDomain, domain_from_settings, words_of
from difforge.shapes.world import VOCAB

CAPTION = PromptDomain(frozenset(VOCAB), "caption", 1, "shapes-ursa")
EDIT = PromptDomain(frozenset(VOCAB), "edit", None, "shapes-qwen-edit")


def test_words_are_lower_cased_without_the_punctuation_around_them() -> None:
    assert words_of("Add a beautiful, sunset background to THIS image.") == [
        "add", "a", "beautiful", "sunset", "background", "to", "this", "image"]


def test_out_of_vocabulary_words_are_named_once_in_order() -> None:
    notes = CAPTION.notes("a purple star on a blue background")
    assert notes == ["'purple', 'star' are outside shapes-ursa's vocabulary of 27 words"]
    edit = EDIT.notes("Add a beautiful sunset background to this image.")
    assert edit == ["'beautiful', 'sunset', 'this', 'image' are outside shapes-qwen-edit's vocabulary of 27 words"]
    assert EDIT.notes("make the circle green") == [] and EDIT.notes("move the square to the left") == []


def test_a_two_item_caption_is_named_for_a_one_item_caption_model() -> None:
    """docs/shapes.md presents two-item captions as the world's; shapes-ursa was trained on one item."""
    assert CAPTION.notes("a red circle on a blue background") == []
    assert CAPTION.notes("a red circle and a green square on a blue background") == [
        "it names 2 items; shapes-ursa was trained on captions of 1 item"]
    assert "not a caption of the shapes world" in CAPTION.notes("make the circle red")[0]
    two_items = PromptDomain(frozenset(VOCAB), "caption", 2, "m")
    assert two_items.notes("a red circle and a green square on a blue background") == []


def test_the_warning_is_one_line_and_escapes_the_prompt() -> None:
    line = CAPTION.warning("a purple\x1b[2J star on a blue background")
    assert line is not None and "\n" not in line and "\x1b" not in line and "\\x1b" in line
    assert CAPTION.warning("a red circle on a blue background") is None
    assert CAPTION.warning(" ") is None  # an empty negative prompt is not a prompt


@pytest.mark.parametrize(("value", "needle"), [
    ("shapes", "must be an object"),
    ({"vocabulary": "english"}, "must be \"shapes\" or a list"),
    ({"vocabulary": []}, "must be \"shapes\" or a list"),
    ({"vocabulary": ["x" * 65]}, "must be \"shapes\" or a list"),
    ({"vocabulary": "shapes", "kind": "poem"}, "kind"),
    ({"vocabulary": "shapes", "kind": "caption", "max_items": 0}, "max_items"),
    ({"vocabulary": "shapes", "kind": "edit", "max_items": 1}, "caption\" only"),
    ({"vocabulary": "shapes", "extra": 1}, "unknown key"),
])
def test_a_bad_declaration_is_one_checkpoint_error(value: object, needle: str) -> None:
    with pytest.raises(CheckpointError, match=needle):
        domain_from_settings({"prompt_domain": value}, "m", "m/difforge.json")


def test_the_shapes_models_declare_their_domain_and_others_none(tmp_path: Path) -> None:
    ursa = domain_from_settings(read_settings(trained_path("shapes-ursa")), "shapes-ursa", "x")
    qwen = domain_from_settings(read_settings(trained_path("shapes-qwen-edit")), "shapes-qwen-edit", "x")
    assert ursa == CAPTION and qwen == EDIT
    assert domain_from_settings({}, "m", "x") is None
    assert domain_from_settings({"prompt_domain": {"vocabulary": ["Foo", "bar"]}}, "m", "x").vocabulary == {"foo", "bar"}


def test_the_engine_records_every_run_and_warns_once(capsys: pytest.CaptureFixture[str]) -> None:
    class Pipe:  # what note_prompt_domain reads of a loaded pipeline: nothing but its identity
        pass

    pipe = Pipe()
    engine._DOMAINS[pipe] = PromptDomain(frozenset(VOCAB), "caption", 1, "unit-test-model")
    cfg = RunConfig(model="m", prompt="a purple star on a blue background")
    records = [RunRecord(kind="generate") for _ in range(3)]
    for rec in records:
        engine.note_prompt_domain(pipe, cfg, rec)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("difforge: warning: the prompt 'a purple star")
    assert all(r.extra["prompt_domain"] == [err[0].removeprefix("difforge: warning: ")] for r in records)
    inside = RunRecord(kind="generate")
    engine.note_prompt_domain(pipe, RunConfig(model="m", prompt="a red circle on a blue background"), inside)
    assert "prompt_domain" not in inside.extra and capsys.readouterr().err == ""


def test_generate_with_shapes_ursa_warns_in_one_line_and_records_it(tmp_path: Path) -> None:
    rec = tmp_path / "run.json"
    r = CliRunner().invoke(app, ["generate", "--model", "shapes-ursa", "--prompt", "a purple star on a blue background",
                                 "--steps", "2", "--output", str(tmp_path / "o.png"), "--record", str(rec)])
    assert r.exit_code == 0, r.output
    warnings = [x for x in r.stderr.splitlines() if x.startswith("difforge: warning:")]
    assert len(warnings) == 1 and "'purple', 'star' are outside shapes-ursa's vocabulary" in warnings[0]
    data = json.loads(rec.read_text())
    assert data["extra"]["prompt_domain"] == [warnings[0].removeprefix("difforge: warning: ")]
