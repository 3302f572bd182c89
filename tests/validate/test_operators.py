"""The operator rung's traced coverage: every op type the tiny models run, judged on its own inputs.

Faults are planted below the torch-function level (a ``TorchDispatchMode`` on one aten op, for
bfloat16 tensors only), the way a broken device kernel would be: the tracer sees the faulty output,
the float32 replay never meets the fault.  A second fault, a ``TorchFunctionMode`` entered around the
whole rung (as ``tests/validate/fault_cli.py`` plants them), shows the floor stays clean even while
the fault is active during the replay.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from difforge.config import RunConfig
from difforge.validate import ValidateOptions, Verdict
from difforge.validate.ladder import Ladder
from difforge.validate.metrics import op_compare
from difforge.validate.operators import operator_rung, traced_rows
from difforge.validate.steps import StepTrace
from difforge.validate.thresholds import dual_rule
from difforge.validate.tracing import CAPS, STEP_COMPONENT, Caps, capture, probe_captures, replay
from difforge.validate.verdict import RungResult

from .test_real_device_fixture import TODAY_FLOOR

LOW = (torch.bfloat16, torch.float16)


# ---- planted faults ------------------------------------------------------------------------------------
class KernelFault(TorchDispatchMode):
    """Changes the output of one aten op when it computes in bf16/fp16 (a broken device kernel)."""

    def __init__(self, ops: tuple[Any, ...], change: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.ops, self.change, self.fired = ops, change, 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func in self.ops and isinstance(args[0], torch.Tensor) and args[0].dtype in LOW:
            self.fired += 1
            if isinstance(out, tuple):
                return (self.change(out[0]), *out[1:])
            return self.change(out)
        return out


class FunctionFault(TorchFunctionMode):
    """Adds ``offset`` to one torch function's output for bf16/fp16 inputs (as the fault catalogue does)."""

    def __init__(self, func: Any, offset: float) -> None:
        super().__init__()
        self.func, self.offset, self.fired = func, offset, 0

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func is self.func and args[0].dtype in LOW:
            self.fired += 1
            return out + self.offset
        return out


class DeviceSideOnly:
    """The device-under-test probe with ``fault`` active only while the device runs (step, components)."""

    def __init__(self, probe: Any, fault: TorchDispatchMode) -> None:
        self._probe, self._fault = probe, fault

    def __getattr__(self, name: str) -> Any:
        return getattr(self._probe, name)

    def forward_step(self, *args: Any) -> Any:
        with self._fault:
            return self._probe.forward_step(*args)

    def run_component(self, *args: Any) -> Any:
        with self._fault:
            return self._probe.run_component(*args)


# ---- the two tiny models on the CPU in bf16 -------------------------------------------------------------
@dataclass
class Side:
    """A loaded device-under-test probe, its config and step 0's recorded inputs."""

    probe: Any
    cfg: RunConfig
    inputs: dict[str, torch.Tensor]
    adaptations: list[Any]


def _side(model: str, out: Path) -> Side:
    kw: dict[str, Any] = {"height": 64, "width": 64} if model == "tiny-ursa" else {}
    lad = Ladder(ValidateOptions(model=model, device="cpu", dtype="bfloat16", quick=True, out=out, quiet=True,
                                 reference="cpu:float32", **kw))
    lad.prepare_inputs()
    pipe, record = lad.load(lad.dut_backend, lad.dut_dtype)
    cfg = lad.dut_cfg()
    trace = StepTrace()
    lad.run(pipe, cfg, trace=trace)
    return Side(lad.probe(pipe), cfg, trace.inputs[0], list(record.adaptations))


@pytest.fixture(scope="module")
def ursa(tmp_path_factory: pytest.TempPathFactory) -> Side:
    return _side("tiny-ursa", tmp_path_factory.mktemp("ursa") / "r")


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> Side:
    return _side("tiny-qwen-edit", tmp_path_factory.mktemp("qwen") / "r")


def _rung(side: Side, probe: Any | None = None) -> RungResult:
    return operator_rung(probe or side.probe, torch.device("cpu"), side.cfg, side.inputs, side.adaptations)


@pytest.fixture(scope="module")
def ursa_clean(ursa: Side) -> RungResult:
    return _rung(ursa)


@pytest.fixture(scope="module")
def qwen_clean(qwen: Side) -> RungResult:
    return _rung(qwen)


def _ran(result: RungResult) -> dict[str, set[str]]:
    return {comp: set(ops) for comp, ops in result.data["traced"]["components"].items()}


# ---- coverage and the clean verdict ---------------------------------------------------------------------
def test_tiny_ursa_traced_coverage_and_clean_pass(ursa_clean: RungResult) -> None:
    ran = _ran(ursa_clean)
    assert set(ran) == {STEP_COMPONENT, "transformer", "vae_decode"}
    assert {"linear", "embedding", "scaled_dot_product_attention", "softmax"} <= ran[STEP_COMPONENT]
    assert {"conv2d", "group_norm", "silu", "interpolate"} <= ran["vae_decode"]
    subjects = {r.subject for r in ursa_clean.rows}
    assert {"rms_norm/hidden", "rotary", "attention", "linear", "conv2d", "group_norm", "silu"} <= subjects
    assert ursa_clean.verdict is Verdict.PASS, [(r.subject, r.verdict) for r in ursa_clean.rows]
    linear = next(r for r in ursa_clean.rows if r.subject == "linear")
    assert "layers." in linear.get("where") and "call #" in linear.note


def test_tiny_qwen_edit_traced_coverage_and_clean_pass(qwen_clean: RungResult) -> None:
    ran = _ran(qwen_clean)
    assert set(ran) == {STEP_COMPONENT, "text_encoder", "transformer", "vae_encode", "vae_decode"}
    assert {"linear", "layer_norm", "gelu", "silu", "scaled_dot_product_attention"} <= ran[STEP_COMPONENT]
    assert {"embedding", "linear", "silu", "scaled_dot_product_attention"} <= ran["text_encoder"]
    assert {"conv2d", "normalize", "silu"} <= ran["vae_encode"]
    assert {"conv2d", "interpolate"} <= ran["vae_decode"]
    assert "conv3d" not in ran["vae_encode"] | ran["vae_decode"]  # vae-2d: a picture's causal convs run as conv2d
    assert qwen_clean.verdict is Verdict.PASS, [(r.subject, r.verdict) for r in qwen_clean.rows]
    # the probe's own cases stay, for the fused kernels a trace cannot see
    assert {"rms_norm", "joint attention (block 0)"} <= {r.subject for r in qwen_clean.rows}


@pytest.mark.parametrize("which", ["ursa_clean", "qwen_clean"])
def test_kept_bytes_within_the_stated_cap(which: str, request: pytest.FixtureRequest) -> None:
    result: RungResult = request.getfixturevalue(which)
    traced = result.data["traced"]
    assert traced["caps"]["bytes_per_op_and_component"] == CAPS.op_bytes
    for ops in traced["components"].values():
        for entry in ops.values():
            assert entry["kept_bytes"] <= CAPS.op_bytes
            assert entry["judged"] <= CAPS.calls


# ---- planted faults -------------------------------------------------------------------------------------
def _failing(result: RungResult) -> set[str]:
    return {r.subject for r in result.rows if r.verdict is not Verdict.PASS}


def test_faulty_silu_kernel_fails_only_the_silu_row(ursa: Side) -> None:
    fault = KernelFault((torch.ops.aten.silu.default,), lambda y: y * 1.25)
    rows, _ = traced_rows(DeviceSideOnly(ursa.probe, fault), ursa.cfg, ursa.inputs)
    assert fault.fired > 0
    failing = {r.subject for r in rows if r.verdict is not Verdict.PASS}
    assert failing == {"silu"}, failing
    silu = next(r for r in rows if r.subject == "silu")
    assert silu.verdict is Verdict.FAIL and "vae" in silu.get("where")


def test_faulty_layer_norm_kernel_fails_only_the_layer_norm_row(qwen: Side) -> None:
    # the python dispatcher sees layer_norm before (or, on some builds, after) its decomposition
    aten = torch.ops.aten
    fault = KernelFault((aten.layer_norm.default, aten.native_layer_norm.default), lambda y: y + 0.1)
    result = _rung(qwen, DeviceSideOnly(qwen.probe, fault))
    assert fault.fired > 0
    assert _failing(result) == {"layer_norm"}, _failing(result)
    assert result.verdict is Verdict.FAIL


def test_floor_is_independent_of_the_device_kernels(qwen: Side) -> None:
    """A fault active during the capture *and* the replay reaches the device output only."""
    with FunctionFault(F.layer_norm, 0.1) as fault, torch.inference_mode():
        cap = capture(STEP_COMPONENT, lambda: qwen.probe.forward_step(qwen.cfg, 0, qwen.inputs))
        calls = cap.calls["layer_norm"]
        fired = fault.fired
        pairs = [replay(c) for c in calls]
        assert fault.fired == fired  # the replay never ran a bf16 layer_norm
    assert calls and fired > 0
    for call, (ref, floor) in zip(calls, pairs, strict=True):
        dut = call.out.float().reshape(ref.shape)
        assert torch.equal(floor, ref.to(torch.bfloat16).float())  # the floor is the rounded reference
        assert (dut - ref).mean().item() == pytest.approx(0.1, abs=0.02)  # the fault is on the device side


# ---- the floor rounds what real kernels round: the H200's clean conv2d and group_norm -------------------
@pytest.fixture(scope="module")
def shapes_vae(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Any]]:
    side = _side("shapes-ursa", tmp_path_factory.mktemp("shapes") / "r")
    with torch.inference_mode():
        cap = next(c for c in probe_captures(side.probe, side.cfg, side.inputs) if c.component == "vae_decode")
    return {op: cap.calls[op] for op in ("conv2d", "group_norm")}


def _one_rounding(call: Any) -> torch.Tensor:
    """The old floor: the float32 kernel on the rounded inputs, only its output rounded."""
    args = {k: v.float().to(call.dtype).float() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
            for k, v in call.args.items()}
    out = call.run(**args).to(call.dtype).float()
    return out.reshape(-1)[call.out_index] if call.out_index is not None else out


def test_the_floor_rounds_the_conv_before_its_bias_as_the_h200_did(shapes_vae: dict[str, list[Any]]) -> None:
    """The H200's clean bf16 ``vae.post_quant_conv`` (tests/fixtures/h200-2026-12-04): max rel 0.0909,
    44 small-value errors in 8192, max abs 0.00293, rel-L2 1.40x the one-rounding floor's.  Its input is
    the quantised latent, the same on every device, so the emulation can be held to those numbers; the
    one-rounding floor made 0 small-value errors, which the old rule turned into an infinite ratio."""
    call = next(c for c in shapes_vae["conv2d"] if c.index == 0)
    assert call.where == "vae.post_quant_conv"
    ref, floor = replay(call)
    rule = dual_rule(torch.bfloat16)
    new, old = op_compare(floor, ref, rule), op_compare(_one_rounding(call).reshape(ref.shape), ref, rule)
    assert new["elements"] == 8192
    assert new["max_rel"] == pytest.approx(0.0909, rel=0.02)
    assert abs(new["small_value_errors"] - 44) <= 4  # another CPU may sum the 13 products in another order
    assert new["max_abs"] == pytest.approx(0.00293, rel=0.02)
    assert new["rel_l2"] / old["rel_l2"] == pytest.approx(1.40, rel=0.05)
    assert old["small_value_errors"] == 0 and old["max_rel"] < 0.004
    low = TODAY_FLOOR["conv2d"]  # what the H200 fixture's replay assumes of today's floor on this call
    assert new["max_rel"] >= low["max_rel"] and new["small_value_errors"] >= low["small_value_errors"]


def test_the_floor_rounds_the_group_norm_statistics(shapes_vae: dict[str, list[Any]]) -> None:
    """The H200's clean bf16 group norm in ``up_blocks.2.resnets.1.norm2``: max rel 1.05 and 161 small-value
    errors in 65536.  Its input is the device's own activation, so the CPU's is close, not equal: the
    emulation must land in the same range, where one output rounding gives 0.004 and none."""
    call = next(c for c in shapes_vae["group_norm"] if c.where == "vae.decoder.up_blocks.2.resnets.1.norm2")
    ref, floor = replay(call)
    rule = dual_rule(torch.bfloat16)
    new, old = op_compare(floor, ref, rule), op_compare(_one_rounding(call).reshape(ref.shape), ref, rule)
    assert new["elements"] == CAPS.outputs
    assert 1.05 / 3 < new["max_rel"] < 1.05 * 3 and 161 / 3 < new["small_value_errors"] < 161 * 3
    assert old["small_value_errors"] == 0 and old["max_rel"] < 0.004
    low = TODAY_FLOOR["group_norm"]  # what the H200 fixture's replay assumes of today's floor on this call
    assert new["max_rel"] >= low["max_rel"] and new["small_value_errors"] >= low["small_value_errors"]


def test_the_floor_of_a_conv_with_bias_is_two_roundings() -> None:
    torch.manual_seed(0)
    x, w, b = _bf(1, 4, 6, 6), _bf(5, 4, 3, 3), _bf(5)
    with torch.inference_mode():
        cap = capture("c", lambda: F.conv2d(x, w, b, padding=1))
    ref, floor = replay(cap.calls["conv2d"][0])
    conv = F.conv2d(x.float(), w.float(), None, padding=1).to(torch.bfloat16).float()
    expected = (conv + b.float().reshape(1, -1, 1, 1)).to(torch.bfloat16).float()
    assert torch.equal(floor, expected)


# ---- the reductions, on synthetic calls -----------------------------------------------------------------
def _bf(*shape: int) -> torch.Tensor:
    return torch.randn(*shape).to(torch.bfloat16)


def _synthetic() -> None:
    """Calls large enough for :data:`SMALL` to force every reduction (and one whole-call fallback)."""
    F.linear(_bf(3, 50, 300), _bf(400, 300), _bf(400))
    F.conv2d(_bf(2, 8, 40, 30), _bf(16, 8, 3, 3), _bf(16), stride=2, padding=1)
    F.conv2d(_bf(1, 8, 40, 30), _bf(8, 2, 3, 3), None, padding=2, dilation=2, groups=4)
    F.conv1d(_bf(1, 8, 500), _bf(12, 8, 5), _bf(12), padding="same")
    F.conv3d(_bf(1, 4, 3, 30, 30), _bf(8, 4, 3, 3, 3), _bf(8), padding=(0, 1, 1))
    F.group_norm(_bf(2, 32, 40, 40), 8, _bf(32), _bf(32))
    F.layer_norm(_bf(4, 100, 64), (64,), _bf(64), _bf(64))
    F.rms_norm(_bf(4, 100, 8, 8), (8, 8), _bf(8, 8), 1e-6)
    torch.softmax(_bf(4, 30, 50), 1)
    F.normalize(_bf(2, 16, 30, 30), dim=1)
    F.silu(_bf(100, 1000))
    F.gelu(_bf(100, 1000), approximate="tanh")
    mask = torch.rand(2, 1, 300, 280) > 0.3
    F.scaled_dot_product_attention(_bf(2, 8, 300, 32), _bf(2, 2, 280, 32), _bf(2, 2, 280, 32), attn_mask=mask,
                                   enable_gqa=True)
    F.scaled_dot_product_attention(_bf(2, 4, 200, 16), _bf(2, 4, 200, 16), _bf(2, 4, 200, 16), is_causal=True)
    F.scaled_dot_product_attention(_bf(2, 4, 200, 16), _bf(2, 4, 250, 16), _bf(2, 4, 250, 16),
                                   attn_mask=_bf(200, 250))
    F.embedding(torch.randint(0, 1000, (4, 300)), _bf(1000, 64))
    F.interpolate(_bf(2, 16, 30, 30), scale_factor=2, mode="bilinear", align_corners=False)
    torch.matmul(_bf(3, 1, 60, 70), _bf(4, 70, 80))
    F.conv_transpose2d(_bf(1, 4, 8, 8), _bf(4, 6, 3, 3), stride=2)
    F.silu(_bf(50, 50), inplace=True)


SMALL = Caps(call_bytes=256 * 1024, outputs=2048)


@contextmanager
def _seeded() -> Iterator[None]:
    state = torch.random.get_rng_state()
    torch.manual_seed(0)
    try:
        yield
    finally:
        torch.random.set_rng_state(state)


def test_reduced_calls_recompute_the_devices_output_within_the_cap() -> None:
    with _seeded(), torch.inference_mode():
        cap = capture("synthetic", _synthetic, caps=SMALL)
    assert not cap.skipped
    expected = {"linear", "conv1d", "conv2d", "conv3d", "group_norm", "layer_norm", "rms_norm", "softmax",
                "normalize", "silu", "gelu", "scaled_dot_product_attention", "embedding", "interpolate", "matmul",
                "conv_transpose2d"}
    assert set(cap.calls) == expected
    for op, calls in cap.calls.items():
        for call in calls:
            assert call.nbytes <= SMALL.call_bytes
            if op not in ("conv_transpose2d", "softmax"):
                assert call.how != "whole call", op
            ref, floor = replay(call)
            dut = call.out.float().reshape(ref.shape)
            # a wrong index mapping would compare unrelated values; a right one is off by rounding only
            err = (dut - ref).norm() / ref.norm()
            assert err <= 2 * (floor - ref).norm() / ref.norm() + 1e-6, (op, call.how)
    assert sum(c.nbytes for calls in cap.calls.values() for c in calls) <= len(expected) * SMALL.op_bytes


def test_calls_kept_are_the_first_two_and_the_last_two_powers_of_two() -> None:
    x, w = _bf(4, 16), _bf(8, 16)

    def many() -> None:
        for _ in range(40):
            F.linear(x, w)

    with torch.inference_mode():
        cap = capture("loop", many)
    assert cap.seen["linear"] == 40
    assert [c.index for c in cap.calls["linear"]] == [0, 1, 16, 32]
    assert len(cap.calls["linear"]) == CAPS.calls


def test_a_call_no_reduction_fits_is_counted_as_skipped() -> None:
    tiny = Caps(call_bytes=2 * 2**16 * 12, outputs=2**16)  # room for the output sample, none for inputs
    with torch.inference_mode():
        cap = capture("big", lambda: F.conv_transpose2d(_bf(1, 64, 128, 128), _bf(64, 64, 3, 3)), caps=tiny)
    assert cap.seen["conv_transpose2d"] == 1 and not cap.calls
    assert "no reduction fits" in cap.skipped["conv_transpose2d"][0]
