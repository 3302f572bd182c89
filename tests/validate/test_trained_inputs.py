"""Issue 28.2: a built-in trained model is validated on inputs it was trained on - its held-out prompts,
for the edit model that edit's own source picture, and the pipeline's own negative prompt - never the
family's sunset instruction on the generic sky/disc picture or URSA's seed negative sentence."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from difforge.models.ursa.probe import URSAProbe
from difforge.shapes.domain import PromptDomain
from difforge.shapes.prompts import heldout_edit_set
from difforge.shapes.world import VOCAB
from difforge.validate.ladder import Ladder
from difforge.validate.options import ValidateOptions


def _ladder(model: str, tmp_path: Path) -> Ladder:
    return Ladder(ValidateOptions(model=model, device="cpu", dtype="bfloat16", reference="cpu:float32", quick=True,
                                  out=tmp_path / "r", quiet=True))


def test_shapes_qwen_edit_edits_its_own_held_out_source_with_words_it_knows(tmp_path: Path) -> None:
    lad = _ladder("shapes-qwen-edit", tmp_path)
    lad.prepare_inputs()
    first = heldout_edit_set(1).items[0]
    assert lad.prompts == [first.prompt]
    assert np.array_equal(np.asarray(lad.images[0]), heldout_edit_set(1).source_image(first))
    domain = PromptDomain(frozenset(VOCAB), "edit", None, "shapes-qwen-edit")
    assert domain.warning(lad.prompts[0]) is None
    assert lad.dut_cfg().negative_prompt is None  # the pipeline's own (" " under true CFG)


def test_shapes_ursa_keeps_its_pipelines_negative_prompt_and_other_models_the_familys(tmp_path: Path) -> None:
    shapes = _ladder("shapes-ursa", tmp_path)
    assert shapes.dut_cfg().negative_prompt is None
    domain = PromptDomain(frozenset(VOCAB), "caption", 1, "shapes-ursa")
    assert all(domain.warning(p) is None for p in shapes.prompts)
    assert _ladder("tiny-ursa", tmp_path).dut_cfg().negative_prompt == URSAProbe.negative_prompt


def test_the_report_says_which_picture_the_edits_used(tmp_path: Path) -> None:
    """The trained edit model's own held-out source is not called a synthetic test picture in the report's notes;
    an untrained edit model's generic picture still is."""
    from difforge.validate.ladder import OWN_SOURCE_NOTE, SYNTHETIC_NOTE

    for model, note in (("shapes-qwen-edit", OWN_SOURCE_NOTE), ("tiny-qwen-edit", SYNTHETIC_NOTE)):
        lad = _ladder(model, tmp_path)
        lad.prepare_inputs()
        lad.save_image = lambda image, name: tmp_path / name  # no output folder needed for the note
        lad.save_inputs()
        assert note in lad.notes and ({OWN_SOURCE_NOTE, SYNTHETIC_NOTE} - {note}).isdisjoint(lad.notes), lad.notes
