"""The parts of ``shapes-qwen-edit`` before training: tokenizer, text encoder, VAE, transformer, scheduler.

Every part is a real Qwen-Image-Edit component class (the ones :mod:`difforge.models.qwen_edit.folder`
accepts), configured small.  Three choices differ from the random-weight ``tiny-qwen-edit`` and why:

* **tokenizer**: a byte-level BPE (the real Qwen tokenizer's pre-tokenizer and byte alphabet) whose
  merges are learnt from the pipeline's system prompt and every instruction the shapes world can
  write.  Like the real Qwen vocabulary it spells each word as one token, so the template's system
  part is exactly the 64 tokens diffusers drops (``prompt_template_encode_start_idx``) and the
  transformer reads ~17 text tokens instead of ~300 bytes.
* **VAE**: the real layout with two down-sampling stages instead of three (``dim_mult`` 1-2-2, 4x),
  ``base_dim`` 16 and ``z_dim`` 8, so a 64 px picture is a 16x16x8 latent (8x8 packed tokens): each
  token covers 8 x 8 px of the world's 14-24 px shapes (the first recipe's 8x layout had 4x4 tokens
  of 16 px each and did not learn to draw them in its budget), and 64 tokens are still cheap for the
  MMDiT on a CPU.  ``temperal_downsample`` [False, True] as the real one's first stages, so
  ``vae_scale_factor`` (2 ** its length) is 4.
* **MMDiT**: 4 layers of 2 heads x 32 (hidden 64): head_dim 32 gives the rotary embedding 8 dims per
  spatial axis (frequencies 1, 0.1, 0.01, 0.001), enough to tell the 8 token rows / columns apart;
  with 16 (4 per axis: frequencies 1 and 0.01) an offset of 6 rows rotates by cos 6 = 0.96, almost
  like no offset.

The text encoder is the tiny Qwen2.5-VL of ``tiny-qwen-edit`` (same seeded random init, frozen): its
random features still separate the instructions once each word is a token.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import torch

from difforge.models.qwen_edit.tiny import SCHEDULER_CONFIG, _processor, _text_encoder, qwen_tokenizer
from difforge.shapes.world import BACKGROUNDS, COLOURS, POSITIONS, SHAPES

#: diffusers' ``QwenImageEditPipeline.prompt_template_encode``; the recipe asserts the built pipeline
#: has the same, so a diffusers upgrade that changes it fails loudly instead of training on stale text.
TEMPLATE = (
    "<|im_start|>system\nDescribe the key features of the input image (color, shape, size, texture, objects,"
    " background), then explain how the user's text instruction should alter or modify the image. Generate a"
    " new image that meets the user's requirements while maintaining consistency with the original input where"
    " appropriate.<|im_end|>\n<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>{}<|im_end|>\n"
    "<|im_start|>assistant\n"
)
_TEMPLATE_HEAD = "<|im_start|>system\n"


@dataclass(frozen=True)
class Arch:
    """Sizes of the trained parts (the recipe's architecture hyper-parameters)."""

    vae_base_dim: int = 16
    vae_dim_mult: tuple[int, ...] = (1, 2, 2)
    z_dim: int = 8
    layers: int = 4
    heads: int = 2
    head_dim: int = 32

    def to_json(self) -> dict:
        return asdict(self)


def template() -> str:
    """The Qwen-Image-Edit prompt template (``{}`` is the instruction), as the installed diffusers has it."""
    return TEMPLATE


def all_instructions() -> list[str]:
    """Every instruction the shapes world can write (the world's templates, in a fixed order)."""
    out = [f"make the {s} {c}" for s in SHAPES for c in COLOURS]
    out += [f"make the background {c}" for c in BACKGROUNDS]
    out += [f"move the {s} to the {p}" for s in SHAPES for p in POSITIONS]
    out += [f"add a {c} {s}" for c in COLOURS for s in SHAPES]
    out += [f"remove the {s}" for s in SHAPES]
    out += [f"turn the {a} into a {b}" for a in SHAPES for b in SHAPES if a != b]
    return out


def build_tokenizer():
    """A Qwen2Tokenizer: byte alphabet (ids 0..255 as in ``tiny-qwen-edit``), BPE merges learnt on the
    template's fixed text and every world instruction, then the Qwen special tokens."""
    from tokenizers import Tokenizer, models, trainers
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    from difforge.models.qwen_edit.tiny import _tokenizer

    byte_table = bytes_to_unicode()
    text = template()
    system = text[len(_TEMPLATE_HEAD) : text.index("<|im_end|>")]
    corpus = ["system\n" + system, "user\n", "assistant\n", " ", *all_instructions()]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = _tokenizer().backend_tokenizer.pre_tokenizer  # the real Qwen split + byte level
    trainer = trainers.BpeTrainer(
        vocab_size=4096, min_frequency=1, initial_alphabet=[byte_table[b] for b in range(256)], show_progress=False
    )
    bpe.train_from_iterator(corpus, trainer)
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in json.loads(bpe.to_str())["model"]["merges"]]
    return qwen_tokenizer(merges)


def check_tokenizer(tok) -> None:
    """The template's system part must be exactly the 64 tokens diffusers drops, and every world word
    one token (raises AssertionError otherwise: the recipe's premise broke)."""
    text = template().format("make the circle green")
    toks = tok.convert_ids_to_tokens(tok(text)["input_ids"])
    start = toks.index("<|vision_start|>")
    assert start == 64, f"the system prompt is {start} tokens, not the 64 diffusers drops"
    for instruction in all_instructions():
        pieces = tok.tokenize(instruction)
        assert len(pieces) == len(instruction.split()), f"{instruction!r} tokenizes as {pieces}"


def build_text_encoder(tok):
    """The tiny Qwen2.5-VL of ``tiny-qwen-edit`` (seed 1) sized to this vocabulary; frozen."""
    enc = _text_encoder(tok)
    enc.requires_grad_(False)
    return enc


def build_processor(tok):
    return _processor(tok)


def build_vae(arch: Arch, seed: int):
    from diffusers import AutoencoderKLQwenImage

    torch.manual_seed(seed)
    downs = len(arch.vae_dim_mult) - 1
    return AutoencoderKLQwenImage(
        base_dim=arch.vae_base_dim,
        z_dim=arch.z_dim,
        dim_mult=list(arch.vae_dim_mult),
        num_res_blocks=1,
        temperal_downsample=[False] + [True] * (downs - 1),
        latents_mean=[0.0] * arch.z_dim,
        latents_std=[1.0] * arch.z_dim,
    )


def build_transformer(arch: Arch, seed: int):
    from diffusers import QwenImageTransformer2DModel

    torch.manual_seed(seed)
    quarter = arch.head_dim // 4
    return QwenImageTransformer2DModel(
        patch_size=2,
        in_channels=4 * arch.z_dim,
        out_channels=arch.z_dim,
        num_layers=arch.layers,
        attention_head_dim=arch.head_dim,
        num_attention_heads=arch.heads,
        joint_attention_dim=16,  # the tiny text encoder's hidden size
        axes_dims_rope=(arch.head_dim - 2 * quarter, quarter, quarter),
        zero_cond_t=False,
    )


def build_scheduler():
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(**SCHEDULER_CONFIG)
