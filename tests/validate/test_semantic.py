"""The semantic rung: the device may lose (get wrong where the reference is right) at most what the floor
loses plus 10 % of the prompts (at least one) to PASS, twice that to WARN; a reference that fails most of
the set cannot judge (WARN); and the rung runs end to end from a --prompt-set file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from difforge.shapes.checker import Score
from difforge.validate import ValidateOptions, Verdict
from difforge.validate.semantic import Scored, allowance, semantic_rung

from .ladder_run import run_validation

OK = Score(True, {"background": True, "shape": True, "colour": True}, "ok")
BAD = Score(False, {"background": True, "shape": False, "colour": True}, "saw a square")


def _set(n: int, device_lost: int, floor_lost: int, reference_wrong: int = 0) -> list[Scored]:
    out = []
    for i in range(n):
        ref = BAD if i >= n - reference_wrong else OK
        out.append(Scored(f"c{i:03d}", f"prompt {i}", BAD if i < device_lost else ref,
                          ref, BAD if i < floor_lost else ref))
    return out


def test_allowance_is_ten_percent_at_least_one() -> None:
    assert [allowance(n) for n in (1, 4, 10, 16, 40)] == [1, 1, 1, 2, 4]


@pytest.mark.parametrize(("device_lost", "floor_lost", "verdict"), [
    (0, 0, Verdict.PASS), (2, 0, Verdict.PASS), (3, 1, Verdict.PASS),  # within floor + 2 (16 prompts)
    (3, 0, Verdict.WARN), (5, 1, Verdict.WARN),                         # within floor + 4
    (5, 0, Verdict.FAIL), (14, 1, Verdict.FAIL),                        # a port that lost the meaning
])
def test_the_device_is_judged_by_what_it_loses_beyond_the_floor(device_lost, floor_lost, verdict) -> None:
    rung = semantic_rung(_set(16, device_lost, floor_lost), "emulated bfloat16")
    assert rung.verdict is verdict, rung.summary
    assert rung.data["device_lost"] == device_lost and rung.data["floor_lost"] == floor_lost
    assert f"device {16 - device_lost}/16" in rung.summary
    lost_rows = [r for r in rung.rows if r.verdict is Verdict.WARN]
    assert len(lost_rows) == device_lost and all("saw a square" in r.note for r in lost_rows)


def test_a_reference_that_fails_most_prompts_cannot_judge() -> None:
    rung = semantic_rung(_set(16, 0, 0, reference_wrong=9), "emulated bfloat16")
    assert rung.verdict is Verdict.WARN and "does not fit this model" in rung.summary
    # prompts both sides miss say nothing about the port
    assert sum(r.verdict is Verdict.SKIP for r in rung.rows) == 9


def test_without_a_floor_only_the_allowance_remains() -> None:
    scored = [Scored(s.item_id, s.prompt, s.device, s.reference) for s in _set(10, 1, 0)]
    rung = semantic_rung(scored, "none")
    assert rung.verdict is Verdict.PASS and "no floor" in rung.summary and rung.data["floor_correct"] is None
    scored = [Scored(s.item_id, s.prompt, s.device, s.reference) for s in _set(10, 3, 0)]
    assert semantic_rung(scored, "none").verdict is Verdict.FAIL


def test_no_prompts_is_a_skip() -> None:
    assert semantic_rung([], "x").verdict is Verdict.SKIP


def test_validate_runs_the_semantic_rung_from_a_prompt_set_file(tmp_path: Path) -> None:
    """Plumbing on the random-weight tiny-ursa: the set is read, every prompt runs on the three sides and is
    scored, the device's pictures become a contact sheet, and the report has the section.  Random weights
    draw no shapes, so the reference fails the set and the rung says it cannot judge (WARN)."""
    pset = tmp_path / "set.json"
    pset.write_text(json.dumps({"format": "difforge-prompt-set/1", "kind": "caption", "items": [
        {"id": f"p{i}", "prompt": f"a {c} circle on a white background",
         "expect": {"background": "white", "items": [{"shape": "circle", "colour": c}]}}
        for i, c in enumerate(("red", "blue", "green", "yellow", "black"))]}))
    src = tmp_path / "model_src"  # --scan-source rides along: the report lists what difforge scan finds
    src.mkdir()
    (src / "kernels.py").write_text("import torch\n_k = torch.cuda.jiterator._create_jit_fn('x')\n")
    result = run_validation(ValidateOptions(model="tiny-ursa", device="cpu", dtype="bfloat16", quick=True,
                                            out=tmp_path / "r", quiet=True, height=64, width=64, rounds=1, warmup=0,
                                            speed_table=False, prompt_set=str(pset), scan_source=str(src)))
    rung = result.rungs["semantic"]
    assert rung.data["n"] == 4  # --quick: the first 4 prompts
    assert rung.verdict is Verdict.WARN and "does not fit" in rung.summary
    assert result.verdict is Verdict.WARN and (tmp_path / "r" / "images" / "semantic_device.png").is_file()
    md = result.report_paths["markdown"].read_text()
    assert "Semantic: prompts drawn correctly" in md and "semantic_device.png" in md
    data = json.loads(result.report_paths["json"].read_text())
    assert any("semantic prompts 5 -> 4" in q for q in data["quick_reductions"])
    assert [f["rule"] for f in data["scan"]["findings"]] == ["DF101"] and data["scan"]["device"] == "cpu"
    assert "Porting hazards in the model's source" in md and "kernels.py:2" in md and "DF101" in md


def test_a_scan_source_that_does_not_exist_is_refused_before_anything_runs(tmp_path: Path) -> None:
    from difforge.errors import DifforgeError

    with pytest.raises(DifforgeError):
        run_validation(ValidateOptions(model="tiny-ursa", device="cpu", dtype="bfloat16", quick=True,
                                       out=tmp_path / "r", quiet=True, scan_source=str(tmp_path / "missing")))
    assert not (tmp_path / "r").exists()


def test_a_bad_prompt_set_is_refused_before_anything_runs(tmp_path: Path) -> None:
    from difforge.errors import DifforgeError

    bad = tmp_path / "set.json"
    bad.write_text("{not json")
    with pytest.raises(DifforgeError):
        run_validation(ValidateOptions(model="tiny-ursa", device="cpu", dtype="bfloat16", quick=True,
                                       out=tmp_path / "r", quiet=True, prompt_set=str(bad)))
    assert not (tmp_path / "r").exists()


# ---- on the committed trained model: the rung passes a clean port and fails one that loses meaning ------
def _validate_args(model: str, out: Path) -> list[str]:
    return ["validate", "--model", model, "--device", "cpu", "--dtype", "bfloat16", "--quick", "--seed", "0",
            "--rounds", "1", "--warmup", "0", "--no-speed-table", "--quiet", "--out", str(out)]


@pytest.mark.parametrize("fault, verdict", [("none", "PASS"), ("embedding_shift", "FAIL")])
@pytest.mark.slow  # a shapes-ursa validation with its semantic rung, per case: minutes under load (make test-slow)
def test_shapes_ursa_semantic_rung_passes_clean_and_fails_shifted_embeddings(tmp_path: Path, fault: str,
                                                                            verdict: str) -> None:
    """bfloat16 on the CPU against float32, the held-out captions (--quick: 4).  ``embedding_shift`` reads
    every embedding row one id off (a caption word becomes the next word of the vocabulary, an image
    token the next code): the numbers of such a port can stay near the floor, its pictures cannot."""
    from .fault_cli import main as fault_main

    code = fault_main([fault, "--", *_validate_args("shapes-ursa", tmp_path / "r")])
    data = json.loads((tmp_path / "r" / "report.json").read_text())
    sem = data["rungs"]["semantic"]
    assert sem["verdict"] == verdict, sem["summary"]
    assert sem["data"]["n"] == 4 and sem["data"]["reference_correct"] >= 3  # the reference draws the set
    if verdict == "PASS":
        assert sem["data"]["device_correct"] >= 3
    else:
        assert sem["data"]["device_lost"] > sem["data"]["floor_lost"] + 2 * sem["data"]["allowance"]
        assert data["verdict"] == "FAIL" and code == 1


@pytest.mark.parametrize("fault, verdict", [("none", "PASS"), ("embedding_shift", "FAIL"), ("cat_swap", "FAIL")])
def test_shapes_qwen_edit_semantic_rung_passes_clean_and_fails_a_port_that_loses_the_edit(
        tmp_path: Path, fault: str, verdict: str) -> None:
    """The same on the trained edit model, its held-out edits (--quick: 4).  ``embedding_shift`` makes every
    instruction word the next word of the text encoder's vocabulary; ``cat_swap`` swaps the order of every
    concatenation of two same-shape bf16 tensors: either port still draws a picture, it no longer does the
    edit asked for."""
    from .fault_cli import main as fault_main

    code = fault_main([fault, "--", *_validate_args("shapes-qwen-edit", tmp_path / "r")])
    data = json.loads((tmp_path / "r" / "report.json").read_text())
    sem = data["rungs"]["semantic"]
    assert sem["verdict"] == verdict, sem["summary"]
    assert sem["data"]["n"] == 4 and sem["data"]["reference_correct"] >= 3
    if verdict == "PASS":
        assert sem["data"]["device_correct"] >= 3 and code == 0
    else:
        assert sem["data"]["device_lost"] > sem["data"]["floor_lost"] + 2 * sem["data"]["allowance"]
        assert data["verdict"] == "FAIL" and code == 1
