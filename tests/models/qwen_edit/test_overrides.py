"""op_overrides replace one operator in one pipeline instance, and nothing else."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from difforge.errors import DifforgeError
from difforge.models.qwen_edit.overrides import reference_attention, reference_rms_norm

from .conftest import card, load, make_cfg, pixels, probe


def _velocity(qe, cfg) -> torch.Tensor:
    hooks = probe(qe)
    return hooks.run_component("transformer", hooks.component_inputs(cfg)["transformer"])


def test_reference_overrides_reproduce_diffusers(edit_folder: Path) -> None:
    cfg = make_cfg(edit_folder)
    base, base_record = load(edit_folder, cfg)
    calls = {"rms_norm": 0, "attention": 0}

    def rms(x, w, eps):
        calls["rms_norm"] += 1
        return reference_rms_norm(x, w, eps)

    def attention(q, k, v):
        calls["attention"] += 1
        return reference_attention(q, k, v)

    swapped, record = load(edit_folder, cfg, overrides={"rms_norm": rms, "attention": attention})
    diff = (_velocity(swapped, cfg) - _velocity(base, cfg)).abs().max().item()
    print(f"reference overrides vs diffusers: max abs diff {diff}")
    assert diff <= 1e-6
    assert calls["rms_norm"] > 0 and calls["attention"] == 2  # two blocks
    image_diff = np.abs(pixels(swapped(cfg, record, [card()])[0]) - pixels(base(cfg, base_record, [card()])[0])).max()
    assert image_diff <= 1 / 255
    chosen = {a.what: a.choice for a in record.adaptations}
    assert chosen["rms_norm"].startswith("override") and chosen["attention"].startswith("override")


def test_override_changes_this_instance_only(edit_folder: Path) -> None:
    cfg = make_cfg(edit_folder)
    before, _ = load(edit_folder, cfg)
    expected = _velocity(before, cfg)

    def scaled_rms(x, w, eps):
        return 1.5 * reference_rms_norm(x, w, eps)

    def no_attention(q, k, v):
        return torch.zeros_like(q)

    swapped, _ = load(edit_folder, cfg, overrides={"rms_norm": scaled_rms})
    gutted, _ = load(edit_folder, cfg, overrides={"attention": no_attention})
    after, _ = load(edit_folder, cfg)
    assert (_velocity(swapped, cfg) - expected).abs().max() > 1e-3
    assert (_velocity(gutted, cfg) - expected).abs().max() > 1e-3
    assert torch.equal(_velocity(after, cfg), expected)  # loaded later, untouched
    assert torch.equal(_velocity(before, cfg), expected)  # loaded earlier, untouched


def test_unknown_override_is_refused(edit_folder: Path) -> None:
    with pytest.raises(DifforgeError, match="Unknown operator override 'swiglu'"):
        load(edit_folder, make_cfg(edit_folder), overrides={"swiglu": lambda x: x})


def test_difforge_ops_plug_in_directly(edit_folder: Path) -> None:
    """The portable ops of difforge.ops have the override signatures, so validation can inject them."""
    ops = pytest.importorskip("difforge.ops.opset").plain_ops()
    cfg = make_cfg(edit_folder)
    base, _ = load(edit_folder, cfg)
    swapped, _ = load(edit_folder, cfg, overrides={"rms_norm": ops.rms_norm, "attention": ops.attention})
    diff = (_velocity(swapped, cfg) - _velocity(base, cfg)).abs().max().item()
    print(f"difforge.ops rms_norm + attention vs diffusers: max abs diff {diff}")
    assert diff <= 1e-5
