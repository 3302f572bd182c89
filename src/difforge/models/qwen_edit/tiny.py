"""Deterministic tiny Qwen-Image-Edit checkpoints in the real diffusers layout.

The tiny models exercise every code path of the real ones offline (byte-level tokenizer with the
real Qwen special tokens, a Qwen2.5-VL text encoder with a vision tower, the real VAE layout with
narrow channels, the real scheduler config), in seconds on a CPU.  The same code always writes the
same bytes: weights come from fixed seeds and nothing time- or host-dependent is saved.

``build_tiny_fp8_transformer`` re-packs a tiny transformer the ways FP8 community files do, so the
FP8 loader is tested against each real-world form.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from ..checkpoint import load_component_state_dict
from .compat import apply_processor_shim
from .settings import SETTINGS_FILE

#: The Qwen special tokens the prompt templates use, in the order of the real vocabulary.
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
#: The real Qwen-Image scheduler configuration (dynamic exponential shift, terminal shift 0.02).
SCHEDULER_CONFIG = {
    "base_image_seq_len": 256,
    "base_shift": 0.5,
    "invert_sigmas": False,
    "max_image_seq_len": 8192,
    "max_shift": 0.9,
    "num_train_timesteps": 1000,
    "shift": 1.0,
    "shift_terminal": 0.02,
    "stochastic_sampling": False,
    "time_shift_type": "exponential",
    "use_beta_sigmas": False,
    "use_dynamic_shifting": True,
    "use_exponential_sigmas": False,
    "use_karras_sigmas": False,
}
#: Small reference sizes so CPU runs take about a second (the real models use 1024² / 384²).
TINY_SETTINGS = {"reference_area": 128 * 128, "condition_area": 112 * 112, "output_area": 96 * 96}
FP8_FORMS = ("plain", "scaled", "scaled-prefixed")
#: The files of a published Qwen-Image-Edit ``processor/`` folder that configure its image and video
#: processors (transformers 5's ``save_pretrained`` nests the image one in ``processor_config.json`` instead).
IMAGE_PROCESSOR_FILE = "preprocessor_config.json"
VIDEO_PROCESSOR_FILE = "video_preprocessor_config.json"
#: Settings the video processor shares with the image one in the published Qwen2.5-VL files.
_SHARED_VISION_KEYS = (
    "do_convert_rgb", "do_normalize", "do_rescale", "do_resize", "image_mean", "image_std", "merge_size",
    "patch_size", "resample", "rescale_factor", "size", "temporal_patch_size", "min_pixels", "max_pixels",
)
#: The published Qwen2.5-VL video processor's frame bounds.  The edit pipelines never pass video, but
#: transformers builds the video processor (and so reads this file) wherever torchvision is installed.
_VIDEO_FRAMES = {"min_frames": 4, "max_frames": 768, "do_sample_frames": False}


def _byte_vocab() -> dict[str, int]:
    """GPT-2's byte-to-unicode table: one printable symbol per byte, so every byte is a token."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    table = bytes_to_unicode()
    return {table[b]: b for b in range(256)}


def _tokenizer():
    return qwen_tokenizer()


def qwen_tokenizer(merges: list[tuple[str, str]] | None = None):  # noqa: ANN201 - a transformers Qwen2Tokenizer
    """The Qwen2 tokenizer of the tiny layout: every byte a token, then ``merges`` (none for the tiny
    models; the trained shapes model's learnt ones), then the special tokens."""
    from transformers import Qwen2Tokenizer

    vocab = _byte_vocab()
    for a, b in merges or []:
        vocab.setdefault(a + b, len(vocab))
    for tok in SPECIAL_TOKENS:
        vocab[tok] = len(vocab)
    tok = Qwen2Tokenizer(
        vocab=vocab,
        merges=list(merges or []),
        extra_special_tokens={
            "image_token": "<|image_pad|>",
            "video_token": "<|video_pad|>",
            "vision_bos_token": "<|vision_start|>",
            "vision_eos_token": "<|vision_end|>",
        },
    )
    # Without registering them as added tokens the byte pre-tokenizer splits them into bytes.
    tok.add_tokens(list(SPECIAL_TOKENS), special_tokens=True)
    return tok


def _processor(tokenizer):
    import transformers
    from transformers import Qwen2VLProcessor

    apply_processor_shim()
    # The PIL backend needs no torchvision; before transformers 5.x's backend split it was the default class.
    pil_class = getattr(transformers, "Qwen2VLImageProcessorPil", None) or transformers.Qwen2VLImageProcessor
    image_processor = pil_class(
        patch_size=14, temporal_patch_size=2, merge_size=2, min_pixels=56 * 56, max_pixels=56 * 56 * 4
    )
    return Qwen2VLProcessor(image_processor=image_processor, tokenizer=tokenizer)


def write_processor_layout(processor_dir: Path) -> None:
    """Give a saved Qwen2-VL ``processor/`` folder the published layout.

    The published Qwen-Image-Edit(-2509) ``processor/`` holds ``preprocessor_config.json`` (image)
    and ``video_preprocessor_config.json`` (video) beside the tokenizer files.  transformers 5 saves
    the image settings nested in ``processor_config.json`` and, without torchvision, no video file at
    all - a folder that loads on the CPU CI but not where torchvision is installed (as on nearly every
    CUDA machine: the 2026-12-04 H200 run).  Built-ins in the real layout load everywhere real
    folders load, and transformers 4.x reads them too.
    """
    processor_dir = Path(processor_dir)
    nested = processor_dir / "processor_config.json"
    image: dict = {}
    if (processor_dir / IMAGE_PROCESSOR_FILE).is_file():
        image = json.loads((processor_dir / IMAGE_PROCESSOR_FILE).read_text(encoding="utf-8"))
    if nested.is_file():
        data = json.loads(nested.read_text(encoding="utf-8"))
        image = {**data.pop("image_processor", {}), **image}
        data.pop("processor_class", None)
        if data:  # settings of the processor itself: keep them where transformers looks
            nested.write_text(_json_text({**data, "processor_class": "Qwen2VLProcessor"}), encoding="utf-8")
        else:
            nested.unlink()
    if not image:
        raise ValueError(f"{processor_dir} holds no image processor settings to lay out")
    size = image.get("size") or {}
    image.setdefault("min_pixels", size.get("shortest_edge"))
    image.setdefault("max_pixels", size.get("longest_edge"))
    image = {k: v for k, v in image.items() if v is not None}
    image.update(image_processor_type="Qwen2VLImageProcessor", processor_class="Qwen2VLProcessor")
    video = {k: image[k] for k in _SHARED_VISION_KEYS if k in image}
    video.update(_VIDEO_FRAMES, video_processor_type="Qwen2VLVideoProcessor", processor_class="Qwen2VLProcessor")
    (processor_dir / IMAGE_PROCESSOR_FILE).write_text(_json_text(image), encoding="utf-8")
    (processor_dir / VIDEO_PROCESSOR_FILE).write_text(_json_text(video), encoding="utf-8")


def _json_text(data: dict) -> str:
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def _text_encoder(tokenizer):
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    ids = tokenizer.convert_tokens_to_ids
    config = Qwen2_5_VLConfig(
        text_config={
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "vocab_size": len(tokenizer),
            "bos_token_id": ids("<|endoftext|>"),
            "eos_token_id": ids("<|im_end|>"),
            "pad_token_id": ids("<|endoftext|>"),
            "max_position_embeddings": 4096,
            "rope_parameters": {"mrope_section": [1, 1, 2], "rope_type": "default", "rope_theta": 1e6},
        },
        vision_config={
            "depth": 2,
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_heads": 2,
            "out_hidden_size": 16,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
        bos_token_id=ids("<|endoftext|>"),
        eos_token_id=ids("<|im_end|>"),
        pad_token_id=ids("<|endoftext|>"),
        image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
    )
    torch.manual_seed(1)
    return Qwen2_5_VLForConditionalGeneration(config).eval()


def _transformer(zero_cond_t: bool):
    from diffusers import QwenImageTransformer2DModel

    torch.manual_seed(2)
    return QwenImageTransformer2DModel(
        patch_size=2,
        in_channels=16,
        out_channels=4,
        num_layers=2,
        attention_head_dim=16,
        num_attention_heads=3,
        joint_attention_dim=16,
        axes_dims_rope=(8, 4, 4),
        zero_cond_t=zero_cond_t,
    ).eval()


def _vae():
    from diffusers import AutoencoderKLQwenImage

    torch.manual_seed(3)
    return AutoencoderKLQwenImage(
        base_dim=16,
        z_dim=4,
        dim_mult=[1, 2, 4, 4],
        num_res_blocks=1,
        temperal_downsample=[False, True, True],
        latents_mean=[0.0] * 4,
        latents_std=[1.0] * 4,
    ).eval()


@contextmanager
def _quiet_progress() -> Iterator[None]:
    """Silence transformers' shard-writing progress bar while saving (the build is instant)."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def build_tiny_qwen_edit(folder: Path, plus: bool) -> None:
    """Write a tiny random Qwen-Image-Edit (``plus=False``) or Edit-Plus/2511-like model to ``folder``.

    The Plus model sets ``zero_cond_t`` like Edit-2511, so that code path is covered too.
    """
    from diffusers import FlowMatchEulerDiscreteScheduler, QwenImageEditPipeline, QwenImageEditPlusPipeline

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = _tokenizer()
    cls = QwenImageEditPlusPipeline if plus else QwenImageEditPipeline
    pipe = cls(
        scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER_CONFIG),
        vae=_vae(),
        text_encoder=_text_encoder(tokenizer),
        tokenizer=tokenizer,
        processor=_processor(tokenizer),
        transformer=_transformer(zero_cond_t=plus),
    )
    with _quiet_progress():
        pipe.save_pretrained(str(folder), safe_serialization=True)
    write_processor_layout(folder / "processor")
    (folder / SETTINGS_FILE).write_text(json.dumps(TINY_SETTINGS, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def build_tiny_fp8_transformer(model_folder: Path, out_file: Path, form: str) -> None:
    """Re-pack ``model_folder``'s transformer as a transformer-only FP8 safetensors file.

    ``plain``: every 2-D weight cast to float8_e4m3fn, biases and norms kept bf16 (ComfyUI cast).
    ``scaled``: ComfyUI "scaled" form - fp8 codes with per-tensor (blocks) or per-output-channel
    (other Linears) ``weight_scale``, plus ``input_scale`` and ``comfy_quant`` tensors; a
    ``__index_timestep_zero__`` marker when the model uses ``zero_cond_t``.
    ``scaled-prefixed``: the scaled form with ComfyUI's ``model.diffusion_model.`` key prefix and
    the older ``scale_weight``/``scale_input`` names.
    """
    from safetensors.torch import save_file

    if form not in FP8_FORMS:
        raise ValueError(f"form must be one of {FP8_FORMS}, not {form!r}")
    state = load_component_state_dict(Path(model_folder) / "transformer")
    config = json.loads((Path(model_folder) / "transformer" / "config.json").read_text(encoding="utf-8"))
    fp8 = torch.float8_e4m3fn
    fp8_max = torch.finfo(fp8).max
    out: dict[str, torch.Tensor] = {}
    prefixed = form == "scaled-prefixed"
    scale_name, input_name = ("scale_weight", "scale_input") if prefixed else ("weight_scale", "input_scale")
    quant_info = torch.tensor(list(json.dumps({"format": "float8_e4m3fn"}).encode()), dtype=torch.uint8)
    for key in sorted(state):
        value = state[key].float()
        module = key.rsplit(".", 1)[0]
        if not (key.endswith(".weight") and value.ndim == 2):
            out[key] = value.to(torch.bfloat16)
            continue
        if form == "plain":
            out[key] = value.to(fp8)
            continue
        if module.startswith("transformer_blocks."):  # per-tensor scale
            scale = value.abs().amax().clamp(min=1e-12) / fp8_max
        else:  # per-output-channel scale, shape [out, 1]
            scale = value.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / fp8_max
        out[key] = (value / scale).to(fp8)
        out[f"{module}.{scale_name}"] = scale.to(torch.float32)
        out[f"{module}.{input_name}"] = torch.ones((), dtype=torch.float32)
        out[f"{module}.comfy_quant"] = quant_info.clone()
    if form != "plain" and config.get("zero_cond_t"):
        out["__index_timestep_zero__"] = torch.zeros(0)
    if prefixed:
        out = {f"model.diffusion_model.{k}": v for k, v in out.items()}
    out_file = Path(out_file)
    out_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_file.with_name(out_file.name + ".part")
    save_file(out, str(tmp), metadata={"format": "pt"})
    shutil.move(str(tmp), str(out_file))
