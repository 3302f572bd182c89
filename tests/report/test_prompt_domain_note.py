"""A device run's prompt outside the model's prompt domain (engine.note_prompt_domain keeps it in the
RunRecord) is a note of the report, in English and in Chinese."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from difforge.report import write_report
from difforge.runtime.record import RunRecord
from difforge.shapes.domain import PromptDomain
from difforge.validate.runner import _Climb

from .test_render import _result
from .zh_check import english_left, visible_markdown


def test_an_out_of_domain_prompt_is_a_report_note_in_both_languages(tmp_path: Path) -> None:
    domain = PromptDomain.from_settings({"vocabulary": "shapes", "kind": "caption", "max_items": 1}, "shapes-ursa",
                                        "difforge.json")
    line = domain.warning("a purple star")
    assert line is not None
    record = RunRecord(kind="generate")
    record.extra["prompt_domain"] = [line]
    climb = SimpleNamespace(lad=SimpleNamespace(notes=[]))
    _Climb.note_prompt_domain(climb, record)  # type: ignore[arg-type]
    _Climb.note_prompt_domain(climb, record)  # type: ignore[arg-type]  # the gallery meets it again: one note
    assert climb.lad.notes == [line]
    result, files = _result(tmp_path)
    result.data["notes"] = climb.lad.notes
    md = write_report(result, tmp_path, lang="en", files=files)["markdown"].read_text()
    notes = md[md.index("Notes"):]
    assert "leaves what shapes-ursa was trained on" in notes and "purple" in notes
    zh = write_report(result, tmp_path, lang="zh", files=files)["markdown"].read_text()
    assert "超出 shapes-ursa 所学范围" in zh and "不在 shapes-ursa 的 27 词词表中" in zh
    note = next(x for x in visible_markdown(zh).splitlines() if "所学范围" in x)
    assert english_left(note.replace("'a purple star'", "").replace("'purple', 'star'", "")) == []
