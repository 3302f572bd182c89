"""The seeded recipe that trains ``shapes-ursa``: a VQ image tokenizer and an URSA transformer on the shapes world.

``python -m difforge.training.shapes_ursa --out DIR [--steps N] [--seed S] [--threads T]`` (``make
train-shapes``) runs every stage and writes DIR in the real URSA layout (``model_index.json``, the
configs, ``tokenizer/tokenizer.json``, safetensors weights and ``scheduler/scheduler_model.pth``), so
:mod:`difforge.models.ursa.loader` reads it unchanged.  The stages (docs/shapes-training.md has the
numbers):

1. **data** - one-item scenes of the world's *train* split, their captions and 64 x 64 renders;
2. **VQ codebook** - each cell of the 16 x 16 latent grid is coded by its colour and the signed distance
   from its centre to the shape's outline, 54 codes (:mod:`.ursa_data`);
3. **VQ decoder** - difforge's :class:`~difforge.models.ursa.vae.AutoencoderVQ` (stride 4) learns to
   paint a code grid (L1 on the picture the codes stand for); its encoder then learns to read the
   codes back from renders (cross-entropy on the dot-product logits ``encode`` takes the argmax of);
4. **transformer** - difforge's :class:`~difforge.models.ursa.transformer.URSATransformer` learns the
   discrete flow-matching objective of the scheduler's metric path: ``t = 0.999 u`` (shift 1), tokens
   ``x_t ~ softmax(-beta(t) D(E[x1], E))`` with ``beta(t) = c (t / (1 - t))^alpha`` over the normalised
   codebook (what ``KineticOptimalScheduler.add_noise`` draws), and cross-entropy of ``x1`` on the rows
   the sampler reads (bov .. second-to-last image token, each row predicting the next image token).
   The caption goes through the same tokenizer and 320-slot left-padded text the pipeline builds;
   10 % of captions are dropped to the empty prompt (all pads), which is the unconditional half of
   classifier-free guidance.  To save compute the first steps keep only a random subset of the
   pad slots (at their true rotary positions); the last ``full_text_fraction`` of the steps sees all 320;
5. **write** - into a temporary sibling folder, renamed over DIR at the end;
6. **evaluate** - the 40 held-out captions through the normal engine at float32 with the default
   steps and guidance, each scored by the rule-based checker.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from ..models.checkpoint import SETTINGS_FILE
from ..models.ursa.config import URSATransformerConfig, VQConfig
from ..models.ursa.rope import positions
from ..models.ursa.tiny import (
    _tokenizer_config,
    _write_json,
    _write_scheduler_and_index,
)
from ..models.ursa.transformer import URSATransformer
from ..models.ursa.vae import AutoencoderVQ, to_uint8
from ..shapes.world import Scene
from . import ursa_data as data_mod
from .loop import optimiser_step
from .ursa_text import build_tokenizer

TEXT_SLOTS = 320  # the pipeline's max_length
CAPTION_TOKENS = 7  # "a <colour> <shape> on a <colour> background" with one token per word
ALPHA, C = 0.9, 3.0  # the metric path (scheduler_config.json)


@dataclass(frozen=True)
class Recipe:
    """Every number of the recipe (the defaults are the committed model's)."""

    seed: int = 0
    images: int = 4000  # placed train-split scenes (the VQ decoder's and encoder's dataset)
    item_size: int = 24  # the transformer's scenes: one centred item of this size per train combination
    vae_channels: tuple[int, ...] = (64, 64, 64)  # stride 4; 2 channels per GroupNorm group (1 would erase flat colours)
    latent_channels: int = 32
    vae_steps: int = 1000
    vae_batch: int = 8
    vae_crop: int = 8  # decoder steps paint an 8 x 8-cell crop (32 x 32 px) holding the item ...
    vae_full_fraction: float = 0.1  # ... except the last tenth, which paints whole 64 x 64 pictures
    vae_shape_weight: float = 9.0  # extra L1 weight near the shape (see _shape_weight)
    vae_lr: float = 3e-3
    encoder_steps: int = 40
    encoder_batch: int = 4
    hidden: int = 96
    intermediate: int = 192
    layers: int = 3
    rope_theta: float = 10000.0
    steps: int = 2500
    batch: int = 16
    lr: float = 3e-3
    warmup: int = 20
    sparse_pads: int = 8  # pad slots kept (at random true positions) before the full-text steps
    full_text_fraction: float = 0.07
    bg_rows: int = 256  # background rows scored per sample (every other image row is; weighted to the mean)
    drop_caption: float = 0.1
    shape_row_weight: float = 2.0  # loss weight of rows whose target is a shape code (outlines decide the shape)
    weight_decay: float = 0.01


Log = Callable[[str], None]


def say(message: str) -> None:
    """The default log: print at once (progress shows when stdout is a file)."""
    print(message, flush=True)


def _lr(step: int, total: int, base: float, warmup: int) -> float:
    if step < warmup:
        return base * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return base * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


# ---- the VQ tokenizer --------------------------------------------------------------------------------
def vq_config(recipe: Recipe) -> VQConfig:
    return VQConfig(
        block_out_channels=recipe.vae_channels, layers_per_block=1, latent_channels=recipe.latent_channels,
        num_vq_embeddings=data_mod.CODEBOOK, vq_embed_dim=2 * data_mod.N_COLOURS + 1,
        attn_down_block=False, attn_up_block=False, temporal_stride=1, spatial_stride=data_mod.CELL,
    )


def _to_unit(images: np.ndarray) -> torch.Tensor:
    """uint8 ``[B, H, W, 3]`` -> float ``[B, 3, H, W]`` in [-1, 1]."""
    return torch.from_numpy(images).permute(0, 3, 1, 2).float().div(127.5).sub(1)


def _crop_origin(scene: Scene, crop: int, grid: int, gen: torch.Generator) -> tuple[int, int]:
    """A random ``crop`` x ``crop``-cell window (row, column of its corner) that holds the scene's item
    with, where the grid allows, a ring of background cells around it: a random crop of a 64 px
    picture often holds no shape at all, and those steps teach the decoder nothing about outlines."""
    left, top, right, bottom = scene.items[0].box()
    cell = data_mod.CELL

    def pick(first: int, last: int) -> int:
        lo = min(max(0, last - crop + 2), grid - crop)
        hi = max(min(grid - crop, first - 1), lo)
        return int(torch.randint(lo, hi + 1, (1,), generator=gen))

    return pick(top // cell, (bottom - 1) // cell), pick(left // cell, (right - 1) // cell)


def _shape_weight(pictures: np.ndarray, extra: float) -> torch.Tensor:
    """``[B, 1, H, W]`` loss weights of whole pictures: 1, plus ``extra`` on pixels within 3 px of a
    pixel unlike the picture's corner (the world keeps items off the corners, so that is background).  The shape covers about 8 % of a picture, so a plain L1 is
    mostly background and the first decoder learnt to paint no shapes at all (5 % read back)."""
    fg = torch.from_numpy(~(pictures == pictures[:, :1, :1]).all(-1)).float()[:, None]
    return 1 + extra * F.max_pool2d(fg, 7, 1, 3)


def train_vq(recipe: Recipe, codes: np.ndarray, images: np.ndarray, scenes_: list[Scene], log: Log,
             gen: torch.Generator) -> tuple[AutoencoderVQ, list[float], list[float]]:
    """The VQ autoencoder: fixed codebook (the code vectors), decoder trained to paint codes, encoder to read them."""
    cfg = vq_config(recipe)
    vae = AutoencoderVQ(cfg)
    with torch.no_grad():
        vae.quantizer.embedding.weight.copy_(torch.from_numpy(data_mod.code_features()))
    vae.quantizer.embedding.weight.requires_grad_(False)
    dec_params = [*vae.decoder.parameters(), *vae.post_quant_conv.parameters()]
    opt = torch.optim.AdamW(dec_params, lr=recipe.vae_lr, weight_decay=0.0)
    dec_losses: list[float] = []
    t0 = time.perf_counter()
    n, grid = len(codes), codes.shape[1]
    pictures = np.stack([data_mod.render_codes(c) for c in codes])  # what each grid stands for
    weights = _shape_weight(pictures, recipe.vae_shape_weight)
    full_from = recipe.vae_steps - int(round(recipe.vae_full_fraction * recipe.vae_steps))
    cell = data_mod.CELL
    for step in range(recipe.vae_steps):
        idx = torch.randint(0, n, (recipe.vae_batch,), generator=gen).numpy()
        crop = grid if step >= full_from else recipe.vae_crop
        ids_rows, targets, weight_rows = [], [], []
        for i in idx:
            r0, c0 = _crop_origin(scenes_[i], crop, grid, gen)
            ys, xs = slice(r0 * cell, (r0 + crop) * cell), slice(c0 * cell, (c0 + crop) * cell)
            ids_rows.append(codes[i][r0 : r0 + crop, c0 : c0 + crop])
            # the target is cut from the whole grid's picture (its background is the whole grid's)
            targets.append(pictures[i][ys, xs])
            weight_rows.append(weights[i][:, ys, xs])
        target = _to_unit(np.stack(targets))
        weight = torch.stack(weight_rows)
        ids = torch.from_numpy(np.stack(ids_rows)).unsqueeze(1)  # [B, 1, h, w]
        for group in opt.param_groups:
            group["lr"] = _lr(step, recipe.vae_steps, recipe.vae_lr, 20)
        loss = ((vae.decode(ids) - target).abs() * weight).mean() / weight.mean()
        dec_losses.append(optimiser_step(opt, loss))
        if step % 50 == 0 or step == recipe.vae_steps - 1:
            log(f"  vq decoder step {step:4d}  L1 {np.mean(dec_losses[-50:]):.4f}  {time.perf_counter() - t0:6.1f}s")
    enc_params = [*vae.encoder.parameters(), *vae.quant_conv.parameters()]
    opt = torch.optim.AdamW(enc_params, lr=recipe.vae_lr, weight_decay=0.0)
    emb = vae.quantizer.embedding.weight
    enc_losses: list[float] = []
    for step in range(recipe.encoder_steps):
        idx = torch.randint(0, n, (recipe.encoder_batch,), generator=gen).numpy()
        z = vae.quant_conv(vae.encoder(_to_unit(images[idx])))  # [B, D, h, w]
        logits = torch.einsum("bdhw,kd->bhwk", z, emb)
        for group in opt.param_groups:
            group["lr"] = _lr(step, recipe.encoder_steps, recipe.vae_lr, 10)
        loss = F.cross_entropy(logits.flatten(0, 2), torch.from_numpy(codes[idx]).flatten())
        enc_losses.append(optimiser_step(opt, loss))
    if recipe.encoder_steps:
        log(f"  vq encoder {recipe.encoder_steps} steps  CE {np.mean(enc_losses[-20:]):.4f}")
    vae.requires_grad_(False).eval()
    return vae, dec_losses, enc_losses


def decoder_accuracy(vae: AutoencoderVQ, n: int = 40) -> float:
    """Share of ``n`` held-out scenes whose true codes the decoder paints so the checker reads them back."""
    from ..shapes.checker import score_caption
    from ..shapes.world import scenes

    ok = 0
    with torch.no_grad():
        for scene in scenes(0, n, split="heldout"):
            ids = torch.from_numpy(data_mod.encode_scene(scene))[None, None]
            ok += score_caption(to_uint8(vae.decode(ids))[0].numpy(), scene).correct
    return ok / n


# ---- the transformer ---------------------------------------------------------------------------------
def transformer_config(recipe: Recipe, lm_vocab: int, bov: int) -> URSATransformerConfig:
    k = data_mod.CODEBOOK
    return URSATransformerConfig(
        hidden_size=recipe.hidden, intermediate_size=recipe.intermediate, num_attention_heads=1,
        num_key_value_heads=1, num_hidden_layers=recipe.layers, max_window_layers=recipe.layers,
        rope_theta=recipe.rope_theta, vocab_size=lm_vocab + k, lm_vocab_size=lm_vocab, lm_head_size=k,
        bov_token_id=bov,
    )


def _init_transformer(model: URSATransformer, gen: torch.Generator) -> None:
    """GPT-style init: N(0, 0.02) everywhere, residual outputs scaled by 1/sqrt(2 layers), norms 1."""
    scale = 1 / math.sqrt(2 * model.config.num_hidden_layers)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.fill_(1.0)
                continue
            p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                p.mul_(scale)


class MetricNoise:
    """``KineticOptimalScheduler.add_noise`` on the metric path, batched over per-sample times (float32)."""

    def __init__(self, codebook: torch.Tensor, alpha: float = ALPHA, c: float = C, eps: float = 1e-5) -> None:
        e = F.normalize(codebook.float(), dim=-1, eps=eps)
        sq = e.square().sum(-1)
        self.dist = (sq[:, None] + sq[None, :] - 2 * e @ e.T).clamp_min_(0)  # [K, K]
        self.alpha, self.c = alpha, c

    def beta(self, t: torch.Tensor) -> torch.Tensor:
        return self.c * (t / (1 - t)) ** self.alpha

    def __call__(self, x1: torch.Tensor, t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        logits = self.dist[x1].mul_(-self.beta(t)[:, None, None])  # [B, N, K]
        return logits.softmax(-1).flatten(0, 1).multinomial(1, generator=gen).view(x1.shape)


@dataclass
class TextBatch:
    """Caption ids ``[N, 7]`` of the dataset and the two special ids."""

    ids: torch.Tensor
    pad: int
    bov: int


def encode_captions(captions: list[str], tok: Any) -> torch.Tensor:
    rows = [tok.encode(c, add_special_tokens=False).ids for c in captions]
    if any(len(r) != CAPTION_TOKENS for r in rows):
        raise ValueError("a world caption did not encode to 7 tokens")
    return torch.tensor(rows, dtype=torch.int64)


def train_transformer(recipe: Recipe, codes: np.ndarray, text: TextBatch, codebook: torch.Tensor, lm_vocab: int,
                      log: Log, gen: torch.Generator, steps: int | None = None) -> tuple[URSATransformer, list[float]]:
    """Discrete flow matching on the metric path (see the module docstring); returns the model and per-step losses."""
    steps = recipe.steps if steps is None else steps
    cfg = transformer_config(recipe, lm_vocab, text.bov)
    model = URSATransformer(cfg)
    _init_transformer(model, gen)
    model.train()
    decay = [p for n, p in model.named_parameters() if p.dim() > 1]
    rest = [p for n, p in model.named_parameters() if p.dim() <= 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": recipe.weight_decay}, {"params": rest, "weight_decay": 0.0}],
                            lr=recipe.lr, betas=(0.9, 0.98))
    noise = MetricNoise(codebook)
    x_all = torch.from_numpy(codes.reshape(len(codes), -1))
    n, n_img = x_all.shape
    grid = int(math.isqrt(n_img))
    full_pos = positions((1, grid, grid), TEXT_SLOTS)  # [320 + 1 + n_img, 3]
    caption_slots = torch.arange(TEXT_SLOTS - CAPTION_TOKENS, TEXT_SLOTS)
    pad_slots = torch.arange(TEXT_SLOTS - CAPTION_TOKENS)
    tail = torch.arange(TEXT_SLOTS, TEXT_SLOTS + 1 + n_img)
    full_from = steps - int(round(recipe.full_text_fraction * steps))
    losses: list[float] = []
    t0 = time.perf_counter()
    for step in range(steps):
        idx = torch.randint(0, n, (recipe.batch,), generator=gen)
        x1 = x_all[idx]
        t = torch.rand(recipe.batch, generator=gen) * 0.999
        xt = noise(x1, t, gen)
        cap = text.ids[idx].clone()
        drop = torch.rand(recipe.batch, generator=gen) < recipe.drop_caption
        cap[drop] = text.pad
        if step >= full_from:
            kept = pad_slots
        else:
            kept = pad_slots[torch.randperm(len(pad_slots), generator=gen)[: recipe.sparse_pads]].sort().values
        slots = torch.cat([kept, caption_slots, tail])
        pos = full_pos[slots]
        text_len = len(kept) + CAPTION_TOKENS
        ids = torch.cat([
            torch.full((recipe.batch, len(kept)), text.pad, dtype=torch.int64),
            cap,
            torch.full((recipe.batch, 1), text.bov, dtype=torch.int64),
            xt + lm_vocab,
        ], 1)
        for group in opt.param_groups:
            group["lr"] = _lr(step, steps, recipe.lr, recipe.warmup)
        h = model.hidden_states(ids, pos)[:, text_len : text_len + n_img]  # row bov+j predicts image token j
        rows, weight = _scored_rows(x1, recipe.bg_rows, gen)
        logits = model.lm_head(h.flatten(0, 1)[rows])
        target = x1.flatten()[rows]
        weight = torch.where(target >= data_mod.N_COLOURS, weight * recipe.shape_row_weight, weight)
        loss = (F.cross_entropy(logits, target, reduction="none") * weight).sum() / weight.sum()
        losses.append(optimiser_step(opt, loss, model.parameters(), clip=1.0))
        if step % 25 == 0 or step == steps - 1:
            phase = "full text" if step >= full_from else f"{len(kept)} pads"
            log(f"  transformer step {step:4d}/{steps}  loss {np.mean(losses[-25:]):.4f}  ({phase})"
                f"  {time.perf_counter() - t0:6.1f}s")
    model.eval().requires_grad_(False)
    return model, losses


def _scored_rows(x1: torch.Tensor, bg_rows: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat indices of the image rows the loss reads, and their weights: every row whose target is not
    the picture's background code, and ``bg_rows`` random background rows per sample weighted up to
    stand for all of them, so the loss stays the mean.  (Written when the codebook had 3078 codes and
    lm_head was most of a step; over shapes-ursa's 54 codes it saves little, but the committed weights
    were trained with it, so it stays part of the recipe.)"""
    b, n = x1.shape
    is_bg = x1 < data_mod.N_COLOURS
    score = torch.rand((b, n), generator=gen).masked_fill_(~is_bg, -1.0)
    k = min(bg_rows, n)
    picked = torch.zeros_like(is_bg)
    picked.scatter_(1, score.topk(k, 1).indices, True)
    picked &= is_bg
    keep = ~is_bg | picked
    n_bg = is_bg.sum(1, keepdim=True).float()
    weight = torch.where(is_bg, n_bg / picked.sum(1, keepdim=True).clamp_min(1).float(), torch.ones(b, n))
    flat = keep.flatten().nonzero().squeeze(1)
    return flat, weight.flatten()[flat]


# ---- the folder --------------------------------------------------------------------------------------
def write_folder(folder: Path, tok: Any, tcfg: URSATransformerConfig, model: URSATransformer, vae: AutoencoderVQ) -> None:
    """The real URSA layout (what ``difforge.models.ursa.tiny`` writes for tiny-ursa, with trained weights)."""
    (folder / "tokenizer").mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer" / "tokenizer.json").write_text(tok.to_str(pretty=True) + "\n", encoding="utf-8")
    _write_json(folder / "tokenizer" / "tokenizer_config.json", _tokenizer_config(tok))
    t_config = {"_class_name": "URSATransformer3DModel", **tcfg.to_dict()}
    for key in ("head_dim", "rms_norm_eps"):  # never read by the reference
        t_config.pop(key)
    _write_json(folder / "transformer" / "config.json", t_config)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()},
              str(folder / "transformer" / "diffusion_pytorch_model.safetensors"), metadata={"format": "pt"})
    vcfg = vae.config
    v_config = {"_class_name": "AutoencoderVQ", "_quantizer_name": "VQuantizer", **vcfg.__dict__}
    v_config["block_out_channels"] = list(vcfg.block_out_channels)
    _write_json(folder / "vae" / "config.json", v_config)
    save_file({k: v.contiguous() for k, v in vae.state_dict().items()},
              str(folder / "vae" / "diffusion_pytorch_model.safetensors"), metadata={"format": "pt"})
    # the world's pictures are 64 x 64: runs without --height/--width get that size (models/ursa/loader.py)
    # prompt_domain (shapes/domain.py): trained on one-item captions (ursa_data.py), so a prompt outside them warns
    _write_json(folder / SETTINGS_FILE, {"default_height": 64, "default_width": 64, "prompt_domain": {
        "vocabulary": "shapes", "kind": "caption", "max_items": 1}})
    # the scheduler reads its codebook in float16 whatever the file holds, so it is stored so
    _write_scheduler_and_index(folder, vae.quantizer.embedding.weight.detach().to(torch.float16), "AutoencoderVQ")
    if (folder / "scheduler" / "scheduler_config.json").is_file():  # pin the path this recipe trained on
        cfg = json.loads((folder / "scheduler" / "scheduler_config.json").read_text(encoding="utf-8"))
        if (cfg.get("alpha"), cfg.get("c")) != (ALPHA, C):
            raise RuntimeError("tiny-ursa's scheduler config changed; the recipe trained on alpha 0.9, c 3.")


def weights_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.suffix in (".safetensors", ".pth"))


def replace_folder(tmp: Path, out: Path) -> None:
    """Rename ``tmp`` over ``out`` (the old folder, if any, is moved aside first and removed after)."""
    old = out.with_name(f".{out.name}.old-{os.getpid()}")
    if out.exists():
        out.rename(old)
    tmp.rename(out)
    if old.exists():
        shutil.rmtree(old)


# ---- evaluation --------------------------------------------------------------------------------------
def evaluate(folder: Path, n: int = 40, steps: int | None = None, guidance: float | None = None,
             log: Log | None = None) -> dict[str, Any]:
    """Generate the ``n`` held-out captions at float32 through the engine (default steps and guidance
    unless given; seed = the caption's index) and score each with the checker."""
    from ..api import load_pipeline
    from ..config import RunConfig
    from ..engine import run_pipeline
    from ..shapes.prompts import heldout_caption_set, score

    pipe = load_pipeline(str(folder), device="cpu", dtype="float32")
    items = heldout_caption_set(n=n).items
    checks: dict[str, int] = {}
    correct, rows = 0, []
    for i, item in enumerate(items):
        opts: dict[str, Any] = {"steps": steps} if steps is not None else {}
        if guidance is not None:
            opts["guidance"] = guidance
        cfg = RunConfig(model=str(folder), prompt=item.prompt, device="cpu", dtype="float32", height=64, width=64,
                        seed=i, quiet=True, **opts)
        image = run_pipeline(pipe, cfg).images[0]
        s = score(np.asarray(image), item)
        correct += s.correct
        for k, v in s.checks.items():
            checks[k] = checks.get(k, 0) + int(v)
        rows.append({"prompt": item.prompt, "correct": s.correct, "detail": s.detail})
        if log is not None and not s.correct:
            log(f"  miss: {s.detail}")
    return {"n": len(items), "correct": correct, "accuracy": correct / len(items),
            "checks": {k: v / len(items) for k, v in checks.items()}, "rows": rows}


# ---- the recipe --------------------------------------------------------------------------------------
@dataclass
class Trained:
    """What :func:`train` returns: the modules to write and the numbers to report."""

    tokenizer: Any
    transformer: URSATransformer
    vae: AutoencoderVQ
    losses: list[float]
    vq_decoder_losses: list[float]
    vq_encoder_losses: list[float]
    seconds: dict[str, float]


def train(recipe: Recipe, log: Log = say, check_decoder: bool = True) -> Trained:
    """Stages 1-4 from ``recipe.seed``: the world's scenes from it, and each trained stage's draws from its
    own torch generator (seeded ``10 * seed + stage``), so changing one stage's numbers leaves the others'."""
    torch.manual_seed(recipe.seed)
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    data = data_mod.build_dataset(recipe.seed, recipe.images)
    codes = data_mod.encode_dataset(data)
    tok = build_tokenizer()
    lm_vocab = tok.get_vocab_size(with_added_tokens=True)
    canon = data_mod.canonical_dataset(item_size=recipe.item_size)
    canon_codes = data_mod.encode_dataset(canon)
    text = TextBatch(encode_captions(canon.captions, tok), tok.token_to_id("<|endoftext|>"),
                     tok.token_to_id("<|vision_start|>"))
    times["data+codebook"] = time.perf_counter() - t0
    log(f"data: {recipe.images} placed scenes (VQ), {len(canon.captions)} canonical captions (transformer), "
        f"codebook {data_mod.CODEBOOK} codes "
        f"({times['data+codebook']:.1f}s)")

    t0 = time.perf_counter()
    vae, dec_losses, enc_losses = train_vq(recipe, codes, data.images, data.scenes, log,
                                           torch.Generator().manual_seed(10 * recipe.seed + 1))
    if check_decoder:
        log(f"  vq decoder: the checker reads {decoder_accuracy(vae):.1%} of 40 held-out scenes' true codes back")
    times["vq"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    codebook = vae.quantizer.embedding.weight.detach().to(torch.float16)  # the scheduler keeps it float16
    model, losses = train_transformer(recipe, canon_codes, text, codebook, lm_vocab, log,
                                      torch.Generator().manual_seed(10 * recipe.seed + 2))
    times["transformer"] = time.perf_counter() - t0
    return Trained(tok, model, vae, losses, dec_losses, enc_losses, times)


def run(recipe: Recipe, out: Path, log: Log = say, do_eval: bool = True) -> dict[str, Any]:
    """Train, write ``out`` atomically, and (unless told not to) evaluate it on the held-out captions."""
    load_start = os.getloadavg()
    t_all = time.perf_counter()
    result = train(recipe, log)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    write_folder(tmp, result.tokenizer, result.transformer.config, result.transformer, result.vae)
    replace_folder(tmp, out)
    times = result.seconds
    times["train_total"] = time.perf_counter() - t_all
    summary: dict[str, Any] = {
        "recipe": asdict(recipe), "seconds": times, "loadavg_start": load_start, "loadavg_end": os.getloadavg(),
        "threads": torch.get_num_threads(), "weights_bytes": weights_bytes(out),
        "final_loss": float(np.mean(result.losses[-25:])), "vq_decoder_l1": float(np.mean(result.vq_decoder_losses[-25:])),
    }
    log(f"wrote {out}: {summary['weights_bytes']} bytes of weights; training {times['train_total']:.0f}s")
    if do_eval:
        t0 = time.perf_counter()
        summary["heldout"] = evaluate(out, log=log)
        times["eval"] = time.perf_counter() - t0
        h = summary["heldout"]
        log(f"held-out: {h['correct']}/{h['n']} correct ({h['accuracy']:.1%}); per check "
            + ", ".join(f"{k} {v:.1%}" for k, v in h["checks"].items()) + f" ({times['eval']:.0f}s)")
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m difforge.training.shapes_ursa", description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="folder to write (replaced atomically)")
    parser.add_argument("--steps", type=int, default=None, help=f"transformer steps (default {Recipe.steps})")
    parser.add_argument("--seed", type=int, default=Recipe.seed)
    parser.add_argument("--threads", type=int, default=2, help="torch threads (the budget is 2 CPU cores)")
    parser.add_argument("--no-eval", action="store_true", help="skip the held-out evaluation")
    parser.add_argument("--summary", type=Path, default=None, help="also write the numbers as JSON here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    recipe = Recipe(seed=args.seed)
    if args.steps is not None:
        recipe = replace(recipe, steps=args.steps)
    summary = run(recipe, args.out, do_eval=not args.no_eval)
    if args.summary is not None:
        args.summary.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
