"""``difforge validate`` signs off the configuration that ships: an FP8 transformer file, the device-only
speed/memory options, guidance and negative prompt; ``--quick`` says what it lowered; the reproduce
command is exactly what ran (it parses back to the same options)."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

import difforge.api
from difforge.cli import app
from difforge.config import RunConfig
from difforge.devices import CPUBackend
from difforge.models.qwen_edit import build_tiny_fp8_transformer
from difforge.models.tiny import ensure_tiny
from difforge.validate import ValidateOptions
from difforge.validate.ladder import Ladder
from difforge.validate.options import DUT_ONLY
from difforge.validate.runner import _reproduce

runner = CliRunner()
DEVICE = ["--device", "cpu", "--dtype", "bfloat16"]


def _invoke(args: list[str]) -> Any:
    return runner.invoke(app, args, catch_exceptions=False)


def _parse(command: str, monkeypatch: pytest.MonkeyPatch) -> ValidateOptions:
    """The ValidateOptions the real CLI builds from a ``difforge validate ...`` command line."""
    seen: dict[str, Any] = {}

    def fake_validate(**options: Any) -> Any:
        seen.update(options)
        return SimpleNamespace(report_paths={}, verdict="PASS", exit_code=0)

    monkeypatch.setattr(difforge.api, "validate", fake_validate)
    words = shlex.split(command)
    assert words[:2] == ["difforge", "validate"]
    result = _invoke(words[1:])
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return ValidateOptions(**seen)


@pytest.fixture(scope="module")
def fp8_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("fp8") / "qwen-edit-fp8-scaled.safetensors"
    build_tiny_fp8_transformer(ensure_tiny("tiny-qwen-edit"), path, "scaled")
    return path


@pytest.fixture(scope="module")
def fp8_run(fp8_file: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    """One small end-to-end validation of the FP8 re-pack through the CLI (shared by the report tests)."""
    out = tmp_path_factory.mktemp("fp8run") / "report"
    result = _invoke(["validate", "--model", "tiny-qwen-edit", *DEVICE, "--quick", "--rounds", "1", "--warmup", "0",
                      "--transformer", str(fp8_file), "--out", str(out), "--quiet"])
    return result, out


# ---- (a) the FP8 file, end to end ------------------------------------------------------------------
def test_fp8_transformer_is_validated_on_every_side(fp8_run: tuple[Any, Path], fp8_file: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    result, out = fp8_run
    assert result.exit_code in (0, 1), (result.exit_code, result.stdout, result.stderr)
    data = json.loads((out / "report.json").read_text())
    weights = [a for a in data["adaptations"] if a["what"] == "transformer weights"]
    assert len(weights) == 1 and weights[0]["choice"] == "fp8 e4m3fn storage, bfloat16 compute"
    assert weights[0]["exact"] is False
    # the reference loaded the same file, upcast to float32 on the CPU: the comparison measures the port
    ref = [a for a in data["reference_adaptations"] if a["what"] == "transformer weights"]
    assert len(ref) == 1 and ref[0]["choice"] == "fp8 e4m3fn storage, float32 compute"
    assert data["config"]["transformer"] == str(fp8_file)
    assert data["rungs"]["smoke"]["verdict"] == "PASS"
    command = data["reproduce"][0]
    assert f"--transformer {shlex.quote(os.path.abspath(fp8_file))}" in command and "--quick" in command
    ran = {k: v for k, v in data["options"].items() if k != "quiet"}  # --quiet changes no result
    assert {k: v for k, v in _parse(command, monkeypatch).to_dict().items() if k != "quiet"} == ran


# ---- (d) --quick says what it lowered ----------------------------------------------------------------
def test_quick_reductions_reach_the_report(fp8_run: tuple[Any, Path]) -> None:
    _, out = fp8_run
    data = json.loads((out / "report.json").read_text())
    assert data["quick_reductions"] == ["steps 50 -> 4", "prompts 3 -> 1"]  # --rounds 1 --warmup 0: unchanged
    md = (out / "report.md").read_text()
    assert "--quick lowered" in md
    for line in data["quick_reductions"]:
        assert f"- {line}\n" in md
    assert "| --transformer |" in md and "qwen-edit-fp8-scaled.safetensors | every side |" in md
    assert "| --offload | none | device under test only |" in md
    html = (out / "report.html").read_text()
    assert "<li>steps 50 -&gt; 4</li>" in html


@pytest.mark.parametrize(("kw", "expected"), [
    ({"quick": True, "rounds": 3, "warmup": 3}, ["steps 25 -> 4", "prompts 3 -> 1", "rounds 3 -> 2", "warmup 3 -> 1"]),
    ({"quick": True, "steps": 10, "rounds": 2, "warmup": 1}, ["prompts 3 -> 1"]),
    ({"quick": False, "rounds": 5, "warmup": 3}, []),
])
def test_quick_lists_only_what_it_changed(tmp_path: Path, kw: dict, expected: list[str]) -> None:
    lad = Ladder(ValidateOptions(model="tiny-ursa", out=tmp_path / "r", device="cpu", dtype="bfloat16", **kw))
    assert lad.quick_reductions == expected
    assert (lad.rounds, lad.warmup) == ((min(kw["rounds"], 2), min(kw["warmup"], 1)) if kw["quick"]
                                        else (kw["rounds"], kw["warmup"]))


# ---- (b) the reference and the floor run the plain path ------------------------------------------------
SHIPPED = {"transformer": "/models/fp8.safetensors", "compile": True, "fast": ["first-block-cache=0.1"],
           "disable": ["batched-cfg"], "offload": "model", "vae_tiling": True, "true_cfg": 3.0,
           "negative_prompt": "blurry", "guidance": 5.0, "guidance_trunc": 0.8, "num_frames": 1}


def _ladder(tmp_path: Path, **kw: Any) -> Ladder:
    return Ladder(ValidateOptions(model="tiny-qwen-edit", out=tmp_path / "r", device="cpu", dtype="bfloat16",
                                  steps=3, height=64, width=64, quick=True, **{**SHIPPED, **kw}))


def test_reference_and_floor_drop_device_only_options(tmp_path: Path) -> None:
    lad = _ladder(tmp_path)
    dut = lad.dut_cfg()
    assert (dut.compile, dut.fast, dut.disable, dut.offload, dut.vae_tiling) == (
        True, ["first-block-cache=0.1"], ["batched-cfg"], "model", True)
    plain = {f: getattr(RunConfig(model="m"), f) for f in DUT_ONLY}
    assert plain == {"compile": False, "fast": [], "disable": [], "offload": "none", "vae_tiling": False,
                     "parallel": "none"}
    for side, dtype in ((lad.ref_cfg(dut), "float32"), (lad.floor_cfg(dut), "bfloat16")):
        assert {f: getattr(side, f) for f in DUT_ONLY} == plain
        assert (side.device, side.dtype) == ("cpu", dtype)
        # what changes the pixels applies to every side
        assert (side.transformer_file, side.true_cfg, side.negative_prompt, side.guidance, side.guidance_trunc,
                side.num_frames, side.steps, side.height, side.width, side.seed, side.prompt) == (
            "/models/fp8.safetensors", 3.0, "blurry", 5.0, 0.8, 1, 3, 64, 64, 0, dut.prompt)
    unset = _ladder(tmp_path, negative_prompt=None, guidance=None, true_cfg=None, guidance_trunc=None, num_frames=None)
    cfg, defaults = unset.ref_cfg(unset.dut_cfg()), RunConfig(model="m")
    assert (cfg.guidance, cfg.guidance_trunc, cfg.true_cfg, cfg.num_frames) == (
        defaults.guidance, defaults.guidance_trunc, defaults.true_cfg, defaults.num_frames)
    assert cfg.negative_prompt is unset.probe_type.negative_prompt  # the probe's default


def test_only_the_device_loads_and_probes_with_device_only_options(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    lad = _ladder(tmp_path)
    loads: list[RunConfig] = []

    def fake_load(model: str, backend: Any, dtype: Any, cfg: RunConfig, **kw: Any) -> Any:
        loads.append(cfg)
        return SimpleNamespace(family="qwen-edit")

    class Recorder:  # a probe that hands back the RunConfig it was given
        def __init__(self, pipe: Any) -> None:
            self.pipe = pipe

        def forward_step(self, cfg: RunConfig, i: int, inputs: dict) -> RunConfig:
            return cfg

    monkeypatch.setattr(difforge.engine, "load_pipeline", fake_load)
    monkeypatch.setattr("difforge.validate.ladder.probe_for", Recorder)
    dut_pipe, _ = lad.load(lad.dut_backend, lad.dut_dtype, dut=True)
    ref_pipe, _ = lad.load(lad.ref_backend, lad.ref_dtype)
    floor_pipe, _ = lad.load(CPUBackend(), torch.float16)
    assert loads[0].compile and loads[0].offload == "model" and loads[0].fast == ["first-block-cache=0.1"]
    for cfg in loads[1:]:
        assert (cfg.compile, cfg.offload, cfg.fast, cfg.disable, cfg.vae_tiling) == (False, "none", [], [], False)
        assert cfg.transformer_file == "/models/fp8.safetensors" and cfg.true_cfg == 3.0
    dut_cfg = lad.dut_cfg()
    assert lad.probe(dut_pipe).forward_step(dut_cfg, 0, {}) is dut_cfg
    for pipe in (ref_pipe, floor_pipe):  # the rungs hand every probe the device's config
        seen = lad.probe(pipe).forward_step(dut_cfg, 0, inputs={})
        assert (seen.compile, seen.offload, seen.fast, seen.disable) == (False, "none", [], [])
        assert seen.transformer_file == dut_cfg.transformer_file and seen.negative_prompt == "blurry"


def test_a_step_cache_on_the_device_leaves_the_component_probe_exact() -> None:
    """--fast first-block-cache installs diffusers hooks that refuse a bare transformer call; the component
    and operator rungs call it once, from an empty cache: the full forward, every time."""
    from difforge.models.qwen_edit import QwenEditPipeline
    from difforge.models.qwen_edit.probe import QwenEditProbe
    from difforge.runtime.record import RunRecord

    folder = ensure_tiny("tiny-qwen-edit")
    cfg = RunConfig(model=str(folder), prompt="make it red", steps=2, height=64, width=64, quiet=True,
                    fast=["first-block-cache=0.5"])
    qe = QwenEditPipeline.from_pretrained(folder, CPUBackend(), torch.float32, cfg, RunRecord("edit"))
    assert qe.pipe.transformer.is_cache_enabled
    probe = QwenEditProbe(qe)
    inputs = probe.component_inputs(cfg)["transformer"]
    first = probe.run_component("transformer", inputs)
    again = probe.run_component("transformer", inputs)  # a cache kept from the first call would skip blocks
    qe.configure(RunConfig(model=str(folder), steps=2, quiet=True))  # the plain path: no cache
    assert not qe.pipe.transformer.is_cache_enabled
    plain = probe.run_component("transformer", inputs)
    assert torch.equal(first, again) and torch.equal(first, plain)


# ---- (c) bad values: exit 2, one line, nothing at --out -------------------------------------------------
@pytest.mark.parametrize(("model", "args", "needle"), [
    ("tiny-qwen-edit", ["--offload", "bogus"], "--offload plan 'bogus'"),
    ("tiny-qwen-edit", ["--fast", "nonsense"], "--fast 'nonsense'"),
    ("tiny-qwen-edit", ["--disable", "nonsense"], "--disable 'nonsense'"),
    ("tiny-ursa", ["--fast", "nonsense"], "Unknown --fast 'nonsense' for URSA"),
    ("tiny-qwen-edit", ["--guidance", "nan"], "--guidance must be a number"),
    ("tiny-qwen-edit", ["--true-cfg", "1000"], "--true-cfg must be a number"),
    ("tiny-ursa", ["--guidance-trunc", "2"], "--guidance-trunc must be a number"),
    ("tiny-ursa", ["--num-frames", "0"], "--num-frames"),
    ("tiny-qwen-edit", ["--transformer", "missing.safetensors"], "missing.safetensors does not exist"),
    ("tiny-qwen-edit", ["--transformer", "FOLDER"], "is a folder"),
    ("tiny-ursa", ["--seed", "-1"], "--seed"),
])
def test_bad_shipped_options_exit_2_with_one_line(tmp_path: Path, model: str, args: list[str], needle: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    def no_load(*a: Any, **k: Any) -> Any:
        raise AssertionError("a model was loaded: the option was not checked up front")

    monkeypatch.setattr(difforge.engine, "load_pipeline", no_load)
    work = tmp_path / "work"
    work.mkdir()
    args = [str(work) if a == "FOLDER" else a for a in args]
    out = tmp_path / "r"
    result = _invoke(["validate", "--model", model, *DEVICE, "--quick", "--out", str(out), *args])
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    err = result.stderr.strip()
    assert err.startswith("difforge: error: ") and len(err.splitlines()) == 1, err
    assert needle in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["work"]  # no --out, no staging folder
    assert list(work.iterdir()) == []


# ---- (e) the reproduce command round-trips --------------------------------------------------------------
def test_reproduce_parses_back_to_the_same_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    opts = ValidateOptions(
        model="tiny-qwen-edit", out=str(tmp_path / "r"), device="cpu", dtype="bfloat16", reference="cpu:float32",
        images=[str(tmp_path / "a b.png"), str(tmp_path / "c.png")], prompts=str(tmp_path / "prompts.txt"),
        steps=6, height=64, width=96, rounds=2, warmup=0, seed=7, quick=True, lang="zh", floor="cpu:float16",
        allow_self_compare=True, fail_on="warn", transformer=str(tmp_path / "fp8 file.safetensors"), compile=True,
        fast=["first-block-cache=0.1", "taylorseer"], disable=["batched-cfg", "real-rope"], offload="model",
        vae_tiling=True, num_frames=1, guidance=5.5, guidance_trunc=0.85, true_cfg=3.25,
        negative_prompt="-blurry, 'low' quality", prompt_set=str(tmp_path / "set.json"), speed_table=False,
    )
    (command,) = _reproduce(opts)
    for flag in ("--compile", "--vae-tiling", "--quick", "--allow-self-compare", "--fast first-block-cache=0.1",
                 "--no-speed-table", "--prompt-set",
                 "--fast taylorseer", "--disable batched-cfg", "--disable real-rope", "--offload model"):
        assert flag in command, flag
    assert _parse(command, monkeypatch).to_dict() == opts.to_dict()


def test_reproduce_names_input_files_by_absolute_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    opts = ValidateOptions(model="tiny-qwen-edit", out="r", images=["in.png"], prompts="p.txt",
                           transformer="w/fp8.safetensors", negative_prompt=" ")
    (command,) = _reproduce(opts)
    monkeypatch.chdir("/")  # the command means the same from anywhere
    parsed = _parse(command, monkeypatch)
    assert parsed.images == [str(tmp_path / "in.png")] and parsed.prompts == str(tmp_path / "p.txt")
    assert parsed.transformer == str(tmp_path / "w" / "fp8.safetensors") and parsed.negative_prompt == " "
    assert "--offload" not in command and "--compile" not in command and "--guidance" not in command  # defaults


def test_reference_and_floor_draw_from_the_devices_random_stream(tmp_path: Path, monkeypatch) -> None:
    """An accelerator defaults to the Philox stream; its CPU reference and floor must draw from it too."""
    from difforge.devices.cpu import CPUBackend
    from difforge.validate import ValidateOptions
    from difforge.validate.ladder import Ladder

    monkeypatch.setattr(CPUBackend, "random_stream", "philox")  # a CPU standing in for an accelerator's default
    lad = Ladder(ValidateOptions(model="tiny-ursa", out=tmp_path / "r", device="cpu", dtype="bfloat16"))
    dut = lad.dut_cfg()
    assert lad.ref_cfg(dut).fast == ["philox-rng"] and lad.floor_cfg(dut).fast == ["philox-rng"]
    named = Ladder(ValidateOptions(model="tiny-ursa", out=tmp_path / "r", device="cpu", dtype="bfloat16",
                                   disable=["philox-rng"]))
    assert named.ref_cfg(named.dut_cfg()).disable == ["philox-rng"]  # the device's own choice is followed
    qwen = Ladder(ValidateOptions(model="tiny-qwen-edit", out=tmp_path / "r", device="cpu", dtype="bfloat16"))
    assert qwen.ref_cfg(qwen.dut_cfg()).fast == []  # Qwen draws everything on the CPU generator
