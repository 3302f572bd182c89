"""Metric and judging units: exact inputs pass, rounding passes, a real error fails."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from difforge.errors import InputError
from difforge.models.probing import OpCase
from difforge.validate import ValidateOptions, parse_reference
from difforge.validate.bench import find_peak
from difforge.validate.determinism import determinism_rung
from difforge.validate.metrics import image_compare, op_compare, tensor_compare
from difforge.validate.operators import judge
from difforge.validate.thresholds import dual_rule
from difforge.validate.verdict import Verdict, worst


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def test_tensor_compare_identical_and_scaled() -> None:
    x = torch.randn(64, 32, generator=_gen())
    same = tensor_compare(x, x)
    assert same["cosine"] == pytest.approx(1.0) and same["rel_l2"] == 0 and same["max_abs"] == 0
    scaled = tensor_compare(2 * x, x)
    assert scaled["cosine"] == pytest.approx(1.0) and scaled["rel_l2"] == pytest.approx(1.0)


def test_op_compare_small_values_judged_by_abs_error() -> None:
    rule = dual_rule(torch.bfloat16)
    ref = torch.tensor([1.0, 1e-4, -1e-4, 2.0])
    dut = ref.clone()
    dut[1] = 2e-4  # 100 % relative error on a small value, but abs error 1e-4 > 2^-16: counted
    dut[2] = -1e-4 + 1e-6  # small value within its absolute bound: not counted
    out = op_compare(dut, ref, rule)
    assert out["small_value_errors"] == 1
    assert out["max_rel"] == 0.0  # the big values are exact
    assert out["rel_gt_1%"] == pytest.approx(0.25)


def _case(dut: torch.Tensor, ref: torch.Tensor, floor: torch.Tensor | None) -> OpCase:
    return OpCase("op", "impl", True, "x", dut, ref, floor)


def test_judge_rounding_to_bf16_passes_through_the_floor() -> None:
    ref = torch.randn(4096, generator=_gen()) * 3
    dut = ref.to(torch.bfloat16).float()  # correctly rounded: what bf16 must cost
    row = judge(_case(dut, ref, dut.clone()), torch.bfloat16)
    assert row.settle() is Verdict.PASS
    assert "explained by bfloat16" in row.get("decision")


def test_judge_rounding_without_floor_is_an_msprobe_warning() -> None:
    ref = torch.randn(4096, generator=_gen()) * 3
    dut = ref.to(torch.bfloat16).float()
    assert judge(_case(dut, ref, None), torch.bfloat16).settle() is Verdict.WARN


def test_judge_broken_op_fails_even_with_a_floor() -> None:
    ref = torch.randn(4096, generator=_gen())
    broken = ref.flip(0)
    row = judge(_case(broken, ref, ref.to(torch.bfloat16).float()), torch.bfloat16)
    assert row.settle() is Verdict.FAIL


def test_judge_nan_on_device_fails() -> None:
    ref = torch.randn(128, generator=_gen())
    dut = ref.clone()
    dut[3] = float("nan")
    assert judge(_case(dut, ref, ref), torch.float32).settle() is Verdict.FAIL


def test_image_compare_identical_and_different() -> None:
    a = Image.new("RGB", (32, 32), (10, 200, 30))
    same = image_compare(a, a.copy())
    assert same["mse"] == 0 and same["psnr_db"] == float("inf") and same["within_1"] == 1.0
    b = Image.new("RGB", (32, 32), (14, 200, 30))
    diff = image_compare(b, a)
    assert diff["within_1"] < 1.0 and diff["within_4"] == 1.0 and diff["mae"] == pytest.approx(4 / 3)


def test_determinism_rung() -> None:
    a = Image.new("RGB", (8, 8), (1, 2, 3))
    assert determinism_rung([[a], [a.copy()]]).verdict is Verdict.PASS
    b = Image.new("RGB", (8, 8), (1, 2, 4))
    r = determinism_rung([[a], [b]])
    assert r.verdict is Verdict.WARN and r.rows[0].get("max_abs_levels") == 1
    assert determinism_rung([[a]]).verdict is Verdict.SKIP


def test_worst_and_peaks() -> None:
    assert worst([Verdict.PASS, Verdict.SKIP, Verdict.WARN]) is Verdict.WARN
    assert worst([Verdict.SKIP]) is Verdict.SKIP
    peak, value = find_peak("NVIDIA H100 80GB HBM3", torch.bfloat16)
    assert value == pytest.approx(989.4) and "datasheet" in peak.source
    assert find_peak("NVIDIA H100 PCIe", torch.bfloat16)[1] == pytest.approx(756.5)
    assert find_peak("x86_64", torch.float32) is None


def test_reference_parsing_and_bad_usage(tmp_path) -> None:
    assert parse_reference("cpu:float32") == ("cpu", "float32")
    assert parse_reference("cuda:1:bfloat16") == ("cuda:1", "bfloat16")
    assert parse_reference("npu:0") == ("npu:0", "float32")
    with pytest.raises(InputError):
        ValidateOptions(model="tiny-ursa", out=tmp_path, lang="fr").check()
    with pytest.raises(InputError):
        ValidateOptions(model="tiny-ursa", out=tmp_path, prompts=str(tmp_path / "missing.txt")).check()
    with pytest.raises(InputError):
        ValidateOptions(model="tiny-ursa", out=tmp_path, rounds=0).check()
