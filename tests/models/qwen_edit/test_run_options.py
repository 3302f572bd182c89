"""Options fixed at load: the compile policy and the attention kernel per device, weights never left on meta."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from difforge.errors import CheckpointError
from difforge.models.qwen_edit.loader import check_no_meta

from .conftest import card, load, make_cfg, pixels

URSA_WORDING = "exact within floating-point noise, not bit for bit"


def _compiled(qe) -> list[bool]:
    return [getattr(b, "_compiled_call_impl", None) is not None for b in qe.pipe.transformer.transformer_blocks]


def test_compile_follows_the_device_policy(edit_folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Backend and mode come from devices.compile.compile_policy; compiled runs are recorded inexact."""
    from diffusers import QwenImageTransformer2DModel

    import difforge.devices.compile as policy_module

    seen: list[dict] = []
    monkeypatch.setattr(QwenImageTransformer2DModel, "compile_repeated_blocks", lambda self, **kw: seen.append(kw))
    monkeypatch.setattr(policy_module.shutil, "which", lambda name: f"/usr/bin/{name}")
    cfg = make_cfg(edit_folder, compile=True)
    _, record = load(edit_folder, cfg)
    assert seen == [{"backend": "inductor", "dynamic": False}]  # the CPU policy: Inductor, default mode
    compile_entry = next(a for a in record.adaptations if a.what == "compile")
    assert compile_entry.exact is False and compile_entry.choice.startswith("inductor: regional")
    assert URSA_WORDING in compile_entry.detail


def test_compile_without_a_cpp_compiler_runs_eager_and_says_why(edit_folder: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import difforge.devices.compile as policy_module

    monkeypatch.setattr(policy_module.shutil, "which", lambda name: None)  # PATH without g++/c++/clang++
    cfg = make_cfg(edit_folder, compile=True)
    qe, record = load(edit_folder, cfg)
    assert not any(_compiled(qe))
    entry = next(a for a in record.adaptations if a.what == "compile")
    assert entry.choice == "eager (compile requested)" and "no C++ compiler" in entry.detail
    image = qe(cfg, record, [card()])[0]  # runs eager: no InductorError
    assert image.size == (64, 64) and pixels(image).std() > 0


def test_a_weight_left_on_the_meta_device_is_a_checkpoint_error(tmp_path: Path) -> None:
    module = torch.nn.Linear(2, 2)
    check_no_meta(module, tmp_path)
    module.bias = torch.nn.Parameter(torch.empty(2, device="meta"))
    with pytest.raises(CheckpointError, match=r"lacks weight 'bias'; the file does not match its config\.$"):
        check_no_meta(module, tmp_path)


def test_switching_npu_attention_off_sets_sdpa_explicitly(edit_folder: Path) -> None:
    """A reused pipeline that ran _native_npu goes back to 'native' (not diffusers' process-wide default)."""
    from diffusers.models.attention_dispatch import AttentionBackendName

    from difforge.devices import NPUBackend
    from difforge.models.qwen_edit.loader import choose_attention
    from difforge.runtime.record import RunRecord

    qe, _ = load(edit_folder, make_cfg(edit_folder))
    processors = {id(b.attn.processor): b.attn.processor for b in qe.pipe.transformer.transformer_blocks}.values()
    for proc in processors:
        proc._attention_backend = AttentionBackendName._NATIVE_NPU  # as set_attention_backend left it
    record = RunRecord("edit")
    assert choose_attention(qe.pipe, NPUBackend(), torch.bfloat16, record, allow_npu=False) == "native"
    assert all(proc._attention_backend == AttentionBackendName.NATIVE for proc in processors)
    assert "switched off with 'npu-attention'" in record.adaptations[-1].detail


class _AsksFor:
    """A backend stand-in that answers only the attention question (what choose_attention may ask)."""

    def __init__(self, name: str, why: str = "") -> None:
        self.answer = (name, why)
        self.asked: list[tuple[torch.dtype, bool]] = []

    def diffusers_attention(self, dtype: torch.dtype, allow_fused: bool = True) -> tuple[str, str]:
        self.asked.append((dtype, allow_fused))
        return self.answer


@pytest.mark.parametrize("dtype, allow, detail", [
    (torch.float32, True, "the NPU fused kernel needs bf16/fp16"),
    (torch.bfloat16, False, "_native_npu switched off with 'npu-attention'"),
])
def test_the_backend_chooses_the_attention_kernel(edit_folder: Path, dtype: torch.dtype, allow: bool,
                                                  detail: str) -> None:
    """The kernel and its reason are the backend's answer; the record only writes them down."""
    from difforge.devices import NPUBackend
    from difforge.models.qwen_edit.loader import choose_attention
    from difforge.runtime.record import RunRecord

    qe, _ = load(edit_folder, make_cfg(edit_folder))
    record = RunRecord("edit")
    assert choose_attention(qe.pipe, NPUBackend(), dtype, record, allow_npu=allow) == "native"
    entry = record.adaptations[-1]
    assert (entry.what, entry.choice, entry.detail) == ("attention", "torch SDPA (diffusers 'native')", detail)
    asked = _AsksFor("native", "because")
    choose_attention(qe.pipe, asked, dtype, record, allow_npu=allow)
    assert asked.asked == [(dtype, allow)] and record.adaptations[-1].detail == "because"


def test_a_fused_kernel_diffusers_refuses_keeps_sdpa_and_says_why(edit_folder: Path) -> None:
    """An NPU answer on a machine without torch_npu: diffusers refuses the backend, SDPA stays, the record says why."""
    from difforge.models.qwen_edit.loader import choose_attention
    from difforge.runtime.record import RunRecord

    cfg = make_cfg(edit_folder)
    qe, _ = load(edit_folder, cfg)
    before = pixels(qe(cfg, RunRecord("edit"), [card()])[0])
    record = RunRecord("edit")
    assert choose_attention(qe.pipe, _AsksFor("_native_npu"), torch.bfloat16, record) == "native"
    entry = record.adaptations[-1]
    assert entry.choice == "torch SDPA (diffusers 'native')" and entry.detail.startswith("_native_npu refused: ")
    assert np.array_equal(pixels(qe(cfg, RunRecord("edit"), [card()])[0]), before)
