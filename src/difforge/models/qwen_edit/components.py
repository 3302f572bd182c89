"""Per-component inputs, runs and FLOP counts of a loaded edit pipeline, for validation.

Validation compares each component (text encoder, transformer, VAE encode/decode) between a device
and the CPU reference on identical inputs, and divides measured step times by FLOPs.  The inputs
here are deterministic (seeded CPU generator, synthetic gradient image) and sized like a real run
of the given RunConfig, so the comparison exercises realistic token counts.
"""

from __future__ import annotations

from math import prod
from typing import TYPE_CHECKING, Any

import numpy as np
import PIL.Image
import torch
from torch import Tensor

from ...config import RunConfig
from ...errors import DifforgeError
from .pipeline import DROPPED_PROMPT_TOKENS
from .references import fit_area

if TYPE_CHECKING:
    from .pipeline import QwenEditPipeline

COMPONENTS = ("text_encoder", "transformer", "vae_encode", "vae_decode")
#: Text length used for the transformer's synthetic prompt states (a short Plus prompt is ~230).
SYNTHETIC_TEXT_TOKENS = 64


def gradient_image(width: int, height: int) -> PIL.Image.Image:
    """A deterministic RGB test card: horizontal/vertical ramps and their mix."""
    x = np.linspace(0, 255, width, dtype=np.float32)[None, :].repeat(height, 0)
    y = np.linspace(0, 255, height, dtype=np.float32)[:, None].repeat(width, 1)
    rgb = np.stack([x, y, (x + y) / 2], axis=-1).astype(np.uint8)
    return PIL.Image.fromarray(rgb, "RGB")


def _output_size(qe: QwenEditPipeline, cfg: RunConfig) -> tuple[int, int]:
    width, height = fit_area(qe.settings.output_area, 1.0)
    return (cfg.height or height), (cfg.width or width)


def _prompt_text(qe: QwenEditPipeline, prompt: str, n_images: int) -> str:
    pipe = qe.pipe
    if qe.plus:
        prompt = "".join(f"Picture {k + 1}: <|vision_start|><|image_pad|><|vision_end|>" for k in range(n_images)) + prompt
    return pipe.prompt_template_encode.format(prompt)


def component_inputs(qe: QwenEditPipeline, cfg: RunConfig) -> dict[str, dict[str, Tensor]]:
    pipe = qe.pipe
    gen = torch.Generator("cpu").manual_seed(int(cfg.seed))
    height, width = _output_size(qe, cfg)
    ref_w, ref_h = fit_area(qe.settings.reference_area, width / height)
    card = gradient_image(width, height)
    refs = qe._references([card])
    prompt_images = refs.prompt_images if isinstance(refs.prompt_images, list) else [refs.prompt_images]
    text = pipe.processor(
        text=[_prompt_text(qe, cfg.prompt, len(prompt_images))], images=prompt_images, padding=True, return_tensors="pt"
    )
    f = pipe.vae_scale_factor
    z = pipe.vae.config.z_dim
    cfg_t = pipe.transformer.config
    out_tokens = (height // (2 * f)) * (width // (2 * f))
    ref_tokens = (ref_h // (2 * f)) * (ref_w // (2 * f))
    return {
        "text_encoder": {k: text[k] for k in ("input_ids", "attention_mask", "pixel_values", "image_grid_thw")},
        "transformer": {
            "hidden_states": torch.randn(1, out_tokens + ref_tokens, cfg_t.in_channels, generator=gen),
            "encoder_hidden_states": torch.randn(1, SYNTHETIC_TEXT_TOKENS, cfg_t.joint_attention_dim, generator=gen),
            "timestep": torch.tensor([0.5]),
            "img_shapes": torch.tensor([[1, height // (2 * f), width // (2 * f)], [1, ref_h // (2 * f), ref_w // (2 * f)]]),
        },
        "vae_encode": {"sample": torch.rand(1, 3, 1, ref_h, ref_w, generator=gen) * 2 - 1},
        "vae_decode": {"latents": torch.randn(1, z, 1, height // f, width // f, generator=gen)},
    }


def _to(t: Tensor, device: torch.device, dtype: torch.dtype) -> Tensor:
    return t.to(device, dtype) if t.is_floating_point() else t.to(device)


@torch.inference_mode()
def run_component(qe: QwenEditPipeline, name: str, inputs: dict[str, Tensor]) -> Tensor:
    pipe, device, dtype = qe.pipe, qe.device, qe.dtype
    x = {k: _to(v, device, dtype) for k, v in inputs.items()}
    if name == "text_encoder":
        out = pipe.text_encoder(**x, output_hidden_states=True).hidden_states[-1]
    elif name == "transformer":
        shapes = [tuple(int(v) for v in row) for row in inputs["img_shapes"].tolist()]
        out = pipe.transformer(
            hidden_states=x["hidden_states"],
            encoder_hidden_states=x["encoder_hidden_states"],
            timestep=x["timestep"],
            img_shapes=[shapes],
            return_dict=False,
        )[0]
    elif name == "vae_encode":
        out = pipe.vae.encode(x["sample"]).latent_dist.mode()
    elif name == "vae_decode":
        out = pipe.vae.decode(x["latents"], return_dict=False)[0]
    else:
        raise DifforgeError(f"Unknown component '{name}'; use one of {', '.join(COMPONENTS)}.")
    return out.detach().to("cpu", torch.float32)


def _text_lengths(qe: QwenEditPipeline, cfg: RunConfig) -> tuple[list[list[tuple[int, int, int]]], int, int]:
    """(img_shapes, prompt tokens, negative-prompt tokens) without running any model.

    Uses the run's prepared state when it exists, else the tokenizer and image processor on
    ``cfg.images`` (the text length depends on the references' sizes).
    """
    prepared = qe._prepared
    if prepared is not None and prepared.key == cfg.fingerprint():
        neg = prepared.negative_embeds.shape[1] if prepared.negative_embeds is not None else 0
        return prepared.img_shapes, int(prepared.prompt_embeds.shape[1]), int(neg)
    from .pipeline import _open_images

    images = _open_images(cfg, qe.plus)
    height, width = qe._size(cfg, images)
    refs = qe._references(images)
    prompt_images = refs.prompt_images if isinstance(refs.prompt_images, list) else [refs.prompt_images]

    def length(prompt: str) -> int:
        ids = qe.pipe.processor(text=[_prompt_text(qe, prompt, len(prompt_images))], images=prompt_images,
                                return_tensors="pt")["input_ids"]
        return int(ids.shape[1]) - DROPPED_PROMPT_TOKENS

    f = qe.pipe.vae_scale_factor * 2
    shapes = [[(1, height // f, width // f), *[(1, h // f, w // f) for w, h in refs.vae_sizes]]]
    negative = qe._negative_prompt(cfg)
    return shapes, length(cfg.prompt), (length(negative) if negative is not None else 0)


def count_forward_flops(config: dict[str, Any], img_shapes: list[list[tuple[int, int, int]]], text_tokens: int) -> int:
    """FLOPs of one batch-1 transformer forward, counted on a meta-device copy (no compute, no memory).

    ``FlopCounterMode`` sees every matmul and, on meta tensors, the joint attention too (the CPU
    SDPA kernel is invisible to it in a real run).  Used by :func:`flops_per_step` and the benchmark.
    """
    from diffusers import QwenImageTransformer2DModel
    from torch.utils.flop_counter import FlopCounterMode

    meta = torch.device("meta")
    with meta:
        model = QwenImageTransformer2DModel.from_config(config)  # FLOPs do not depend on the dtype
    image_tokens = sum(prod(s) for s in img_shapes[0])
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        model(
            hidden_states=torch.empty(1, image_tokens, config["in_channels"], device=meta),
            encoder_hidden_states=torch.empty(1, text_tokens, config["joint_attention_dim"], device=meta),
            timestep=torch.zeros(1, device=meta),
            img_shapes=img_shapes,
            return_dict=False,
        )
    return int(counter.get_total_flops())


def flops_per_step(qe: QwenEditPipeline, cfg: RunConfig) -> dict[str, Any]:
    """Model FLOPs of one denoising step, counted by ``torch.utils.flop_counter.FlopCounterMode``.

    These are the FLOPs of the computation itself: one unpadded batch-1 forward per branch, as
    diffusers runs them.  With batched CFG the executed work adds the shorter text's padding rows
    (``padded_tokens_per_row``); MFU is quoted on the model FLOPs.

    The count runs the real transformer architecture (this pipeline's config) on the meta device
    with the run's exact token counts, so it costs no compute and no memory, and includes
    attention, projections, MLPs and modulation exactly as executed.
    """
    shapes, text, negative = _text_lengths(qe, cfg)
    config = {k: v for k, v in qe.pipe.transformer.config.items() if not k.startswith("_")}
    image_tokens = sum(prod(s) for s in shapes[0])
    lengths = [text] + ([negative] if negative else [])
    total = sum(count_forward_flops(config, shapes, n) for n in lengths)
    batched = len(lengths) == 2 and qe.denoiser(cfg).batched_cfg
    return {
        "forwards_per_step": len(lengths),
        # What actually executes: one batch-2 call with the shorter text padded, or the two calls.
        "transformer_calls_per_step": 1 if batched else len(lengths),
        "batch_per_call": 2 if batched else 1,
        "padded_tokens_per_row": image_tokens + max(lengths) if batched else None,
        "tokens_per_forward": image_tokens + text,
        "image_tokens": image_tokens,
        "text_tokens": text,
        "negative_text_tokens": negative,
        "flops_per_step": total,
        "method": "torch.utils.flop_counter.FlopCounterMode on a meta-device copy of the transformer",
    }
