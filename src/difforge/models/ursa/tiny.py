"""``tiny-ursa``: a random, deterministic URSA checkpoint in the official folder layout.

Small enough to load and run 25 steps on a CPU in seconds, yet structurally real: dunder-style
``model_index.json``, a Qwen3-shaped transformer (head_dim 128 as the reference always builds it),
an IBQ ``AutoencoderVQ`` with stride 16 and attention blocks, a metric-path scheduler whose
``scheduler_model.pth`` is written by ``torch.save``, and a byte-level BPE tokenizer carrying Qwen's
26 special tokens in Qwen's order (pad = ``<|endoftext|>``, bov = ``<|vision_start|>``).

Same code -> same bytes: every tensor comes from a fixed-seed generator, JSON is written sorted, and
the one random field ``torch.save`` writes (``.data/serialization_id``) is replaced by a constant.
"""

from __future__ import annotations

import io
import json
import math
import zipfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from .config import URSATransformerConfig, VQConfig
from .transformer import URSATransformer
from .vae import AutoencoderVQ
from .vae_fsq import FSQ_LEVELS, AutoencoderVQCosmos3D, FSQConfig

QWEN_SPECIALS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>",
    "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
    "<tool_response>", "</tool_response>", "<think>", "</think>",
)
QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
#: A few merges so common words become single tokens (Ġ is the byte-level space).
MERGES = (
    ("Ġ", "a"), ("Ġ", "t"), ("h", "e"), ("i", "n"), ("o", "n"), ("e", "r"), ("a", "t"), ("r", "e"),
    ("Ġt", "he"), ("Ġ", "c"), ("Ġc", "at"), ("o", "g"), ("Ġ", "d"), ("Ġd", "og"), ("Ġ", "s"), ("u", "n"),
    ("Ġs", "un"), ("Ġ", "r"), ("e", "d"), ("Ġr", "ed"), ("Ġa", "n"), ("Ġ", "o"), ("Ġo", "n"), ("Ġ", "b"),
    ("l", "u"), ("Ġb", "lu"), ("Ġblu", "e"), ("Ġ", "h"), ("Ġh", "at"), ("in", "g"), ("Ġ", "m"), ("o", "u"),
)
CODEBOOK = 64
VAE_CHANNELS = (32, 32, 32, 32, 32)  # stride 16, like the real IBQ tokenizer
SEED = 20250101
VIDEO_VAE_CHANNELS = (16, 32, 32, 32)  # the FSQ320 VAE's 4-block layout, narrower
VIDEO_SEED = 20250102


def _byte_chars() -> list[str]:
    """The byte-level BPE alphabet in byte order (GPT-2's byte-to-unicode table, as Qwen uses)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    table = bytes_to_unicode()
    return [table[b] for b in range(256)]


def build_tokenizer() -> Tokenizer:
    return byte_level_bpe(list(MERGES))


def byte_level_bpe(merges: list[tuple[str, str]]) -> Tokenizer:
    """A Qwen-style byte-level BPE tokenizer (Qwen's split regex, NFC, the special tokens) with these
    merges: the tiny models' and the trained shapes models' share it."""
    vocab = {ch: i for i, ch in enumerate(_byte_chars())}
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in QWEN_SPECIALS])
    return tok


def _tokenizer_config(tok: Tokenizer) -> dict[str, Any]:
    decoder = {
        str(tok.token_to_id(s)): {
            "content": s, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False, "special": True
        }
        for s in QWEN_SPECIALS
    }
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": decoder,
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _init_(module: torch.nn.Module, gen: torch.Generator, out_gain: dict[str, float]) -> None:
    """Fan-in scaled normal weights; norms near 1; biases small.  ``out_gain`` scales named params."""
    for name, p in module.named_parameters():
        with torch.no_grad():
            if name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
            elif p.dim() == 1:  # RMSNorm / GroupNorm weight
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=gen))
            elif "embed" in name or "embedding" in name:
                p.copy_(torch.randn(p.shape, generator=gen))
            else:
                fan_in = math.prod(p.shape[1:])
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(fan_in))
            for key, gain in out_gain.items():
                if name.startswith(key):
                    p.mul_(gain)


def _torch_save_deterministic(obj: dict[str, torch.Tensor], path: Path) -> None:
    """``torch.save`` then pin its random ``serialization_id`` so the bytes repeat."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    with zipfile.ZipFile(buf) as src, zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            data = src.read(info.filename)
            if info.filename.endswith(".data/serialization_id"):
                data = b"0" * len(data)
            name = "scheduler_model/" + info.filename.split("/", 1)[1]
            dst.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), data)


def _tiny_transformer_config(tok: Tokenizer) -> URSATransformerConfig:
    lm_vocab = tok.get_vocab_size(with_added_tokens=True)
    return URSATransformerConfig(
        hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1,
        num_hidden_layers=2, max_window_layers=2, rope_theta=1000000, vocab_size=lm_vocab + CODEBOOK,
        lm_vocab_size=lm_vocab, lm_head_size=CODEBOOK, bov_token_id=tok.token_to_id("<|vision_start|>"),
    )


def _write_tokenizer_and_transformer(folder: Path, tok: Tokenizer, tcfg: URSATransformerConfig,
                                     gen: torch.Generator) -> None:
    (folder / "tokenizer").mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer" / "tokenizer.json").write_text(tok.to_str(pretty=True) + "\n", encoding="utf-8")
    _write_json(folder / "tokenizer" / "tokenizer_config.json", _tokenizer_config(tok))

    transformer = URSATransformer(tcfg)
    _init_(transformer, gen, {"lm_head": 4.0})
    (folder / "transformer").mkdir(exist_ok=True)
    t_config = {"_class_name": "URSATransformer3DModel", **tcfg.to_dict()}
    for key in ("head_dim", "rms_norm_eps"):  # the reference never reads them; don't pretend otherwise
        t_config.pop(key)
    _write_json(folder / "transformer" / "config.json", t_config)
    save_file({k: v.contiguous() for k, v in transformer.state_dict().items()},
              str(folder / "transformer" / "diffusion_pytorch_model.safetensors"), metadata={"format": "pt"})


def _write_scheduler_and_index(folder: Path, codebook: torch.Tensor, vae_class: str) -> None:
    _write_json(
        folder / "scheduler" / "scheduler_config.json",
        {"_class_name": "KineticOptimalScheduler", "alpha": 0.9, "c": 3.0, "eps": 1e-05, "shift": 1.0},
    )
    _torch_save_deterministic({"path.emb": codebook}, folder / "scheduler" / "scheduler_model.pth")
    _write_json(
        folder / "model_index.json",
        {
            "_class_name": "URSAPipeline",
            "scheduler": ["__scheduler__", "KineticOptimalScheduler"],
            "tokenizer": ["transformers", "Qwen2TokenizerFast"],
            "transformer": ["__transformer__", "URSATransformer3DModel"],
            "vae": ["__vae__", vae_class],
        },
    )


def build_tiny_ursa(folder: Path) -> None:
    """Write the tiny-ursa checkpoint into ``folder`` (created if needed)."""
    folder = Path(folder)
    tok = build_tokenizer()
    tcfg = _tiny_transformer_config(tok)
    vcfg = VQConfig(
        block_out_channels=VAE_CHANNELS, layers_per_block=1, latent_channels=4, num_vq_embeddings=CODEBOOK,
        vq_embed_dim=4, attn_down_block=True, attn_up_block=True, temporal_stride=1, spatial_stride=16,
    )
    gen = torch.Generator().manual_seed(SEED)
    _write_tokenizer_and_transformer(folder, tok, tcfg, gen)

    vae = AutoencoderVQ(vcfg)
    _init_(vae, gen, {"decoder.conv_out": 0.5})
    v_config = {"_class_name": "AutoencoderVQ", "_quantizer_name": "VQuantizer", **vcfg.__dict__}
    v_config["block_out_channels"] = list(vcfg.block_out_channels)
    _write_json(folder / "vae" / "config.json", v_config)
    save_file({k: v.contiguous() for k, v in vae.state_dict().items()},
              str(folder / "vae" / "diffusion_pytorch_model.safetensors"), metadata={"format": "pt"})

    _write_scheduler_and_index(folder, vae.quantizer.embedding.weight.detach().clone(), "AutoencoderVQ")


def build_tiny_ursa_video(folder: Path) -> None:
    """Write ``tiny-ursa-video``: tiny-ursa's tokenizer and transformer shape with an FSQ video VAE.

    The VAE has the real FSQ320 layout in miniature: 4 blocks, patch_size 2 (one Haar level, the
    up-blocks' resampler layout of the published checkpoints), strides 4 (time) and 8 (space), and
    ``sample_frames`` 9 so a 9-frame video (3 latent frames) is one decoder window.  The reference
    quantiser always uses levels (8,8,8,5,5,5); the checkpoint simply declares a 64-code vocabulary,
    i.e. codes whose last four digits are 0, so the folder is also loadable by the reference.  FSQ
    has no codebook weights, so the scheduler's distance embedding is the codes' dequantised
    vectors.
    """
    folder = Path(folder)
    tok = build_tokenizer()
    tcfg = _tiny_transformer_config(tok)
    vcfg = FSQConfig(
        block_out_channels=VIDEO_VAE_CHANNELS, layers_per_block=1, latent_channels=8, sample_frames=9,
        num_vq_embeddings=CODEBOOK, vq_embed_dim=len(FSQ_LEVELS), patch_size=2, temporal_stride=4,
        spatial_stride=8,
    )
    gen = torch.Generator().manual_seed(VIDEO_SEED)
    _write_tokenizer_and_transformer(folder, tok, tcfg, gen)

    vae = AutoencoderVQCosmos3D(vcfg)
    _init_(vae, gen, {"decoder.conv_out": 0.5})
    v_config: dict[str, Any] = {"_class_name": "AutoencoderVQCosmos3D", "_quantizer_name": "FSQuantizer"}
    v_config.update({k: v for k, v in vcfg.__dict__.items() if k not in ("levels", "decoder_dtype")})
    v_config.update(block_out_channels=list(vcfg.block_out_channels), norm_num_groups=1, act_fn="silu")
    _write_json(folder / "vae" / "config.json", v_config)
    save_file({k: v.contiguous() for k, v in vae.state_dict().items()},
              str(folder / "vae" / "diffusion_pytorch_model.safetensors"), metadata={"format": "pt"})

    codebook = vae.quantizer.dequantize(torch.arange(CODEBOOK), torch.float32)
    _write_scheduler_and_index(folder, codebook, "AutoencoderVQCosmos3D")
