"""Review fixes: no unjudged PASS, skipped rungs show in the verdict, bad inputs fail before DIR exists,
crashes outside the rungs keep the report, and the NaN-aware localisation."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image

from difforge.devices import dtype_name
from difforge.errors import InputError, SizeError
from difforge.validate import ValidateOptions, Verdict, parse_reference, runner
from difforge.validate.inputs import read_prompts
from difforge.validate.steps import StepTrace, localise
from difforge.validate.trajectory import TrajectoryRun, trajectory_rung
from difforge.validate.verdict import RungResult, overall

from .ladder_run import run_validation


def _opts(model: str, out: Path, **kw: Any) -> ValidateOptions:
    kw.setdefault("dtype", "bfloat16")
    kw.setdefault("speed_table", False)
    return ValidateOptions(model=model, device="cpu", quick=True, out=out, quiet=True, rounds=1, warmup=0, **kw)


# ---- 1. trajectory without a floor is never a bare PASS ---------------------------------------------------
def _run(colour: tuple[int, int, int]) -> TrajectoryRun:
    return TrajectoryRun([Image.new("RGB", (16, 16), colour)], StepTrace())


def test_trajectory_without_floor_fails_a_wrong_image_and_only_warns_a_good_one() -> None:
    black_vs_white = trajectory_rung([(0, _run((0, 0, 0)), _run((255, 255, 255)), None)], "x")
    assert black_vs_white.verdict is Verdict.FAIL
    close = trajectory_rung([(0, _run((100, 120, 140)), _run((101, 120, 140)), None)], "none (cpu)")
    assert close.verdict is Verdict.WARN and "no noise floor" in close.summary
    assert close.data["floor_available"] is False
    with_floor = trajectory_rung([(0, _run((100, 120, 140)), _run((101, 120, 140)), _run((100, 121, 140)))], "f")
    assert with_floor.verdict is Verdict.PASS and with_floor.data["floor_available"] is True


class _CpuOnlyLadder:
    """A Ladder whose device under test computes in float16 while the reference is the CPU."""

    def __init__(self, tmp_path: Path, reference: str = "cpu:float32", fail: bool = False,
                 dtype: str = "bfloat16") -> None:
        self.lad = runner.Ladder(_opts("tiny-ursa", tmp_path / "r", reference=reference, floor="cpu", dtype=dtype))
        self.lad.dut_dtype = torch.float16  # CPU refuses float16: as for an NPU/CUDA float16 port
        self.loaded: list[tuple[str, str]] = []

        def load(backend: Any, dtype: torch.dtype, overrides: dict | None = None) -> tuple[Any, Any]:
            self.loaded.append((str(backend.device), dtype_name(dtype)))
            if fail:
                raise RuntimeError("out of host memory")
            return f"floor@{dtype_name(dtype)}", None

        self.lad.load = load  # type: ignore[method-assign]


def test_floor_falls_back_to_the_nearest_dtype_the_reference_runs(tmp_path: Path) -> None:
    fake = _CpuOnlyLadder(tmp_path)
    assert fake.lad.load_floor(None) == "floor@bfloat16"
    assert fake.loaded == [("cpu", "bfloat16")]
    assert "nearest to float16" in fake.lad.floor_label and fake.lad.floor_dtype == torch.bfloat16
    assert any("does not run float16" in n for n in fake.lad.notes)


def test_no_floor_possible_or_floor_crash_leaves_no_floor_with_a_note(tmp_path: Path) -> None:
    fake = _CpuOnlyLadder(tmp_path, reference="cpu:bfloat16", dtype="float32")  # bfloat16 is the reference itself
    assert fake.lad.load_floor(None) is None and fake.loaded == []
    assert fake.lad.floor_label.startswith("none") and "absolute bound" in fake.lad.notes[-1]
    crash = _CpuOnlyLadder(tmp_path, fail=True)
    assert crash.lad.load_floor(None) is None
    assert "out of host memory" in crash.lad.notes[-1]


# ---- 2. skipped accuracy rungs ----------------------------------------------------------------------------
def test_skipped_accuracy_rung_makes_the_overall_verdict_a_warning() -> None:
    rungs = {k: RungResult(k, Verdict.PASS) for k in ("smoke", "operator", "component", "step", "trajectory")}
    assert overall(rungs) == (Verdict.PASS, [])
    rungs["operator"] = RungResult("operator", Verdict.SKIP, "the reference run recorded no step")
    verdict, reasons = overall(rungs)
    assert verdict is Verdict.WARN and "operator" in reasons[0] and "recorded no step" in reasons[0]
    rungs["step"] = RungResult("step", Verdict.FAIL)
    assert overall(rungs)[0] is Verdict.FAIL
    assert overall({"smoke": RungResult("smoke", Verdict.SKIP)})[0] is Verdict.FAIL
    del rungs["step"], rungs["operator"]
    rungs["component"] = RungResult("component", Verdict.PASS)
    verdict, reasons = overall(rungs, ["the gallery failed"])
    assert verdict is Verdict.WARN and any("step rung did not run" in r for r in reasons)


# ---- 3, 5, 6. bad inputs fail before anything runs or is written ------------------------------------------
def test_bad_options_raise_before_loading(tmp_path: Path) -> None:
    out = tmp_path / "r"
    for bad in ({"steps": 1}, {"height": 0}, {"width": -16}):
        with pytest.raises(InputError):
            run_validation(_opts("tiny-ursa", out, **bad))
        assert not out.exists()
    a_file = tmp_path / "report.txt"
    a_file.write_text("keep me")
    with pytest.raises(InputError, match="is a file"):
        run_validation(_opts("tiny-ursa", a_file))
    assert a_file.read_text() == "keep me"
    with pytest.raises(InputError, match="is a file"):
        run_validation(_opts("tiny-ursa", a_file / "sub"))


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes anywhere")
def test_unwritable_out_dir(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        with pytest.raises(InputError, match="not writable"):
            run_validation(_opts("tiny-ursa", locked / "r"))
    finally:
        locked.chmod(0o700)


@pytest.mark.parametrize("model", ["tiny-ursa", "tiny-qwen-edit"])
def test_bad_size_raises_before_the_reference_loads_and_leaves_no_dir(tmp_path: Path, model: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    loads: list[str] = []
    original = runner.Ladder.load

    def counting(self: runner.Ladder, backend: Any, dtype: torch.dtype, overrides: dict | None = None,
                 dut: bool = False) -> Any:
        loads.append(dtype_name(dtype))
        return original(self, backend, dtype, overrides, dut=dut)

    monkeypatch.setattr(runner.Ladder, "load", counting)
    out = tmp_path / "r"
    with pytest.raises(SizeError, match="multiple of"):
        run_validation(_opts(model, out, height=36, width=32))
    assert loads == ["bfloat16"]  # only the device under test
    assert not out.exists()  # no DIR, no images/input_synthetic.png


def test_prompts_file_not_utf8_or_a_folder(tmp_path: Path) -> None:
    latin = tmp_path / "prompts.txt"
    latin.write_bytes("une forêt enneigée\n".encode("latin-1"))
    with pytest.raises(InputError, match="not UTF-8"):
        read_prompts(latin)
    with pytest.raises(InputError, match="not UTF-8"):
        run_validation(_opts("tiny-ursa", tmp_path / "r", prompts=str(latin)))
    assert not (tmp_path / "r").exists()
    with pytest.raises(InputError, match="is a folder"):
        ValidateOptions(model="tiny-ursa", out=tmp_path / "r", prompts=str(tmp_path)).check()
    with pytest.raises(InputError, match="is a folder"):
        read_prompts(tmp_path)


def test_reference_spec_errors_name_the_problem() -> None:
    with pytest.raises(InputError, match="unknown dtype 'int8'"):
        parse_reference("cpu:int8")
    with pytest.raises(InputError, match="empty"):
        parse_reference("")
    with pytest.raises(InputError, match="empty"):
        parse_reference("   ")
    with pytest.raises(InputError):
        parse_reference("cpu:")
    assert parse_reference("cpu:fp32") == ("cpu", "float32")
    assert parse_reference("cuda:1") == ("cuda:1", "float32")
    assert parse_reference(None) == ("cpu", "float32")


# ---- 4. a crash outside the rungs keeps the report ------------------------------------------------------
def test_crashing_reference_runs_and_gallery_still_write_the_report(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("reference ran out of memory")

    def gallery_boom(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("gallery exploded")

    monkeypatch.setattr(runner._Climb, "_reference_runs", boom)
    monkeypatch.setattr(runner._Climb, "gallery", gallery_boom)
    result = run_validation(_opts("tiny-ursa", tmp_path / "r", steps=2, height=32, width=32))
    verdicts = result.rung_verdicts()
    assert verdicts["smoke"] == "PASS" and verdicts["component"] == "PASS"
    for key in ("operator", "step", "trajectory"):
        assert verdicts[key] == "FAIL" and "reference ran out of memory" in result.rungs[key].summary
    assert result.verdict is Verdict.FAIL and result.exit_code == 1
    assert any("gallery exploded" in r for r in result.data["verdict_reasons"])
    md = result.report_paths["markdown"].read_text()
    assert "gallery exploded" in md and "reference ran out of memory" in md
    assert result.report_paths["html"].is_file()


def test_crashing_reference_load_still_writes_the_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    original = runner.Ladder.load

    def load(self: runner.Ladder, backend: Any, dtype: torch.dtype, overrides: dict | None = None,
             dut: bool = False) -> Any:
        if dtype == torch.float32:
            raise RuntimeError("reference load crashed")
        return original(self, backend, dtype, overrides, dut=dut)

    monkeypatch.setattr(runner.Ladder, "load", load)
    result = run_validation(_opts("tiny-ursa", tmp_path / "r", steps=2, height=32, width=32))
    assert result.verdict is Verdict.FAIL
    for key in ("operator", "component", "step", "trajectory"):
        assert result.rungs[key].verdict is Verdict.FAIL and "reference" in result.rungs[key].summary
    assert result.report_paths["json"].is_file()


# ---- 7. localisation is NaN-aware --------------------------------------------------------------------------
class _Block(torch.nn.Module):
    def __init__(self, nan_on_call: int | None = None) -> None:
        super().__init__()
        self.calls = 0
        self.nan_on_call = nan_on_call

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x * 2 + 1
        if self.calls == self.nan_on_call:
            out = out.clone()
            out[0] = float("nan")
        self.calls += 1
        return out


class _Pipe:
    """Block 0 runs twice per step (like a CFG pair), block 1 consumes its output."""

    def __init__(self, nan_on_call: int | None = None) -> None:
        self.blocks = [("b0", _Block(nan_on_call)), ("b1", _Block())]

    def transformer_blocks(self) -> list[tuple[str, torch.nn.Module]]:
        return self.blocks

    def forward_step(self, cfg: Any, step: int, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        b0, b1 = self.blocks[0][1], self.blocks[1][1]
        b0.calls = 0
        x = inputs["x"]
        first = b0(x)
        second = b0(x)
        return {"noise_pred": b1(first + second)}


@pytest.mark.parametrize("nan_on_call", [0, 1])
def test_localise_names_a_block_with_a_nan_call_whatever_its_position(nan_on_call: int) -> None:
    inputs = {"x": torch.linspace(-1, 1, 64)}
    loc = localise(_Pipe(nan_on_call), _Pipe(), None, 0, inputs, floor=_Pipe())
    assert loc["first_divergent"] == "b0"
    b0 = loc["blocks"][0]
    assert b0["divergent"] and b0["cosine"] != b0["cosine"]


@pytest.mark.parametrize("existing", [False, True])
def test_late_user_error_takes_back_what_the_run_wrote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       existing: bool) -> None:
    def late(*args: Any, **kwargs: Any) -> None:
        raise SizeError("num_frames must be 1 plus a multiple of 4 for this model, got 2.")

    monkeypatch.setattr(runner.Ladder, "run", late)
    out = tmp_path / "r"
    if existing:  # an empty folder (one with the user's files is refused up front: tests/validate/test_out_folder.py)
        out.mkdir()
    with pytest.raises(SizeError):
        run_validation(_opts("tiny-qwen-edit", out, steps=2, height=32, width=32))
    if existing:  # the user's folder stays; the synthetic input this run saved is gone
        assert out.is_dir() and list(out.rglob("*")) == []
    else:
        assert not out.exists()
