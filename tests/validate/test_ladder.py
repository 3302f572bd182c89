"""End-to-end acceptance ladder on the tiny models (CPU: bfloat16 device under test vs float32).

The planted bugs go in through ``op_overrides``, so they affect the device-under-test pipeline
only; the ladder must FAIL, name the operator and component/step rungs, and localise the first
divergent transformer block.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from difforge.validate import ValidateOptions, Verdict

from .ladder_run import run_validation


def _opts(model: str, out: Path, **kw) -> ValidateOptions:
    kw.setdefault("reference", "cpu:float32")
    kw.setdefault("speed_table", False)  # its extra runs only where a test reads the table
    if model == "tiny-ursa":
        # 128x128, not the 320x512 default: on CPUs without native bf16 convolutions (AVX2 x86, many
        # aarch64 hosts) torch runs bf16 convs on its slow path, ~30x slower than fp32 at 320x512.
        kw.setdefault("height", 128)
        kw.setdefault("width", 128)
    return ValidateOptions(model=model, device="cpu", dtype="bfloat16", quick=True, out=out, quiet=True, **kw)


def broken_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """A fused-RMSNorm port that forgot the normalisation: scales by the weight only."""
    return x * weight


def swapped_pairs_rotary(x: torch.Tensor, table) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """A rotary port with the wrong pairing: rotates (2i, 2i+1) instead of (i, i + d/2)."""
    cos, sin = table
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


@pytest.mark.slow  # a whole ladder on three seeds: minutes under load (make test-slow)
def test_clean_tiny_ursa_passes_on_three_seeds(tmp_path: Path) -> None:
    result = run_validation(_opts("tiny-ursa", tmp_path / "r", seed=42, extra_seeds=[1, 2], speed_table=True))
    assert result.verdict is Verdict.PASS, result.rung_verdicts()
    assert result.exit_code == 0
    seeds = {s["seed"] for s in result.rungs["step"].data["seeds"]}
    assert seeds == {42, 1, 2}
    paths = result.report_paths
    for key in ("markdown", "html", "json", "sha256"):
        assert paths[key].is_file()
    data = json.loads(paths["json"].read_text())
    assert data["verdict"] == "PASS" and set(data["rungs"]) >= {"operator", "component", "step", "trajectory"}
    assert any(d["file"] == "images/contact_sheet.png" for d in data["deliverables"])
    # the ModelZoo-style table: baseline (every exact optimisation off), the defaults (what was validated,
    # reusing the rung's rounds) and the one approximate optimisation, each timed
    speed = result.rungs["benchmark"].data["speed"]
    rows = {r["kind"]: r for r in speed["rows"]}
    assert list(rows) == ["baseline", "exact", "approximate"]
    assert rows["baseline"]["name"].startswith("--disable lm-head-slice,") and rows["approximate"]["name"] == (
        "--fast unguided-tail")
    assert rows["exact"]["validated"] and not rows["baseline"]["validated"]
    assert all(r["s_per_it"] > 0 and r["end_to_end_s"] > 0 and r["peak_bytes"] > 0 for r in rows.values())
    assert rows["baseline"]["speedup_end_to_end"] == 1.0 and rows["exact"]["speedup_end_to_end"] > 0
    assert speed["header"]["height"] == 128 and speed["header"]["dtype"] == "bfloat16"
    md = paths["markdown"].read_text()
    assert "| exact optimisations | `defaults` |" in md and "| baseline | `--disable lm-head-slice," in md


def test_broken_rms_norm_fails_and_is_localised(tmp_path: Path) -> None:
    result = run_validation(_opts("tiny-ursa", tmp_path / "r", op_overrides={"rms_norm": broken_rms_norm},
                                  rounds=1, warmup=0))
    assert result.verdict is Verdict.FAIL and result.exit_code == 1
    op = result.rungs["operator"]
    assert op.verdict is Verdict.FAIL
    assert {r.subject for r in op.rows if r.verdict is Verdict.FAIL} == {"rms_norm/hidden", "rms_norm/head"}
    step = result.rungs["step"]
    assert step.verdict is Verdict.FAIL
    assert step.data["localisation"]["first_divergent"] == "model.layers.0"
    md = result.report_paths["markdown"].read_text()
    assert "model.layers.0" in md and "override:broken_rms_norm" in md


def test_wrong_rotary_pairing_fails_operator_rung(tmp_path: Path) -> None:
    result = run_validation(_opts("tiny-ursa", tmp_path / "r", op_overrides={"rotary": swapped_pairs_rotary},
                                  rounds=1, warmup=0))
    assert result.verdict is Verdict.FAIL
    failing = {r.subject for r in result.rungs["operator"].rows if r.verdict is Verdict.FAIL}
    assert failing == {"rotary"}
    assert result.rungs["step"].data["localisation"]["first_divergent"] == "model.layers.0"


def test_clean_tiny_qwen_edit_passes_in_chinese(tmp_path: Path) -> None:
    result = run_validation(_opts("tiny-qwen-edit", tmp_path / "r", lang="zh", rounds=1, warmup=0,
                                        speed_table=True))
    assert result.verdict is Verdict.PASS, result.rung_verdicts()
    md = result.report_paths["markdown"].read_text()
    assert "精度评测" in md and "交付件清单" in md
    assert "| 基线 |" in md and "| 等价优化 | `默认` |" in md and "| 近似优化 | `--fast first-block-cache` |" in md
    kinds = [r["kind"] for r in result.rungs["benchmark"].data["speed"]["rows"]]
    assert kinds == ["baseline", "exact", "approximate", "approximate"]
    assert (tmp_path / "r" / "images" / "input_synthetic.png").is_file()


def test_broken_norm_in_qwen_edit_port_fails_operator_rung(tmp_path: Path) -> None:
    """The Qwen port's RMSNorm override applies to the device under test only; the rung must see it."""

    def forgot_normalisation(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
        return x if weight is None else x * weight

    result = run_validation(_opts("tiny-qwen-edit", tmp_path / "r", rounds=1, warmup=0,
                                  op_overrides={"rms_norm": forgot_normalisation}))
    assert result.verdict is Verdict.FAIL
    failing = {r.subject for r in result.rungs["operator"].rows if r.verdict is Verdict.FAIL}
    assert "rms_norm" in failing
    assert "joint attention (block 0)" in failing  # its q/k norms are the broken ones


@pytest.mark.parametrize("bad", [{"lang": "xx"}, {"reference": "tpu:float32"}])
def test_bad_usage_raises_before_running(tmp_path: Path, bad: dict) -> None:
    from difforge.errors import DifforgeError

    with pytest.raises(DifforgeError):
        run_validation(_opts("tiny-ursa", tmp_path / "r", **bad))
