"""Options fixed at load: the compile policy per device, weights never left on the meta device."""

from __future__ import annotations

from pathlib import Path

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
    from types import SimpleNamespace

    from diffusers.models.attention_dispatch import AttentionBackendName

    from difforge.models.qwen_edit.loader import choose_attention
    from difforge.runtime.record import RunRecord

    qe, _ = load(edit_folder, make_cfg(edit_folder))
    processors = {id(b.attn.processor): b.attn.processor for b in qe.pipe.transformer.transformer_blocks}.values()
    for proc in processors:
        proc._attention_backend = AttentionBackendName._NATIVE_NPU  # as set_attention_backend left it
    record = RunRecord("edit")
    npu = SimpleNamespace(name="npu")
    assert choose_attention(qe.pipe, npu, torch.bfloat16, record, allow_npu=False) == "native"
    assert all(proc._attention_backend == AttentionBackendName.NATIVE for proc in processors)
    assert "switched off with 'npu-attention'" in record.adaptations[-1].detail
