"""Qwen-Image-Edit memory estimates: refused before loading or encoding, with the numbers, and recorded.

Every test fixes the backend's available memory by monkeypatching it, so nothing depends on this
machine's RAM; guards on the loaders and on ``_prepare`` make "it started anyway" fail at once.
The full-size tests build the real Qwen-Image-Edit configs (docs: /work/shared/specs/qwen-edit.md
§1.3) on the meta device, so they allocate nothing.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from difforge import api
from difforge.cli import app
from difforge.config import OFFLOAD_PLANS, RunConfig
from difforge.devices.cpu import CPUBackend
from difforge.errors import DeviceOutOfMemoryError
from difforge.models.qwen_edit import QwenEditPipeline
from difforge.models.qwen_edit import loader as loader_mod
from difforge.models.qwen_edit import memory as mem
from difforge.models.qwen_edit.settings import EditSettings
from difforge.models.tiny import ensure_tiny
from difforge.runtime.images import test_picture as picture  # not collected as a test
from difforge.runtime.memory import format_bytes
from difforge.runtime.record import RunRecord

GIB = 1 << 30
runner = CliRunner()

#: The real Qwen-Image-Edit transformer config (spec §1.3; also the diffusers class defaults).
REAL_TRANSFORMER = {"patch_size": 2, "in_channels": 64, "out_channels": 16, "num_layers": 60, "attention_head_dim": 128,
                    "num_attention_heads": 24, "joint_attention_dim": 3584, "axes_dims_rope": [16, 56, 56]}
REAL_VAE = {"base_dim": 96, "z_dim": 16, "dim_mult": [1, 2, 4, 4], "num_res_blocks": 2,
            "temperal_downsample": [False, True, True]}
REAL_PROCESSOR = {"patch_size": 14, "merge_size": 2, "min_pixels": 3136, "max_pixels": 12845056}


def real_text_config():
    """Qwen2.5-VL-7B as the Qwen-Image text encoder (spec §1.3: LM 28 x 3584, 28/4 heads; vision 32 x 1280)."""
    from transformers import Qwen2_5_VLConfig

    return Qwen2_5_VLConfig(
        text_config={"hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
                     "num_key_value_heads": 4, "vocab_size": 152064,
                     "rope_parameters": {"mrope_section": [16, 24, 24], "rope_type": "default", "rope_theta": 1e6}},
        vision_config={"depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16,
                       "out_hidden_size": 3584, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
                       "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31]},
        tie_word_embeddings=False,
    )


@pytest.fixture(scope="module")
def tiny() -> Path:
    return ensure_tiny("tiny-qwen-edit")


def _refuse(what: str):
    def refuse(*args, **kwargs):
        raise AssertionError(f"{what} started before the memory check refused the size")

    return refuse


def test_cli_refuses_a_huge_edit_before_reading_weights(tmp_path: Path, available, monkeypatch, tiny) -> None:
    available(8 * GIB)
    monkeypatch.setattr(loader_mod, "_load_text_encoder", _refuse("loading"))
    monkeypatch.setattr(loader_mod, "load_transformer_file", _refuse("loading"))
    image, out = tmp_path / "in.png", tmp_path / "a.png"
    picture(96, 64).save(image)
    r = runner.invoke(app, ["edit", "--image", str(image), "--prompt", "x", "--device", "cpu", "-q", "--steps", "2",
                            "--height", "8192", "--width", "8192", "--output", str(out)], catch_exceptions=False)
    assert r.exit_code == 2, (r.exit_code, r.stdout, r.stderr)
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1 and "unexpected" not in err, err
    assert err.startswith("difforge: error: Loading tiny-qwen-edit at 8192x8192 needs about "), err
    assert "GiB on cpu, which has 8.0 GiB available; with --vae-tiling it needs about " in err, err
    assert not out.exists()


def test_call_refused_at_a_huge_size_before_encoding(available, monkeypatch, tiny) -> None:
    available(8 * GIB)
    cfg = RunConfig(model="tiny-qwen-edit", prompt="x", steps=2, height=64, width=64, quiet=True)
    pipe = QwenEditPipeline.from_pretrained(tiny, CPUBackend(), torch.float32, cfg, RunRecord("edit"))
    monkeypatch.setattr(QwenEditPipeline, "_prepare", _refuse("encoding"))
    record = RunRecord("edit")
    huge = RunConfig(model="tiny-qwen-edit", prompt="x", steps=2, height=8192, width=8192, quiet=True)
    with pytest.raises(DeviceOutOfMemoryError) as info:
        pipe(huge, record, [picture(96, 64)])
    text = str(info.value)
    assert text.startswith("tiny-qwen-edit at 8192x8192 needs about ") and "with --vae-tiling it needs about" in text
    est = record.extra["memory_estimate"]["call"]
    assert est["checked"] and est["needed_bytes"] > 8 * GIB
    assert est["needed_bytes"] == est["parts"]["decode_peak"]  # the VAE decode is what does not fit
    # The suggestion holds: with tiling the same size passes the check (without running it).
    tiled = RunConfig(model="tiny-qwen-edit", prompt="x", steps=2, height=8192, width=8192, quiet=True, vae_tiling=True)
    pipe.configure(tiled)
    ok = mem.check_call_memory(pipe, tiled, [picture(96, 64)], 8192, 8192, None)
    assert ok is not None and ok.checked and ok.needed_bytes < 8 * GIB


def test_demo_size_passes_and_both_estimates_are_recorded(tmp_path: Path, available, tiny) -> None:
    available(8 * GIB)
    result = api.edit(picture(96, 64), "make the sky red", device="cpu", steps=2, height=64, width=64,
                      quiet=True)
    estimates = result.record.extra["memory_estimate"]
    load, call = estimates["load"], estimates["call"]
    assert load["checked"] and call["checked"] and call["available_bytes"] == 8 * GIB
    assert load["what"] == "Loading tiny-qwen-edit at 64x64" and call["what"] == "tiny-qwen-edit at 64x64"
    weights = sum(load["parts"][k] for k in ("transformer_weights", "text_encoder_weights", "vae_weights"))
    assert 10 << 20 < weights < 12 << 20  # ~2.75 M float32 parameters
    assert load["needed_bytes"] == weights + max(load["parts"][p] for p in mem.PHASES)
    # On the CPU the weights already sit in host memory: a call needs its activations only.
    assert call["needed_bytes"] == max(call["parts"][p] for p in mem.PHASES) < 64 << 20
    assert call["parts"]["resident_weights"] == weights


def test_unreadable_estimate_is_recorded_not_fatal(available, monkeypatch, tiny) -> None:
    available(8 * GIB)

    def broken(*args, **kwargs):
        raise RuntimeError("no")

    monkeypatch.setattr(mem, "weights_from_configs", broken)
    record = RunRecord("edit")
    assert mem.check_load_memory(tiny, CPUBackend(), torch.float32, RunConfig(model="x"), False, record) is None
    assert record.extra["memory_estimate"]["load"]["skipped_reason"] == "estimating failed (RuntimeError: no)"


# ---- the estimate itself -----------------------------------------------------------------------


def test_parameters_match_the_modules_and_build_one_block(monkeypatch, tiny) -> None:
    from diffusers import AutoencoderKLQwenImage, QwenImageTransformer2DModel
    from diffusers.models.transformers import transformer_qwenimage as tq
    from transformers import Qwen2_5_VLForConditionalGeneration

    tcfg = json.loads((tiny / "transformer" / "config.json").read_text())
    vcfg = json.loads((tiny / "vae" / "config.json").read_text())
    te = mem.text_config(tiny)
    with torch.device("meta"):
        t = QwenImageTransformer2DModel.from_config(tcfg)
        v = AutoencoderKLQwenImage.from_config(vcfg)
        e = Qwen2_5_VLForConditionalGeneration(te)
    assert mem.transformer_parameters(tcfg) == sum(p.numel() for p in t.parameters())
    assert mem.vae_count(vcfg).params == sum(p.numel() for p in v.parameters())
    floating_buffers = sum(b.numel() for b in e.buffers() if b.is_floating_point())
    assert mem.text_encoder_count(te).params == sum(p.numel() for p in e.parameters()) + floating_buffers

    built, init = [0], tq.QwenImageTransformerBlock.__init__

    def counting(self, *args, **kwargs):
        built[0] += 1
        init(self, *args, **kwargs)

    monkeypatch.setattr(tq.QwenImageTransformerBlock, "__init__", counting)
    hostile = {**REAL_TRANSFORMER, "num_layers": 100_000}
    assert mem.transformer_parameters(hostile) > 3 * 10**13  # ~68 TB in bf16: refused, never built
    assert built[0] == 1


def test_full_size_parameter_counts() -> None:
    """Spec §1.3, counted on meta: transformer 20,430,401,088; text encoder 8,292,166,656; VAE 126,892,531."""
    assert mem.transformer_parameters(REAL_TRANSFORMER) == 20_430_401_088
    assert mem.transformer_parameters({}) == 20_430_401_088  # the class defaults are the real model
    assert math.isclose(mem.text_encoder_count(real_text_config()).params, 8_292_166_656, rel_tol=1e-6)
    assert mem.vae_count(REAL_VAE).params == 126_892_531


def _real_header(scaled: bool = False) -> dict:
    """A transformer-only fp8 header like ComfyUI's plain cast: every 2-D Linear weight in e4m3, the rest bf16."""
    outer, block, layers = mem._transformer_parts(REAL_TRANSFORMER)
    header = {}
    entries = [(k, v) for k, v in outer.state_dict().items()]
    entries += [(f"transformer_blocks.{i}.{k}", v) for i in range(layers) for k, v in block.state_dict().items()]
    for key, value in entries:
        fp8 = key.endswith(".weight") and value.dim() == 2
        header[key] = {"dtype": "F8_E4M3" if fp8 else "BF16", "shape": list(value.shape)}
        if fp8 and scaled:
            header[key.removesuffix("weight") + "weight_scale"] = {"dtype": "F32", "shape": []}
    return header


def full_size_report(dtype: torch.dtype = torch.bfloat16, fp8: bool = False, tiling: bool = False,
                     plus: bool = False) -> dict[str, int]:
    """Bytes on the device per offload plan for a 1024x1024 edit of a 1024x1024 reference, full size."""
    te = real_text_config()
    w = mem.weights_for(REAL_TRANSFORMER, te, REAL_VAE, dtype, _real_header() if fp8 else None)
    cfg = RunConfig(model="Qwen-Image-Edit", prompt="make the sky red")
    shapes = mem.shapes_for(cfg, EditSettings(), plus, 1024, 1024)
    parts = mem.activation_parts(REAL_TRANSFORMER, te, REAL_VAE, shapes, REAL_PROCESSOR, dtype,
                                 mem.tiling_settings() if tiling else None, False, w.fp8_layer)
    return {**{p: mem.plan_total(p, w, parts, on_cpu=False) for p in OFFLOAD_PLANS}, **w.parts(),
            **{k: parts[k] for k in mem.PHASES}}


def test_full_size_estimates_per_offload_plan() -> None:
    bf16, fp8 = full_size_report(), full_size_report(fp8=True)
    print("bf16", {k: format_bytes(v) for k, v in bf16.items()})
    print("fp8 ", {k: format_bytes(v) for k, v in fp8.items()})
    print("bf16 tiled", {k: format_bytes(v) for k, v in full_size_report(tiling=True).items()})
    print("fp8 tiled", {k: format_bytes(v) for k, v in full_size_report(fp8=True, tiling=True).items()})
    print("plus bf16", {k: format_bytes(v) for k, v in full_size_report(plus=True).items()})
    assert math.isclose(bf16["transformer_weights"], 40.86e9, rel_tol=0.01)  # spec: 40.86 GB in bf16
    assert math.isclose(fp8["transformer_weights"], 20.45e9, rel_tol=0.01)  # spec: 20.45 GB fp8 storage
    assert math.isclose(bf16["text_encoder_weights"], 16.6e9, rel_tol=0.01)
    # weights dominate: 57.5 GB of them, a few GiB of activations at 1024x1024
    assert 55 * GIB < bf16["none"] < 60 * GIB and 36 * GIB < fp8["none"] < 40 * GIB
    assert bf16["before-decode"] <= bf16["none"]
    assert 38 * GIB < bf16["model"] < 42 * GIB and 19 * GIB < fp8["model"] < 23 * GIB  # the transformer + denoise
    assert bf16["sequential"] < 6 * GIB and fp8["sequential"] < 6 * GIB
    assert 1 * GIB < bf16["denoise_peak"] < 4 * GIB and 2 * GIB < bf16["decode_peak"] < 6 * GIB
    tiled = full_size_report(tiling=True)
    assert tiled["decode_peak"] < bf16["decode_peak"] / 4


def test_fp8_file_counts_one_byte_per_linear_weight() -> None:
    header = _real_header(scaled=True)
    fp8, scales = mem.fp8_elements(REAL_TRANSFORMER, header, "")
    total = mem.transformer_parameters(REAL_TRANSFORMER)
    assert 0.99 * total < fp8 < total  # everything but biases and norms
    assert scales == sum(1 for k in header if k.endswith("weight_scale"))
    prefixed = {f"model.diffusion_model.{k}": v for k, v in header.items()}
    assert mem.fp8_elements(REAL_TRANSFORMER, prefixed, "model.diffusion_model.") == (fp8, scales)


def test_refusal_names_the_offload_plan_that_fits(tmp_path: Path, available) -> None:
    """A 48 GiB accelerator: bf16 with --offload none is refused at load, naming --offload model."""

    class Accelerator(CPUBackend):
        name = "cuda"
        is_host = False

        @property
        def device(self) -> torch.device:
            return torch.device("cuda", 0)

        def available_memory_bytes(self) -> int:
            return 48 * GIB

    available(256 * GIB)  # the host
    folder = tmp_path / "Qwen-Image-Edit"
    for sub, data in (("transformer", REAL_TRANSFORMER), ("vae", REAL_VAE)):
        (folder / sub).mkdir(parents=True)
        (folder / sub / "config.json").write_text(json.dumps(data))
    real_text_config().save_pretrained(folder / "text_encoder")
    (folder / "processor").mkdir()
    (folder / "processor" / "processor_config.json").write_text(json.dumps({"image_processor": REAL_PROCESSOR}))
    cfg = RunConfig(model=str(folder), prompt="x", height=1024, width=1024)
    record = RunRecord("edit")
    with pytest.raises(DeviceOutOfMemoryError) as info:
        mem.check_load_memory(folder, Accelerator(), torch.bfloat16, cfg, False, record)
    text = str(info.value)
    assert text.startswith("Loading Qwen-Image-Edit at 1024x1024 needs about 57.")
    assert "on cuda:0, which has 48.0 GiB available; with --offload model it needs about 40." in text, text
    assert record.extra["memory_estimate"]["load_host"]["checked"]
    model = RunConfig(model=str(folder), prompt="x", height=1024, width=1024, offload="model")
    assert mem.check_load_memory(folder, Accelerator(), torch.bfloat16, model, False, RunRecord("edit")).checked


@pytest.mark.parametrize("form", [None, "plain", "scaled-prefixed"])
def test_load_estimate_equals_what_the_load_holds(tmp_path: Path, available, tiny, form: str | None) -> None:
    """The weights counted on meta before the load are the bytes the loaded modules hold (fp8 at 1 byte)."""
    from difforge.models.qwen_edit.tiny import build_tiny_fp8_transformer

    available(8 * GIB)
    file = None
    if form is not None:
        file = tmp_path / "transformer.safetensors"
        build_tiny_fp8_transformer(tiny, file, form)
    record = RunRecord("edit")
    cfg = RunConfig(model="tiny-qwen-edit", transformer_file=str(file) if file else None)
    pipe = QwenEditPipeline.from_pretrained(tiny, CPUBackend(), torch.bfloat16, cfg, record)
    parts = record.extra["memory_estimate"]["load"]["parts"]
    p = pipe.pipe
    assert parts["transformer_weights"] == mem.module_bytes(p.transformer)
    assert parts["vae_weights"] == mem.module_bytes(p.vae)
    # transformers keeps the rotary inv_freq buffers in float32: a few bytes more than counted
    assert 0 <= mem.module_bytes(p.text_encoder) - parts["text_encoder_weights"] < 64
