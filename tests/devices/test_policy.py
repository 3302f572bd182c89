"""The device policy each backend answers for: fused kernels, diffusers attention, compile, pinned copies, env names."""

from __future__ import annotations

import sys

import pytest
import torch

from difforge.devices import (
    BACKENDS,
    Backend,
    CPUBackend,
    CUDABackend,
    MPSBackend,
    NPUBackend,
    XPUBackend,
)
from difforge.devices import base as devices_base
from difforge.devices.compile import CompilePolicy
from difforge.devices.npu import FUSED_KERNELS
from difforge.ops import OP_NAMES
from difforge.runtime.environment import HOST_ENV_VARS, recorded_env_vars


# ---- fused_kernel -----------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [CPUBackend, CUDABackend, XPUBackend, MPSBackend])
@pytest.mark.parametrize("op", OP_NAMES)
def test_portable_backends_have_no_vendor_kernels(cls: type[Backend], op: str) -> None:
    assert cls().fused_kernel(op) is None


def test_npu_kernels_are_the_standins_functions(npu_standin) -> None:
    backend = NPUBackend()
    assert set(FUSED_KERNELS) == set(OP_NAMES) == set(backend.fused_ops)
    for op, function in FUSED_KERNELS.items():
        assert backend.fused_kernel(op) is getattr(npu_standin, function)
    assert backend.fused_kernel("attention") is npu_standin.npu_fusion_attention


def test_npu_op_it_does_not_fuse_is_none(npu_standin) -> None:
    assert NPUBackend().fused_kernel("layer_norm") is None


def test_npu_kernel_missing_from_the_installed_torch_npu_is_none(
    npu_standin, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(npu_standin, "npu_swiglu")  # an older torch_npu without it
    backend = NPUBackend()
    assert backend.fused_kernel("swiglu") is None
    assert backend.fused_kernel("rms_norm") is npu_standin.npu_rms_norm


def test_npu_without_torch_npu_has_no_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch_npu", None)
    assert all(NPUBackend().fused_kernel(op) is None for op in OP_NAMES)


# ---- sdpa_note / sdpa_kernels ---------------------------------------------------------------------------
def test_sdpa_note_only_where_sdpa_has_fast_kernels() -> None:
    assert CUDABackend().sdpa_note() and XPUBackend().sdpa_note()
    assert CPUBackend().sdpa_note() == "" and MPSBackend().sdpa_note() == ""
    assert NPUBackend().sdpa_note() == ""  # the NPU uses its own fused attention instead


def test_cuda_lists_the_sdpa_kernels_torch_allows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.backends.cuda, "flash_sdp_enabled", lambda: False)
    kernels = CUDABackend().sdpa_kernels()
    assert "flash" not in kernels and "math" in kernels
    assert CPUBackend().sdpa_kernels() == [] and NPUBackend().sdpa_kernels() == []


# ---- diffusers_attention --------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_npu_half_precision_uses_native_npu(dtype: torch.dtype) -> None:
    assert NPUBackend().diffusers_attention(dtype) == ("_native_npu", "")


def test_npu_float32_stays_on_sdpa_and_says_why() -> None:
    name, reason = NPUBackend().diffusers_attention(torch.float32)
    assert name == "native" and "bf16/fp16" in reason


def test_npu_fused_attention_switched_off() -> None:
    name, reason = NPUBackend().diffusers_attention(torch.bfloat16, allow_fused=False)
    assert name == "native" and "_native_npu" in reason


@pytest.mark.parametrize("cls", [CPUBackend, CUDABackend, XPUBackend, MPSBackend])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_other_backends_use_native_sdpa(cls: type[Backend], dtype: torch.dtype) -> None:
    assert cls().diffusers_attention(dtype) == ("native", "")


# ---- compile_policy -------------------------------------------------------------------------------------
def test_compile_policy_is_decided_once_per_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []

    def counting(device_type: str) -> CompilePolicy:
        asked.append(device_type)
        return CompilePolicy(device_type, True, "inductor", None, "inductor", "default mode")

    monkeypatch.setattr(devices_base, "compile_policy", counting)
    backend = CPUBackend()
    first = backend.compile_policy()
    assert backend.compile_policy() is first and first.device_type == "cpu"
    assert asked == ["cpu"]
    CUDABackend().compile_policy()
    CPUBackend().compile_policy()  # a new backend decides again (the PATH or torchair may have changed)
    assert asked == ["cpu", "cuda", "cpu"]


def test_compile_policy_is_not_part_of_equality_or_repr() -> None:
    decided, fresh = CPUBackend(), CPUBackend()
    decided.compile_policy()
    assert decided == fresh and "compile" not in repr(decided)


# ---- pinned_host_copies ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("cls", "pinned"),
    [(CUDABackend, True), (NPUBackend, True), (XPUBackend, True), (CPUBackend, False), (MPSBackend, False)],
)
def test_pinned_host_copies(cls: type[Backend], pinned: bool) -> None:
    assert cls.pinned_host_copies is pinned
    assert cls().pinned_host_copies is pinned


# ---- environment variable names live with the backends ---------------------------------------------------
def test_env_var_names_are_presets_visibility_and_extras() -> None:
    npu = NPUBackend()
    names = npu.env_var_names()
    assert names[: len(npu.env_presets())] == tuple(p.name for p in npu.env_presets())
    assert "ASCEND_RT_VISIBLE_DEVICES" in names and "HCCL_OP_EXPANSION_MODE" in names
    assert CUDABackend().env_var_names() == ("PYTORCH_CUDA_ALLOC_CONF", "CUDA_VISIBLE_DEVICES", "DIFFORGE_TRITON_KERNELS")
    assert CPUBackend().env_var_names() == ()


def test_fingerprint_records_every_backends_variables() -> None:
    recorded = recorded_env_vars()
    for cls in BACKENDS.values():
        assert set(cls().env_var_names()) <= set(recorded)
    assert set(HOST_ENV_VARS) <= set(recorded)
    assert len(recorded) == len(set(recorded))


def test_fingerprint_records_a_set_backend_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    from difforge.runtime.environment import environment_fingerprint
    from difforge.version import __version__

    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "3")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    info = environment_fingerprint()
    assert info["env"]["ASCEND_RT_VISIBLE_DEVICES"] == "3" and "CUDA_VISIBLE_DEVICES" not in info["env"]
    assert info["difforge"] == __version__


def test_cpu_compile_runs_eager_under_the_default_kernel_family(monkeypatch) -> None:
    """ATEN_CPU_CAPABILITY=default: Inductor's generated CPU code does not build (no at::vec), so eager, said why."""
    from difforge.devices.compile import compile_policy

    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    policy = compile_policy("cpu")
    assert not policy.available and "ATEN_CPU_CAPABILITY=default" in policy.detail
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    assert compile_policy("cpu").detail != policy.detail
