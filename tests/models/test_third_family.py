"""A third model family through the registry alone (issue 29): one package plus one ``register`` line.

The toy family (:mod:`tests.models.toy_family`) is recognised from its folder, loads and runs through
``difforge.api.generate``, answers validate's step rung, and without its registry line its folder is
refused with one line.  Nothing in ``src/difforge`` names it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from difforge import api
from difforge.config import RunConfig
from difforge.errors import DifforgeError, InputError, ModelFamilyError
from difforge.models import registry
from difforge.models.families import FAMILIES, QWEN_EDIT, QWEN_EDIT_PLUS, URSA
from difforge.models.family import Family, load_attribute
from difforge.runtime.record import RunRecord
from difforge.validate.steps import StepTrace, primary_key, step_rows
from difforge.validate.verdict import Verdict
from tests.models import toy_family
from tests.models.toy_family import TOY, ToyPipeline, ToyProbe


@pytest.fixture
def toy() -> Iterator[Family]:
    undo = registry.register(TOY)
    try:
        yield TOY
    finally:
        undo()


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return toy_family.write_folder(tmp_path / "toy-model")


def test_an_unregistered_family_is_refused_with_one_line(folder: Path) -> None:
    with pytest.raises(ModelFamilyError) as info:
        api.generate("a toy", model=str(folder), steps=2, quiet=True)
    message = str(info.value)
    assert "\n" not in message and f"'{toy_family.CLASS_NAME}'" in message and "URSAPipeline" in message
    for ask in (registry.pipeline_class, registry.probe_class):
        with pytest.raises(DifforgeError, match=r"^No .* for model family 'toy'\.$"):
            ask("toy")


def test_the_toy_is_recognised_from_its_folder_once_registered(toy: Family, folder: Path) -> None:
    assert registry.resolve_model(str(folder)) == (folder, "toy")
    assert registry.resolve_model(str(folder), task="generate")[1] == "toy"
    with pytest.raises(ModelFamilyError, match="needs a qwen-edit or qwen-edit-plus model"):
        registry.resolve_model(str(folder), task="edit")
    assert registry.pipeline_class("toy") is ToyPipeline and registry.probe_class("toy") is ToyProbe
    assert registry.family_record("toy") is toy and toy in registry.families()


def test_the_toy_runs_through_api_generate(toy: Family, folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "toy.png"
    result = api.generate("a toy", model=str(folder), steps=3, seed=7, height=16, width=24, output=str(out), quiet=True)
    assert [im.size for im in result.images] == [(24, 16)] and out.is_file()
    assert result.record.extra["steps"] == 3 and {"load", "denoise", "decode"} <= set(result.record.phases)
    again = api.generate("a toy", model=str(folder), steps=3, seed=7, height=16, width=24, quiet=True)
    other = api.generate("a toy", model=str(folder), steps=3, seed=8, height=16, width=24, quiet=True)
    pixels = [np.asarray(r.images[0]) for r in (result, again, other)]
    assert np.array_equal(pixels[0], pixels[1]) and not np.array_equal(pixels[0], pixels[2])
    with pytest.raises(InputError, match="toy family"):  # the family's own speed-name check, reached by the run
        api.generate("a toy", model=str(folder), steps=2, disable=["rope-cache"], quiet=True)


def test_validate_asks_the_record(toy: Family, folder: Path) -> None:
    with pytest.raises(InputError, match="toy family"):
        registry.check_speed_names("toy", ["lm-head-slice"], [])
    registry.check_speed_names("toy", [], [])
    assert registry.same_stream_names("toy", "philox", [], []) == ([], [])  # no stream rule: no names
    # the step rung compares the record's primary output, not the first floating one the probe returns
    outputs = {"scale": torch.ones(1), "velocity": torch.zeros(2)}
    assert "velocity" in registry.primary_outputs() and primary_key(outputs) == "velocity"


def test_validate_step_rung_on_the_toy(toy: Family, folder: Path) -> None:
    cfg = RunConfig(model=str(folder), prompt="a toy", steps=3, height=16, width=16, quiet=True)
    ref = ToyPipeline.from_pretrained(folder)
    dut = ToyPipeline.from_pretrained(folder, dtype=torch.bfloat16)
    trace = StepTrace()
    ref(cfg, RunRecord(kind="generate"), step_hook=trace.hook)
    rows, series = step_rows(registry.probe_for(dut), registry.probe_for(ref), cfg, trace, floor=ToyProbe(dut))
    assert len(rows) == 3 and all(point["key"] == "velocity" for point in series)
    assert all(row.verdict in (Verdict.PASS, Verdict.WARN) for row in rows)


def test_without_registration_the_primary_output_is_unknown(folder: Path) -> None:
    outputs = {"scale": torch.ones(1), "velocity": torch.zeros(2)}
    assert primary_key(outputs) == "scale"  # no record names "velocity": the first floating output


def test_registering_twice_or_a_taken_class_name_is_refused(toy: Family) -> None:
    with pytest.raises(DifforgeError, match="already registered"):
        registry.register(TOY)
    with pytest.raises(DifforgeError, match="already registered"):
        registry.register(Family("toy-2", ("URSAPipeline",), ("generate",), TOY.pipeline, TOY.probe,
                                 TOY.speed_names, "velocity"))
    assert "toy-2" not in {f.name for f in registry.families()}


def test_the_built_in_records_are_the_families_of_today() -> None:
    """One record per family, in the order an unknown folder is told them; the registry's answers come from them."""
    assert [(f.name, f.class_names, f.tasks, f.primary_output) for f in FAMILIES] == [
        (URSA, ("URSAPipeline",), ("generate",), "logits"),
        (QWEN_EDIT, ("QwenImageEditPipeline",), ("edit",), "noise_pred"),
        (QWEN_EDIT_PLUS, ("QwenImageEditPlusPipeline",), ("edit",), "noise_pred"),
    ]
    for f in FAMILIES:  # every dotted path names a real object
        for path in (f.pipeline, f.probe, f.speed_names, *([f.stream_names] if f.stream_names else [])):
            assert callable(load_attribute(path)), path
    assert registry.pipeline_class(URSA).__name__ == "URSAPipeline"
    assert registry.probe_class(QWEN_EDIT_PLUS).__name__ == "QwenEditProbe"
    assert registry.same_stream_names(QWEN_EDIT, "philox", [], []) == ([], [])
    with pytest.raises(DifforgeError, match="package.module:attribute"):
        load_attribute("no-colon")
