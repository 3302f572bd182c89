"""The fault harness itself: every planted fault changes bf16 results and never a float32 one, and
``fault_cli`` drives the real ``difforge validate`` with the real exit codes.

The tensor checks are cheap (small tensors, one call per fault and dtype); two validate subprocesses
(a clean run, one fault validate is known to catch) keep the end-to-end part to well under a minute
on an idle 2-core machine.  What each fault does to whole validations is measured by
``scripts/fault_sweep.py`` (results in ``benchmarks/RESULTS_faults.md``), not here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from difforge.models.qwen_edit.overrides import reference_rms_norm
from difforge.ops import rms_norm as ursa_rms_norm

from . import fault_cli, faults

ROOT = Path(__file__).resolve().parents[2]
Probe = Callable[[torch.dtype], torch.Tensor]


def _rand(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _sine_table(dtype: torch.dtype) -> torch.Tensor:
    """URSA's ``angle.sin().to(dtype)`` and transformers' scaled, split-and-recomposed mRoPE sine."""
    angle = torch.arange(24, dtype=torch.float32).reshape(4, 6) * 0.3
    ursa = angle.sin().to(dtype)
    sin = angle.sin() * 1.0
    parts = sin.split([2, 4], dim=-1)
    recomposed = torch.cat([parts[0], parts[1]], dim=-1)
    qwen = torch.cat((recomposed, recomposed), dim=-1).to(dtype=dtype)
    return torch.cat([ursa.float().flatten(), qwen.float().flatten()])


def _timestep_embedding(dtype: torch.dtype) -> torch.Tensor:
    """diffusers' sinusoidal timestep embedding: a ``cat([sin, cos])`` is not a rotary table."""
    e = torch.arange(8, dtype=torch.float32) * 0.5
    return torch.cat([torch.sin(e), torch.cos(e)], dim=-1).to(dtype)


def _rms_norms(dtype: torch.dtype) -> torch.Tensor:
    x, w = _rand(3, 5, 16).to(dtype), (1 + 0.1 * _rand(16, seed=1)).to(dtype)
    return torch.cat([ursa_rms_norm(x, w, 1e-6).float().flatten(), reference_rms_norm(x, w, 1e-6).float().flatten()])


def _softmaxes(dtype: torch.dtype) -> torch.Tensor:
    x = (3 * _rand(4, 10)).to(dtype)
    return torch.cat([F.softmax(x, dim=-1), torch.softmax(x, -1), x.softmax(-1)]).float()


def _sdpa(dtype: torch.dtype) -> torch.Tensor:
    q, k, v = (_rand(1, 2, 6, 8, seed=s).to(dtype) for s in range(3))
    return F.scaled_dot_product_attention(q, k, v)


def _cfg_combine(dtype: torch.dtype) -> torch.Tensor:
    """Qwen-Image-Edit's true-CFG combine with its norm rescale, on two near-equal branches."""
    from difforge.models.qwen_edit.loop import combine_cfg

    cond = _rand(1, 16, 16)
    return combine_cfg(cond.to(dtype), (cond + 0.3 * _rand(1, 16, 16, seed=1)).to(dtype), 4.0)


def _euler_step(dtype: torch.dtype) -> torch.Tensor:
    """diffusers' flow-matching Euler step (``sample.float() + dt * velocity``, the product in ``dtype``)."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    scheduler = FlowMatchEulerDiscreteScheduler()
    scheduler.set_timesteps(4)
    x, v = _rand(1, 16, 16).to(dtype), _rand(1, 16, 16, seed=1).to(dtype)
    return scheduler.step(v, scheduler.timesteps[0], x, return_dict=False)[0]


def _unpack(dtype: torch.dtype) -> torch.Tensor:
    """diffusers' unpacking of Qwen-Image latents before the VAE (64x64 output, 2x2 patches of 4 channels)."""
    from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit import QwenImageEditPipeline

    return QwenImageEditPipeline._unpack_latents(_rand(1, 16, 16).to(dtype), 64, 64, 8)


#: One cheap call per fault that reaches its target the way the tiny models do.
PROBES: dict[str, Probe] = {
    "linear_noise": lambda dt: F.linear(_rand(4, 8).to(dt), _rand(6, 8, seed=1).to(dt), _rand(6, seed=2).to(dt)),
    "linear_no_bias": lambda dt: F.linear(_rand(4, 8).to(dt), _rand(6, 8, seed=1).to(dt), _rand(6, seed=2).to(dt)),
    "conv_no_bias": lambda dt: torch.cat([
        F.conv2d(_rand(1, 3, 8, 8).to(dt), _rand(4, 3, 3, 3, seed=1).to(dt), _rand(4, seed=2).to(dt)).flatten(),
        F.conv3d(_rand(1, 3, 2, 6, 6).to(dt), _rand(4, 3, 1, 3, 3, seed=1).to(dt), _rand(4, seed=2).to(dt)).flatten()]),
    "layer_norm_offset": lambda dt: F.layer_norm(_rand(4, 16).to(dt), (16,)),
    "group_norm_eps": lambda dt: F.group_norm((0.3 * _rand(2, 8, 4, 4)).to(dt), 4, eps=1e-6),
    "group_norm_offset": lambda dt: F.group_norm(_rand(2, 8, 4, 4).to(dt), 4),
    "rms_norm_scale": _rms_norms,
    "silu_slope": lambda dt: F.silu(_rand(64).to(dt)),
    "gelu_approx": lambda dt: F.gelu((3 * _rand(256)).to(dt), approximate="tanh"),
    "gelu_relu": lambda dt: F.gelu(_rand(64).to(dt)),
    "softmax_temp": _softmaxes,
    "sdpa_offset": _sdpa,
    "sdpa_scale": _sdpa,
    "embedding_shift": lambda dt: F.embedding(torch.tensor([0, 3, 5]), _rand(6, 4).to(dt)),
    "interpolate_mode": lambda dt: F.interpolate(_rand(1, 2, 4, 4).to(dt), scale_factor=2, mode="nearest"),
    "cat_swap": lambda dt: torch.cat([_rand(2, 3).to(dt), _rand(2, 3, seed=1).to(dt)], dim=0),
    "matmul_noise": lambda dt: torch.matmul(_rand(4, 8).to(dt), _rand(8, 5, seed=1).to(dt)),
    "rope_sin_sign": _sine_table,
    # URSA's sampler block (its own tests: tests/validate/test_sampler_step.py)
    "exp_base2": lambda dt: torch.exp(_rand(16).to(dt)),
    "softmax_dim": lambda dt: F.softmax(_rand(4, 6).to(dt), dim=-1),
    "matmul_half_k": lambda dt: torch.matmul(_rand(4, 8).to(dt), _rand(8, 5, seed=1).to(dt)),
    "normalize_dim": lambda dt: F.normalize(_rand(4, 8).to(dt), dim=-1),
    # the post-network block (its own tests: tests/validate/test_post_network.py)
    "cfg_sub_swap": _cfg_combine,
    "euler_step_scale": _euler_step,
    "unpack_transpose": _unpack,
}


def test_catalogue_covers_every_op_family() -> None:
    assert len(faults.FAULTS) >= 14
    assert set(PROBES) == set(faults.FAULTS)
    assert {f.family for f in faults.FAULTS.values()} >= {
        "linear", "convolution", "layernorm", "groupnorm", "rmsnorm", "activation", "softmax", "attention",
        "embedding", "interpolate", "concat", "matmul", "rope"}


@pytest.mark.parametrize("name", sorted(PROBES))
def test_fault_changes_low_precision_and_never_float32(name: str) -> None:
    probe = PROBES[name]
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        clean = probe(dtype)
        fault = faults.get(name)
        assert fault is not None
        with fault:
            faulted = probe(dtype)
        if dtype is torch.float32:
            assert fault.fired == 0, f"{name} fired on float32"
            assert torch.equal(faulted, clean), f"{name} changed a float32 result"
        else:
            assert fault.fired > 0, f"{name} did not fire in {dtype}"
            assert faulted.shape == clean.shape
            assert not torch.equal(faulted, clean), f"{name} left {dtype} unchanged"
        with fault:  # deterministic: the determinism rung must never be what catches a fault
            again = probe(dtype)
        assert torch.equal(again, faulted)


def test_dry_fault_counts_without_changing() -> None:
    fault = faults.get("linear_no_bias", dry=True)
    assert fault is not None
    clean = PROBES["linear_no_bias"](torch.bfloat16)
    with fault:
        out = PROBES["linear_no_bias"](torch.bfloat16)
    assert fault.fired == 1 and torch.equal(out, clean)


def test_rope_fault_leaves_timestep_embeddings_alone() -> None:
    fault = faults.get("rope_sin_sign")
    assert fault is not None
    clean = _timestep_embedding(torch.bfloat16)
    with fault:
        out = _timestep_embedding(torch.bfloat16)
    assert fault.fired == 0 and torch.equal(out, clean)


def test_unknown_fault_and_bad_usage_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert fault_cli.main(["no_such_fault", "--", "validate"]) == 2
    assert fault_cli.main(["none", "validate"]) == 2
    assert "unknown fault" in capsys.readouterr().err
    with pytest.raises(KeyError, match="known: none"):
        faults.get("no_such_fault")


def test_cli_usage_error_keeps_exit_code_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The wrapper hands back difforge's own exit code: a bad flag is 2, and the report says so."""
    report = tmp_path / "fault.json"
    monkeypatch.setenv("DIFFORGE_FAULT_REPORT", str(report))
    code = fault_cli.main(["embedding_shift", "--", "validate", "--model", "tiny-ursa", "--rounds", "0",
                           "--out", str(tmp_path / "r")])
    assert code == 2
    assert json.loads(report.read_text()) == {"fault": "embedding_shift", "fired": 0, "exit_code": 2,
                                              "what": faults.FAULTS["embedding_shift"].what}


# ---- through the real CLI, in a subprocess (as scripts/fault_sweep.py runs it) -----------------------
def _validate(fault: str, out: Path, report: Path, model: str = "tiny-ursa", size: int = 32,
              ) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "tests.validate.fault_cli", fault, "--", "validate", "--model", model,
           "--device", "cpu", "--dtype", "bfloat16", "--quick", "--height", str(size), "--width", str(size),
           "--rounds", "1", "--warmup", "0", "--quiet", "--no-speed-table", "--out", str(out)]
    env = {**os.environ, "DIFFORGE_FAULT_REPORT": str(report), "PYTHONPATH": str(ROOT)}
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)


def test_clean_run_through_fault_cli_passes(tmp_path: Path) -> None:
    proc = _validate("none", tmp_path / "r", tmp_path / "fault.json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads((tmp_path / "r" / "report.json").read_text())
    assert data["verdict"] in ("PASS", "WARN") and "verdict: " in proc.stdout
    assert json.loads((tmp_path / "fault.json").read_text())["fired"] == 0


def test_embedding_off_by_one_fails_validate(tmp_path: Path) -> None:
    """A bf16 embedding kernel that reads the next row: validate must FAIL it (exit 1)."""
    proc = _validate("embedding_shift", tmp_path / "r", tmp_path / "fault.json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert json.loads((tmp_path / "fault.json").read_text())["fired"] > 0
    data = json.loads((tmp_path / "r" / "report.json").read_text())
    assert data["verdict"] == "FAIL"


@pytest.mark.slow  # a whole tiny-qwen-edit validation: minutes under load (make test-slow)
def test_a_longer_euler_step_fails_qwen_validate_at_its_stage(tmp_path: Path) -> None:
    """A bf16 Euler update 10 % too long (after the network: the velocity itself is clean) FAILs validate on
    tiny-qwen-edit, and the step rung names the stage (issue 25's post-network rows)."""
    proc = _validate("euler_step_scale", tmp_path / "r", tmp_path / "fault.json", "tiny-qwen-edit", 64)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert json.loads((tmp_path / "fault.json").read_text())["fired"] > 0
    step = json.loads((tmp_path / "r" / "report.json").read_text())["rungs"]["step"]
    assert step["verdict"] == "FAIL" and "after the network: latents_next" in step["summary"]


# ---- the sweep's reading of runs ---------------------------------------------------------------------
def _sweep_module() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("fault_sweep", ROOT / "scripts" / "fault_sweep.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("fault_sweep", module)
    spec.loader.exec_module(module)
    return module


def _report(folder: Path, verdict: str, ratio: float, picture: bytes, wall_s: float) -> None:
    """A minimal report folder: one judged step ratio, one timing, the device's picture."""
    (folder / "images").mkdir(parents=True)
    (folder / "images" / "device_seed0.png").write_bytes(picture)
    rows = {"step": [{"subject": "step 0", "measurements": [
        {"name": "rel_l2 / floor", "value": ratio, "threshold": "<= 2 PASS, <= 3 WARN", "verdict": verdict}]}],
        "smoke": [{"subject": "denoise", "measurements": [{"name": "wall_s", "value": wall_s}]}]}
    (folder / "report.json").write_text(json.dumps(
        {"verdict": verdict, "rungs": {k: {"verdict": verdict, "rows": v} for k, v in rows.items()}}))


@pytest.mark.parametrize(("verdict", "ratio", "picture", "outcome"), [
    ("PASS", 1.25, b"clean", "inert"),  # only the timing differs: the fault changed nothing validate sees
    ("PASS", 1.26, b"clean", "missed"),  # a measurement moved: a miss, however small
    ("PASS", 1.25, b"other", "missed"),  # the picture changed
    ("FAIL", 1.25, b"clean", "caught"),
])
def test_the_sweep_calls_a_fired_fault_inert_only_when_it_changed_nothing(
        tmp_path: Path, verdict: str, ratio: float, picture: bytes, outcome: str) -> None:
    sweep = _sweep_module()
    _report(tmp_path / "clean", "PASS", 1.25, b"clean", 0.5)
    _report(tmp_path / "fault", verdict, ratio, picture, 0.9)
    clean = sweep.Run("tiny-ursa", "none", 0, str(tmp_path / "clean"), exit_code=0, fired=0)
    run = sweep.Run("tiny-ursa", "cat_swap", 0, str(tmp_path / "fault"), exit_code=int(verdict == "FAIL"), fired=3)
    for r in (clean, run):
        sweep.read_report(r)
    sweep.link_baselines([clean, run])
    assert run.outcome == outcome
    s = sweep.summary([clean, run])
    assert s["fired"] == (0 if outcome == "inert" else 1) and len(s["inert"]) == (outcome == "inert")
