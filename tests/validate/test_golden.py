"""Golden bundles: made in one process, compared against in another, refused when they do not fit.

The end-to-end part runs the real CLI in subprocesses, as a user on two machines would: ``difforge
golden`` writes the bundle, then ``difforge validate --golden`` (through ``tests.validate.fault_cli``,
so a planted fault can break the device under test only) compares a clean device (PASS), a broken
one (FAIL), and is refused with exit 2 for other weights, a tampered bundle and other settings.
Sizes are small (tiny-ursa, 64x64, --quick) so the whole file stays near two minutes on 2 cores.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from difforge.models.registry import resolve_model
from difforge.validate import bundle as bundle_mod
from difforge.validate.bundle import BundleWriter, GoldenError, Reducer, open_bundle, pack, unpack

ROOT = Path(__file__).resolve().parents[2]
SIZE = ["--height", "64", "--width", "64", "--quick"]
DUT = ["--device", "cpu", "--dtype", "bfloat16", "--rounds", "1", "--warmup", "0", "--quiet", "--no-speed-table"]


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'src'}", "OMP_NUM_THREADS": "1"}
    env.pop("DIFFORGE_DEBUG", None)
    return env


def _cli(*args: str, fault: str | None = None) -> subprocess.CompletedProcess[str]:
    cmd = ([sys.executable, "-m", "tests.validate.fault_cli", fault, "--", *args] if fault is not None
           else [sys.executable, "-m", "difforge", *args])
    return subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=900)


def _verdict(report: Path) -> str:
    return json.loads((report / "report.json").read_text())["verdict"]


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("golden") / "bundle"
    res = _cli("golden", "--model", "tiny-ursa", "--dtype", "bfloat16", *SIZE, "--quiet", "--out", str(out))
    assert res.returncode == 0, res.stderr
    assert "golden:" in res.stdout
    return out


# ---- end to end, two processes -----------------------------------------------------------------
def test_clean_device_passes_against_a_bundle_made_in_another_process(golden: Path, tmp_path: Path) -> None:
    report = tmp_path / "clean"
    res = _cli("validate", "--model", "tiny-ursa", *DUT, *SIZE, "--golden", str(golden), "--out", str(report),
               fault="none")
    assert res.returncode == 0, res.stderr[-2000:]
    data = json.loads((report / "report.json").read_text())
    assert data["verdict"] == "PASS"
    assert "golden bundle" in data["floor_label"]
    assert data["golden"]["reference"] == "cpu float32"
    assert "--golden" in data["reproduce"][0]
    manifest = json.loads((golden / "manifest.json").read_text())
    assert data["signoff"]["weights"] == manifest["weights"] and data["signoff"]["weights"]  # the same files, hashed
    judged = {k: v["verdict"] for k, v in data["rungs"].items()}
    assert judged["component"] == judged["step"] == judged["trajectory"] == "PASS"


def test_broken_device_fails_against_the_bundle(golden: Path, tmp_path: Path) -> None:
    report = tmp_path / "broken"
    res = _cli("validate", "--model", "tiny-ursa", *DUT, *SIZE, "--golden", str(golden), "--out", str(report),
               fault="linear_noise")
    assert res.returncode == 1, res.stderr[-2000:]
    data = json.loads((report / "report.json").read_text())
    assert data["verdict"] == "FAIL"
    # the rungs that read the bundle catch it (not only the operator rung, which computes on the host)
    assert "FAIL" in {data["rungs"]["component"]["verdict"], data["rungs"]["step"]["verdict"]}
    loc = data["rungs"]["step"]["data"]["localisation"]  # located from the bundle's recorded blocks
    assert loc is not None and loc["blocks"] and loc["first_divergent"] is not None


def test_sampled_bundle_of_an_edit_model_passes_a_clean_device(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Small sampling limits, so every large-tensor path (sampled rows, elements, block samples) runs."""
    from difforge.validate import ValidateOptions
    from difforge.validate.golden import make_golden

    from .ladder_run import run_validation

    for name, value in (("FULL_LIMIT", 2048), ("SAMPLE", 1024), ("BLOCK_FULL", 256), ("BLOCK_SAMPLE", 128)):
        monkeypatch.setattr(bundle_mod, name, value)
    common = {"model": "tiny-qwen-edit", "device": "cpu", "dtype": "bfloat16", "quick": True, "quiet": True,
              "height": 64, "width": 64}
    made = make_golden(ValidateOptions(out=tmp_path / "g", **common))
    plans = open_bundle(tmp_path / "g").reducer.plans
    assert any(k.startswith("rows:") for k in plans) and any(k.startswith("block:") for k in plans)
    assert made.manifest["bytes"] < 2 << 20
    result = run_validation(ValidateOptions(out=tmp_path / "r", golden=str(tmp_path / "g"), rounds=1, warmup=0,
                                            speed_table=False, **common))
    assert result.verdict.name == "PASS", result.rung_verdicts()
    assert {result.rung_verdicts()[k] for k in ("component", "step", "trajectory")} == {"PASS"}
    assert result.data["golden"]["floor"].startswith("emulated bfloat16")


def _one_line_refusal(res: subprocess.CompletedProcess[str], *words: str) -> None:
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:])
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    for word in words:
        assert word in lines[0], lines[0]


def test_bundle_from_other_weights_is_refused(golden: Path, tmp_path: Path) -> None:
    folder, _ = resolve_model("tiny-ursa")
    other = tmp_path / "other-ursa"
    shutil.copytree(folder, other)
    weights = sorted((other / "transformer").glob("*.safetensors"))[0]
    tensors = load_file(str(weights))
    name = next(k for k, v in tensors.items() if v.is_floating_point())
    tensors[name] = tensors[name] + 0.01
    save_file(tensors, str(weights))
    report = tmp_path / "r"
    res = _cli("validate", "--model", str(other), *DUT, *SIZE, "--golden", str(golden), "--out", str(report))
    _one_line_refusal(res, "other weights", weights.name)
    assert not report.exists()


def test_tampered_bundle_is_refused(golden: Path, tmp_path: Path) -> None:
    tampered = tmp_path / "tampered"
    shutil.copytree(golden, tampered)
    data = tampered / "data.json"
    data.write_text(data.read_text().replace('"seeds"', '"seeds" ', 1))
    report = tmp_path / "r"
    res = _cli("validate", "--model", "tiny-ursa", *DUT, *SIZE, "--golden", str(tampered), "--out", str(report))
    _one_line_refusal(res, "data.json", "sha256")
    assert not report.exists()


def test_other_settings_and_flags_are_refused(golden: Path, tmp_path: Path) -> None:
    report = tmp_path / "r"
    res = _cli("validate", "--model", "tiny-ursa", *DUT, "--height", "64", "--width", "64", "--quick", "--steps", "5",
               "--golden", str(golden), "--out", str(report))
    _one_line_refusal(res, "--steps")
    res = _cli("validate", "--model", "tiny-ursa", *DUT, *SIZE, "--seed", "3", "--golden", str(golden),
               "--out", str(report))
    _one_line_refusal(res, "--seed")
    res = _cli("validate", "--model", "tiny-ursa", *DUT, *SIZE, "--floor", "cpu:float16", "--golden", str(golden),
               "--out", str(report))
    _one_line_refusal(res, "--floor")
    res = _cli("validate", "--model", "tiny-ursa", *DUT, *SIZE, "--golden", str(tmp_path), "--out", str(report))
    _one_line_refusal(res, "not a golden bundle")
    assert not report.exists()


def test_golden_out_refuses_a_users_folder_and_replaces_a_bundle(golden: Path, tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("my notes")
    res = _cli("golden", "--model", "tiny-ursa", "--quiet", *SIZE, "--out", str(mine))
    _one_line_refusal(res)
    assert (mine / "notes.txt").read_text() == "my notes"
    assert bundle_mod.is_bundle_folder(golden)
    (tmp_path / "extra").mkdir()
    copy = tmp_path / "extra" / "bundle"
    shutil.copytree(golden, copy)
    (copy / "stray.txt").write_text("x")
    assert not bundle_mod.is_bundle_folder(copy)
    with pytest.raises(GoldenError, match="stray.txt"):
        open_bundle(copy)


# ---- the sampling plan and the format, in process ---------------------------------------------
def test_reducer_keeps_whole_rows_of_large_class_tensors_and_the_same_indices_after_reading(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bundle_mod, "FULL_LIMIT", 1000)
    monkeypatch.setattr(bundle_mod, "SAMPLE", 4096)
    monkeypatch.setattr(bundle_mod, "BLOCK_FULL", 100)
    monkeypatch.setattr(bundle_mod, "BLOCK_SAMPLE", 64)
    logits = torch.randn(2, 300, 32, generator=torch.Generator().manual_seed(0))
    small = torch.arange(10.0)
    flat = torch.randn(5000, generator=torch.Generator().manual_seed(1))
    reducer = Reducer()
    rows = reducer.output(logits)
    assert rows.shape == (4096 // 32, 32)  # whole rows: argmax over classes still means something
    assert torch.equal(reducer.output(small), small)  # small tensors are kept whole
    assert reducer.block(flat).shape == (64,)
    writer = BundleWriter(tmp_path, reducer)
    data = {"rows": writer.put(rows, "rows"), "nested": writer.put({"a": [small, (1, "x", None)]}, "nested")}
    writer.finish({"format": bundle_mod.FORMAT, "format_version": bundle_mod.FORMAT_VERSION,
                   "difforge": __import__("difforge").__version__}, data)
    read = open_bundle(tmp_path)
    again = read.reducer
    assert again.frozen
    assert torch.equal(again.output(logits), rows)  # the device's output is reduced with the same indices
    assert torch.equal(again.block(flat), reducer.block(flat))
    assert torch.equal(read.data["rows"], rows)
    assert read.data["nested"]["a"][1] == (1, "x", None)
    assert again.output(torch.zeros(3, 400, 32)).shape == (3, 400, 32)  # a shape the bundle lacks: whole


def test_pack_round_trip_and_refusals() -> None:
    tensors: dict[str, torch.Tensor] = {}
    value = {"x": torch.ones(2), "y": [torch.zeros(1), torch.zeros(1)], "z": 3.5}
    packed = pack(value, "k", tensors)
    assert len(tensors) == 3
    out = unpack(json.loads(json.dumps(packed)), tensors)
    assert torch.equal(out["x"], value["x"]) and out["z"] == 3.5
    with pytest.raises(TypeError):
        pack({"d": torch.float32}, "k", {})


def test_bundle_from_another_release_line_is_refused(tmp_path: Path) -> None:
    writer = BundleWriter(tmp_path, Reducer())
    writer.finish({"format": bundle_mod.FORMAT, "format_version": bundle_mod.FORMAT_VERSION, "difforge": "9.9.0"}, {})
    with pytest.raises(GoldenError, match="9.9.0"):
        open_bundle(tmp_path)


def test_a_bundle_for_another_devices_random_stream_is_refused(tmp_path: Path) -> None:
    """A bundle made for an NPU (the Philox stream) does not fit a CPU run on the reference stream."""
    out = tmp_path / "npu-bundle"
    res = _cli("golden", "--model", "tiny-ursa", "--for-device", "npu", *SIZE, "--quiet", "--out", str(out))
    assert res.returncode == 0, res.stderr
    assert json.loads((out / "manifest.json").read_text())["settings"]["stream"] == {"disable": [],
                                                                                     "fast": ["philox-rng"]}
    report = tmp_path / "r"
    res = _cli("validate", "--model", "tiny-ursa", *DUT, *SIZE, "--golden", str(out), "--out", str(report))
    _one_line_refusal(res, "random stream", "--for-device cpu")
    res = _cli("validate", "--model", "tiny-ursa", *DUT, *SIZE, "--fast", "philox-rng", "--golden", str(out),
               "--out", str(report))
    assert res.returncode == 0, res.stderr[-2000:]  # the same stream named on the CPU: the bundle fits
