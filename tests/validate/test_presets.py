"""A backend's environment presets are applied once, on the backend the report describes.

Before the engine layer, validate parsed ``--device`` into its own backend and the API parsed it
again: the preset landed on the API's backend (and in the RunRecord) while report.json read
validate's, showing ``env_presets.applied: {}``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import difforge
from difforge import api
from difforge.devices import CPUBackend, EnvPreset
from difforge.validate import ladder

NAME = "DIFFORGE_TEST_PRESET"


@pytest.fixture
def preset(monkeypatch: pytest.MonkeyPatch) -> EnvPreset:
    monkeypatch.setenv(NAME, "unset-me")
    monkeypatch.delenv(NAME)  # unset now, and unset again after the test (difforge sets os.environ itself)
    p = EnvPreset(NAME, "1", "a preset the test patches in")
    monkeypatch.setattr(CPUBackend, "env_presets", lambda self: [p])
    return p


def test_validate_reports_the_preset_it_applied(tmp_path: Path, preset: EnvPreset) -> None:
    result = difforge.validate(model="tiny-ursa", device="cpu", dtype="bfloat16", steps=2, height=32, width=32,
                               rounds=1, warmup=0, quick=True, out=str(tmp_path / "r"), quiet=True)
    assert os.environ[NAME] == "1"
    report = json.loads(result.report_paths["json"].read_text(encoding="utf-8"))
    env = report["data"]["environment"] if "data" in report else report["environment"]
    assert env["env_presets"]["applied"] == {NAME: "1"}
    dut = result.data["dut_record"]
    assert dut["backend"]["env_presets_applied"] == {NAME: "1"}
    assert any(a["what"] == f"env {NAME}" for a in result.data["adaptations"])


def test_generate_records_the_preset(preset: EnvPreset) -> None:
    res = api.generate("a red circle", model="tiny-ursa", device="cpu", dtype="float32", steps=2, height=32,
                       width=32, quiet=True)
    assert res.record.backend["env_presets_applied"] == {NAME: "1"}
    assert any(a.what == f"env {NAME}" for a in res.record.adaptations)


def test_each_side_is_parsed_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The API parses --device once for a run; validate parses its two sides once each."""
    calls: list[str] = []
    real = api.get_backend

    def counting(spec: str | None = "auto"):  # type: ignore[no-untyped-def]
        calls.append(str(spec))
        return real(spec)

    monkeypatch.setattr(api, "get_backend", counting)
    monkeypatch.setattr(ladder, "get_backend", counting)
    api.generate("x", model="tiny-ursa", device="cpu", dtype="float32", steps=2, height=32, width=32, quiet=True)
    assert calls == ["cpu"]
    calls.clear()
    difforge.validate(model="tiny-ursa", device="cpu", dtype="bfloat16", steps=2, height=32, width=32, rounds=1,
                      warmup=0, quick=True, out=str(tmp_path / "r"), quiet=True)
    assert calls == ["cpu", "cpu"]  # device under test, reference
