"""Memory estimates: a run that cannot fit is refused before it allocates, with the numbers, and recorded.

Before the fix ``generate --height 4096 --width 4096`` on tiny-ursa started with no bound at all.
Every test here fixes the backend's available memory by monkeypatching it, so nothing depends on
this machine's RAM; a guard on ``prepare_tokens`` makes "it started anyway" fail at once instead of
running for hours.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from difforge import api
from difforge.cli import app
from difforge.devices.cpu import CPUBackend
from difforge.errors import DeviceOutOfMemoryError
from difforge.models.tiny import ensure_tiny
from difforge.models.ursa import transformer as transformer_mod
from difforge.models.ursa.config import URSATransformerConfig, VQConfig
from difforge.models.ursa.memory import activation_parts, transformer_parameters, vae_parameters
from difforge.models.ursa.pipeline import URSAPipeline
from difforge.models.ursa.transformer import URSATransformer
from difforge.models.ursa.vae_fsq import FSQConfig
from difforge.runtime.memory import SKIP_ENV, MemoryEstimate, check_memory, format_bytes

GIB = 1 << 30
runner = CliRunner()


@pytest.fixture
def no_denoise(monkeypatch: pytest.MonkeyPatch) -> None:
    """A refused call must never reach the denoiser (where a 4096x4096 tiny-ursa run spends hours)."""

    def refuse(*args, **kwargs):
        raise AssertionError("denoising started before the memory check refused the size")

    monkeypatch.setattr(URSAPipeline, "prepare_tokens", refuse)


def _generate(out: Path, *extra: str):
    args = ["generate", "--prompt", "x", "--device", "cpu", "-q", "--steps", "2", "--output", str(out), *extra]
    return runner.invoke(app, args, catch_exceptions=False)


def test_cli_refuses_4096_on_8_gib(tmp_path: Path, available, no_denoise) -> None:
    available(8 * GIB)
    out = tmp_path / "a.png"
    r = _generate(out, "--height", "4096", "--width", "4096")
    assert r.exit_code == 2, (r.exit_code, r.stdout, r.stderr)
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1 and "unexpected" not in err, err
    assert err.startswith("difforge: error: tiny-ursa at 4096x4096 needs about "), err
    assert "GiB on cpu, which has 8.0 GiB available; reduce --height/--width" in err, err
    assert not out.exists()


def test_demo_sizes_pass_and_the_estimate_is_recorded(tmp_path: Path, available) -> None:
    available(8 * GIB)
    out, rec = tmp_path / "a.png", tmp_path / "rec.json"
    r = _generate(out, "--height", "64", "--width", "64", "--record", str(rec))
    assert r.exit_code == 0, r.stderr
    est = json.loads(rec.read_text())["extra"]["memory_estimate"]["call"]
    assert est["checked"] is True and est["available_bytes"] == 8 * GIB and est["what"] == "tiny-ursa at 64x64"
    assert 0 < est["needed_bytes"] < 64 << 20
    assert est["needed_bytes"] == max(est["parts"]["denoise_peak"], est["parts"]["vae_decode_peak"])


def test_default_size_passes_on_a_small_machine(available) -> None:
    """320x512 (the default) needs well under 1 GiB on tiny-ursa: a 1 GiB machine must not be refused."""
    from difforge.config import RunConfig
    from difforge.models.ursa.memory import check_call_memory

    available(GIB)
    tiny_pipe = URSAPipeline.from_pretrained(ensure_tiny("tiny-ursa"), CPUBackend(), torch.float32)
    cfg = RunConfig(model="tiny-ursa")
    est = check_call_memory(tiny_pipe, cfg, tiny_pipe.latent_shape(cfg), None)
    assert est.checked and est.needed_bytes < 256 << 20


def test_unknown_available_memory_skips_with_a_reason(tmp_path: Path, available) -> None:
    available(None)
    result = api.generate("x", model="tiny-ursa", device="cpu", steps=2, height=64, width=64,
                          output=str(tmp_path / "a.png"), quiet=True)
    est = result.record.extra["memory_estimate"]["call"]
    assert est["checked"] is False and est["skipped_reason"] == "cpu does not report available memory"


def test_opt_out_records_why(available, monkeypatch: pytest.MonkeyPatch) -> None:
    from difforge.runtime.record import RunRecord

    available(1)
    monkeypatch.setenv(SKIP_ENV, "1")
    record = RunRecord("generate")
    est = check_memory(CPUBackend(), MemoryEstimate("x", "cpu", 10 * GIB), "reduce it", record)
    assert not est.checked and record.extra["memory_estimate"]["call"]["skipped_reason"] == f"{SKIP_ENV} is set"


def test_refusal_is_one_sentence_with_both_numbers(available) -> None:
    available(3 * GIB)
    with pytest.raises(DeviceOutOfMemoryError) as info:
        check_memory(CPUBackend(), MemoryEstimate("m at 8x8", "cpu", 123 * GIB), "reduce --height/--width")
    assert str(info.value) == (
        "m at 8x8 needs about 123 GiB on cpu, which has 3.0 GiB available; reduce --height/--width "
        f"(or set {SKIP_ENV}=1 to try anyway)."
    )
    assert info.value.exit_code == 2


def test_load_is_refused_before_building_when_the_host_is_too_small(tmp_path: Path, available,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    available(1 << 20)  # tiny-ursa's weights are ~2.5 MB in float32
    built = []
    monkeypatch.setattr(transformer_mod.URSATransformer, "__init__",
                        lambda self, *a, **k: built.append(1) or (_ for _ in ()).throw(AssertionError("built")))
    folder = tmp_path / "tiny-ursa"
    shutil.copytree(ensure_tiny("tiny-ursa"), folder)
    out = tmp_path / "a.png"
    r = runner.invoke(app, ["generate", "--model", str(folder), "--prompt", "x", "--device", "cpu", "-q",
                            "--output", str(out)], catch_exceptions=False)
    assert r.exit_code == 2, (r.exit_code, r.stderr)
    assert "Loading tiny-ursa needs about 2 MiB on cpu, which has 1 MiB available" in r.stderr, r.stderr
    assert built == [] and not out.exists()


# ---- the estimate itself -----------------------------------------------------------------------


def test_parameter_count_matches_the_module_and_builds_one_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    tiny = URSATransformerConfig(hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1,
                                 num_hidden_layers=3, max_window_layers=3, vocab_size=378, lm_vocab_size=314,
                                 lm_head_size=64, bov_token_id=297)
    with torch.device("meta"):
        real = sum(p.numel() for p in URSATransformer(tiny).parameters())
    assert transformer_parameters(tiny) == real
    built, init = [0], transformer_mod.DecoderLayer.__init__

    def counting(self, *args, **kwargs):
        built[0] += 1
        init(self, *args, **kwargs)

    monkeypatch.setattr(transformer_mod.DecoderLayer, "__init__", counting)
    widest = URSATransformerConfig(hidden_size=65536, intermediate_size=262144, num_attention_heads=1024,
                                   num_key_value_heads=1024, num_hidden_layers=1024, max_window_layers=1024)
    assert transformer_parameters(widest) > 10**13  # ~40 TB in bf16: refused, never built
    assert built[0] == 1


def test_full_size_ursa_17b_numbers() -> None:
    """URSA-1.7B IBQ (docs/specs: Qwen3-1.7B shape, 131072 codes, Emu3.5 tokenizer VAE) at 1024x1024."""
    fsq_vocab = URSATransformerConfig()  # class defaults: the FSQ (64000-code) 1.7B model
    assert math.isclose(transformer_parameters(fsq_vocab), 1.98e9, rel_tol=0.01)  # spec: "about 1.98B"
    tcfg = URSATransformerConfig(lm_head_size=131072, vocab_size=151669 + 131072)
    vcfg = VQConfig(block_out_channels=(256, 256, 512, 512, 1024), layers_per_block=4, latent_channels=256,
                    num_vq_embeddings=131072, vq_embed_dim=256, attn_down_block=True, attn_up_block=True)
    assert math.isclose(transformer_parameters(tcfg) * 2, 4.5e9, rel_tol=0.02)  # spec: bf16 file ~4.5 GB
    assert vae_parameters(vcfg) > 0
    parts = activation_parts(tcfg, vcfg, (1, 64, 64), 1, True, torch.bfloat16)
    assert parts["logits"] == 2 * 4096 * 131072 * 4  # rows x N x K in float32
    need = max(parts["denoise_peak"], parts["vae_decode_peak"])
    assert 8 * GIB < need < 12 * GIB, format_bytes(need)


def test_tiny_sizes_scale_and_the_video_vae_is_estimated() -> None:
    folder = ensure_tiny("tiny-ursa")
    tcfg = URSATransformerConfig.from_dict(json.loads((folder / "transformer" / "config.json").read_text()))
    vcfg = VQConfig.from_dict(json.loads((folder / "vae" / "config.json").read_text()))
    need = {s: max(v for k, v in activation_parts(tcfg, vcfg, (1, s // 16, s // 16), 1, True, torch.float32).items()
                   if k.endswith("_peak")) for s in (64, 512, 4096)}
    assert need[64] < 16 << 20 and need[512] < 512 << 20 and 8 * GIB < need[4096] < 16 * GIB
    video = ensure_tiny("tiny-ursa-video")
    fcfg = FSQConfig.from_dict(json.loads((video / "vae" / "config.json").read_text()))
    parts = activation_parts(tcfg, fcfg, (3, 8, 8), 1, True, torch.float32)
    assert parts["vae_decode_peak"] > 0


# ---- the diffusers-style call and the held dtype -------------------------------------------------


def test_generate_call_is_checked_too(available, no_denoise) -> None:
    """``pipe.generate(...)`` (the reference's call) is refused like ``pipe(cfg)``, batch included."""
    from difforge.config import RunConfig
    from difforge.models.ursa.memory import call_estimate

    available(8 * GIB)
    folder = ensure_tiny("tiny-ursa")
    pipe = URSAPipeline.from_pretrained(folder, CPUBackend(), torch.float32)
    with pytest.raises(DeviceOutOfMemoryError) as info:
        pipe.generate("x", height=4096, width=4096, num_inference_steps=2)
    assert str(info.value).startswith(f"{folder.name} at 4096x4096 needs about "), str(info.value)
    available(1 << 20)  # any call is refused now; the message names the batch the call would denoise
    with pytest.raises(DeviceOutOfMemoryError) as info:
        pipe.generate(["x", "y"], height=64, width=64, num_inference_steps=2, num_images_per_prompt=2)
    assert " at 64x64 for a batch of 4 needs about " in str(info.value), str(info.value)
    cfg = RunConfig(model="", height=1024, width=1024)
    one, four = (call_estimate(pipe, cfg, pipe.latent_shape(cfg), batch=b).parts["logits"] for b in (1, 4))
    assert four == 4 * one


def _bf16_copy(tmp_path: Path) -> Path:
    """tiny-ursa with its transformer and VAE stored in bfloat16 (like the published checkpoints)."""
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "tiny-ursa-bf16"
    shutil.copytree(ensure_tiny("tiny-ursa"), folder)
    for path in [*folder.glob("transformer/*.safetensors"), *folder.glob("vae/*.safetensors")]:
        state = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in load_file(path).items()}
        save_file(state, path)
    return folder


def test_load_counts_weights_in_the_dtype_they_are_held(tmp_path: Path, available,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A bf16 checkpoint run in float32 on the CPU holds twice its file size; the load check must say so."""
    from difforge.models.ursa.loader import URSACheckpoint
    from difforge.models.ursa.memory import check_weights_fit
    from difforge.runtime.record import RunRecord

    folder = _bf16_copy(tmp_path)
    ckpt = URSACheckpoint.read_configs(folder)
    available(1 << 40)
    in_file, as_fp32 = (check_weights_fit(ckpt, d).needed_bytes for d in (torch.bfloat16, torch.float32))
    assert as_fp32 == 2 * in_file and check_weights_fit(ckpt).needed_bytes == in_file
    available((in_file + as_fp32) // 2)  # room for the file's bf16, not for the float32 copy
    built = []
    monkeypatch.setattr(transformer_mod.URSATransformer, "__init__",
                        lambda self, *a, **k: built.append(1) or (_ for _ in ()).throw(AssertionError("built")))
    record = RunRecord("generate")
    with pytest.raises(DeviceOutOfMemoryError) as info:
        URSAPipeline.from_pretrained(folder, CPUBackend(), torch.float32, record=record)
    assert str(info.value).startswith(f"Loading tiny-ursa-bf16 needs about {format_bytes(as_fp32)} on cpu")
    assert "use --dtype bfloat16 or a machine with more host memory" in str(info.value)
    assert built == [] and record.extra["memory_estimate"]["load"]["needed_bytes"] == as_fp32
    assert check_weights_fit(ckpt, torch.bfloat16).checked  # the file's own dtype still fits
