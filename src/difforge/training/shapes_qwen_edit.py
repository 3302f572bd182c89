"""Train ``shapes-qwen-edit``: a Qwen-Image-Edit (VAE + MMDiT) that carries out shapes-world edits.

``python -m difforge.training.shapes_qwen_edit --out DIR [--steps N] [--seed S] [--threads T]``
(``make train-shapes``) writes a folder in the real diffusers layout (safetensors only) that
difforge's Qwen-Image-Edit loader loads unchanged.  The recipe, all seeded (CPU, fp32):

1. **data**: ``n_edits`` edit triples of the world's *train* split at 64 px
   (:func:`difforge.shapes.world.edits`), every kind uniformly (recolour, background, move, add,
   remove, reshape);
2. **parts** (:mod:`.qwen_parts`): a BPE tokenizer learnt on the template and the world's words, the
   tiny Qwen2.5-VL text encoder (seeded random init, frozen), a 4x VAE, a small MMDiT;
3. **VAE**: ``vae_steps`` AdamW steps (lr ``vae_lr``, 20 warm-up steps, cosine to 5 %) on whole
   64 px source and target pictures that teach it a *designed* latent (:mod:`.qwen_latents`: per
   4 x 4 cell the background colour, the nearby shape's colour, the outline's signed distance and
   which shape is near):
   the encoder regresses it, the decoder paints the picture from it with noise added
   (:func:`train_vae`); the latent mean and std over the data go into the VAE config
   (``latents_mean`` / ``latents_std``), as the pipeline un-normalises them; ``--out`` runs then
   measure the VAE's ceiling with the checker (:func:`.qwen_eval.vae_readback`);
4. **encode once**: the reference latents (posterior mode, normalised: what
   ``QwenImageEditPipeline._encode_vae_image`` returns), the target latents, and the prompt embeddings
   of each instruction and of the negative prompt ``" "`` through ``pipe.encode_prompt`` with the
   source picture, exactly as the pipeline encodes them at run time;
5. **MMDiT**: ``steps`` AdamW steps of rectified flow: ``x_t = (1 - s) x0 + s e``, target velocity
   ``e - x0`` (the FlowMatchEulerDiscreteScheduler's Euler step ``x + (s' - s) v``), ``s`` drawn as
   ``u ~ U(0,1)`` through the scheduler's dynamic exponential shift for the run's 64 image tokens
   (the grid inference steps on), the noisy target's packed tokens followed by the packed reference
   tokens (``img_shapes`` [(1,8,8), (1,8,8)]), timestep ``s`` (the pipeline passes ``t / 1000``);
   early on a decaying share of the rows (``high_noise``) at ``s ~ U(high_from, 1)`` instead, where
   sampling starts; AdamW ``lr``, ``warmup`` steps, cosine to 5 %, clip 1; ``p_uncond`` of the rows
   get the negative prompt's embedding so true CFG (default 4, negative ``" "``) has a trained
   unconditional branch;
6. **save**: ``QwenImageEditPipeline.save_pretrained`` into a temporary sibling folder, plus
   ``difforge.json`` (64 px reference and output areas), then one rename;
7. **evaluate** (unless ``--no-eval``): the 40 held-out edits through the normal engine at fp32 with
   the run defaults (:func:`.qwen_eval.evaluate`), accuracy overall and per kind.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from difforge.models.qwen_edit.vae_convs import two_d as single_frame_convs
from difforge.shapes.world import edits, render
from difforge.training.loop import RunningLog, optimiser_step
from difforge.training.qwen_latents import designed_latents, shape_ids
from difforge.training.qwen_parts import (
    TEMPLATE,
    Arch,
    build_processor,
    build_scheduler,
    build_text_encoder,
    build_tokenizer,
    build_transformer,
    build_vae,
    check_tokenizer,
)

SIZE = 64
NEGATIVE_PROMPT = " "  # what the pipeline encodes as the negative prompt when none is given
#: difforge.json of the folder: the pipeline resizes references to these areas (64 px, the world's size).
SETTINGS = {"reference_area": SIZE * SIZE, "condition_area": SIZE * SIZE, "output_area": SIZE * SIZE,
            # what the model understands (shapes/domain.py): a prompt outside it gets a warning line
            "prompt_domain": {"vocabulary": "shapes", "kind": "edit"}}

Log = Callable[[str], None]


@dataclass(frozen=True)
class Recipe:
    """Every hyper-parameter of the recipe (the defaults are what trained the committed weights)."""

    seed: int = 0
    n_edits: int = 2000
    arch: Arch = field(default_factory=Arch)
    vae_steps: int = 2000
    vae_batch: int = 8
    vae_lr: float = 3e-3
    vae_near: int = 3
    vae_weight: float = 9.0
    vae_noise: float = 0.5
    steps: int = 10000
    batch: int = 32
    lr: float = 3e-3
    warmup: int = 100
    p_uncond: float = 0.1
    #: At step k, this fraction x (1 - k / steps) of the rows draws sigma from U(high_from, 1) instead: the
    #: first sampling steps start from pure noise, where the model must produce the edit from the reference
    #: and the instruction alone, and that is what it learns last (docs/shapes-training.md).
    high_noise: float = 0.5
    high_from: float = 0.7
    encode_batch: int = 64

    def to_json(self) -> dict:
        return asdict(self)


# ---- data -------------------------------------------------------------------------------------------
@dataclass
class EditData:
    """The training triples: sources and targets as N x 64 x 64 x 3 uint8, instructions, kinds."""

    sources: np.ndarray
    targets: np.ndarray
    instructions: list[str]
    kinds: list[str]
    source_ids: np.ndarray  # N x 64 x 64 shape-id maps (qwen_latents.shape_ids): what the VAE's latent names
    target_ids: np.ndarray

    def digest(self, n: int | None = None) -> str:
        """sha256 of the first ``n`` triples (pixels and instructions): what a rerun must reproduce."""
        h = hashlib.sha256()
        k = len(self.instructions) if n is None else n
        h.update(self.sources[:k].tobytes())
        h.update(self.targets[:k].tobytes())
        h.update("\n".join(self.instructions[:k]).encode())
        return h.hexdigest()


def make_data(seed: int, n: int) -> EditData:
    """``n`` train-split edits of the world for ``seed`` (byte-identical on every machine)."""
    triples = edits(seed, n, size=SIZE, split="train")
    return EditData(
        np.stack([render(e.source) for e in triples]),
        np.stack([render(e.target) for e in triples]),
        [e.instruction for e in triples],
        [e.kind for e in triples],
        np.stack([shape_ids(e.source) for e in triples]),
        np.stack([shape_ids(e.target) for e in triples]),
    )


def to_pixels(images: np.ndarray) -> torch.Tensor:
    """uint8 N x H x W x 3 -> float N x 3 x 1 x H x W in [-1, 1] (VaeImageProcessor.preprocess's range)."""
    return torch.from_numpy(images).permute(0, 3, 1, 2).float().div(127.5).sub(1).unsqueeze(2)


# ---- VAE --------------------------------------------------------------------------------------------
def decode_unclamped(vae, z: torch.Tensor) -> torch.Tensor:
    """``vae.decode(z)`` of one frame without its final clamp to [-1, 1] (a clamped pixel passes no
    gradient, and a fresh decoder's pixels are mostly out of range: training would stall)."""
    vae.clear_cache()
    vae._conv_idx = [0]
    out = vae.decoder(vae.post_quant_conv(z), feat_cache=vae._feat_map, feat_idx=vae._conv_idx)
    vae.clear_cache()
    return out


def shape_weights(images: np.ndarray, near: int, weight: float) -> np.ndarray:
    """Per-pixel loss weights N x H x W (float32): 1, plus ``weight`` on pixels within ``near`` px of a
    non-background pixel.  A plain L1 is dominated by the background (a shape covers 5-15 % of a
    picture), so without the extra weight the decoder learns backgrounds first and shapes last."""
    bg = images[:, :1, :1]  # the world keeps a margin, so a corner pixel is always background
    fg = torch.from_numpy((images != bg).any(-1)).float()[:, None]
    grown = F.max_pool2d(fg, 2 * near + 1, stride=1, padding=near)[:, 0]
    return (1 + weight * grown).numpy()


def train_vae(vae, data: EditData, r: Recipe, log: Log) -> list[float]:
    """Teach the VAE the designed latent (:mod:`.qwen_latents`) on whole 64 px pictures, both halves in
    each step (they share no parameters): the encoder (with ``quant_conv``) regresses the designed latent
    of the picture (MSE in units of each channel's std); the decoder (with ``post_quant_conv``) paints the
    picture from the designed latent plus Gaussian noise of ``U(0, vae_noise)`` times each channel's std
    (the MMDiT's errors are of that order, and a decoder that never saw them draws speckles), loss L1 + MSE
    of the unclamped decode, each pixel weighted 1 + ``vae_weight`` within ``vae_near`` px of a shape (the
    background would dominate a plain mean).  Returns the loss of every step."""
    pool = np.concatenate([data.sources, data.targets])
    designed = designed_latents(pool, np.concatenate([data.source_ids, data.target_ids]))
    std = designed.transpose(0, 1).reshape(designed.shape[1], -1).std(1).view(1, -1, 1, 1, 1)
    weights = torch.from_numpy(shape_weights(pool, r.vae_near, r.vae_weight))
    rng = np.random.default_rng([r.seed, 1])
    g = torch.Generator().manual_seed(r.seed * 1000 + 4)
    opt = torch.optim.AdamW(vae.parameters(), lr=r.vae_lr, weight_decay=0.0)
    vae.train()
    running = RunningLog("vae", r.vae_steps, log)
    for step in range(r.vae_steps):
        warm = min(1.0, (step + 1) / 20)
        lr = r.vae_lr * warm * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * step / max(1, r.vae_steps))))
        for group in opt.param_groups:
            group["lr"] = lr
        idx = rng.integers(len(pool), size=r.vae_batch)
        x, z = to_pixels(pool[idx]), designed[idx]
        w = weights[idx][:, None, None]
        w = w / w.mean()
        level = r.vae_noise * torch.rand(len(idx), 1, 1, 1, 1, generator=g)
        with single_frame_convs(vae):
            mean = vae.encode(x).latent_dist.mean
            rec = decode_unclamped(vae, z + level * std * torch.randn(z.shape, generator=g))
        err = rec - x
        loss = (w * err.abs()).mean() + (w * err.pow(2)).mean() + ((mean - z) / std).pow(2).mean()
        running(step, optimiser_step(opt, loss, vae.parameters(), clip=1.0), lr)
    vae.eval()
    return running.losses


@torch.no_grad()
def encode_latents(vae, images: np.ndarray, batch: int) -> torch.Tensor:
    """Posterior modes (N x z x 1 x h x w), un-normalised."""
    with single_frame_convs(vae):
        out = [vae.encode(to_pixels(images[i : i + batch])).latent_dist.mode() for i in range(0, len(images), batch)]
    return torch.cat(out)


def pack(latents: torch.Tensor) -> torch.Tensor:
    """N x C x 1 x H x W -> N x (H/2 * W/2) x 4C, as ``QwenImageEditPipeline._pack_latents``."""
    n, c, _, h, w = latents.shape
    x = latents.view(n, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(n, (h // 2) * (w // 2), c * 4)


# ---- text -------------------------------------------------------------------------------------------
@torch.no_grad()
def encode_prompts(pipe, sources: np.ndarray, prompts: list[str], batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompt embeddings through ``pipe.encode_prompt`` with each source picture (what the pipeline
    does at run time), zero-padded to one length: (N x L x D, N x L bool mask)."""
    from PIL import Image

    rows: list[torch.Tensor] = []
    for i in range(0, len(prompts), batch):
        images = [Image.fromarray(a) for a in sources[i : i + batch]]
        embeds, mask = pipe.encode_prompt(image=images, prompt=prompts[i : i + batch], device="cpu")
        if mask is None:  # diffusers drops an all-ones mask
            mask = torch.ones(embeds.shape[:2], dtype=torch.bool)
        rows += [e[: int(m.sum())] for e, m in zip(embeds, mask, strict=True)]
    length = max(r.shape[0] for r in rows)
    out = torch.zeros(len(rows), length, rows[0].shape[1])
    valid = torch.zeros(len(rows), length, dtype=torch.bool)
    for k, r in enumerate(rows):
        out[k, : r.shape[0]] = r
        valid[k, : r.shape[0]] = True
    return out, valid


# ---- MMDiT ------------------------------------------------------------------------------------------
def shift_sigmas(u: torch.Tensor, image_seq_len: int, scheduler) -> torch.Tensor:
    """``u`` in (0, 1) through the scheduler's dynamic exponential shift for ``image_seq_len`` tokens."""
    from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit import calculate_shift

    get = scheduler.config.get
    mu = calculate_shift(image_seq_len, get("base_image_seq_len"), get("max_image_seq_len"), get("base_shift"),
                         get("max_shift"))
    return math.exp(mu) / (math.exp(mu) + (1 / u - 1))


@dataclass
class Encoded:
    """Everything the MMDiT trains on, encoded once."""

    ref: torch.Tensor  # N x T x 4z packed normalised source latents
    x0: torch.Tensor  # N x T x 4z packed normalised target latents
    txt: torch.Tensor  # N x L x D
    txt_mask: torch.Tensor  # N x L
    neg: torch.Tensor  # N x Ln x D
    neg_mask: torch.Tensor
    grid: tuple[int, int]  # packed (h, w)


def _pad_to(x: torch.Tensor, m: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    if x.shape[1] >= length:
        return x, m
    return F.pad(x, (0, 0, 0, length - x.shape[1])), F.pad(m, (0, length - m.shape[1]), value=False)


def train_transformer(transformer, scheduler, enc: Encoded, r: Recipe, log: Log) -> list[float]:
    """Rectified-flow training of the MMDiT; returns the loss of every step."""
    g = torch.Generator().manual_seed(r.seed * 1000 + 5)
    rng = np.random.default_rng([r.seed, 2])
    opt = torch.optim.AdamW(transformer.parameters(), lr=r.lr, weight_decay=0.01, betas=(0.9, 0.99))
    transformer.train()
    n, tokens = enc.x0.shape[:2]
    h, w = enc.grid
    length = max(enc.txt.shape[1], enc.neg.shape[1])
    txt, txt_mask = _pad_to(enc.txt, enc.txt_mask, length)
    neg, neg_mask = _pad_to(enc.neg, enc.neg_mask, length)
    running = RunningLog("mmdit", r.steps, log)
    for step in range(r.steps):
        lr = r.lr * min(1.0, (step + 1) / r.warmup) * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * step / r.steps)))
        for group in opt.param_groups:
            group["lr"] = lr
        idx = torch.from_numpy(rng.integers(n, size=r.batch))
        drop = torch.from_numpy(rng.random(r.batch) < r.p_uncond)
        x0, ref = enc.x0[idx], enc.ref[idx]
        e = torch.where(drop[:, None, None], neg[idx], txt[idx])
        m = torch.where(drop[:, None], neg_mask[idx], txt_mask[idx])
        keep = int(m.any(0).nonzero().max()) + 1
        e, m = e[:, :keep], m[:, :keep]
        u = torch.rand(r.batch, generator=g).clamp(1e-4, 1 - 1e-4)
        sigma = shift_sigmas(u, tokens, scheduler)
        if r.high_noise:  # early steps spend more rows where sampling starts (see Recipe.high_noise)
            high = torch.rand(r.batch, generator=g) < r.high_noise * (1 - step / r.steps)
            sigma = torch.where(high, r.high_from + (1 - r.high_from) * torch.rand(r.batch, generator=g), sigma)
        noise = torch.randn(x0.shape, generator=g)
        s = sigma[:, None, None]
        xt = (1 - s) * x0 + s * noise
        out = transformer(
            hidden_states=torch.cat([xt, ref], 1),
            timestep=sigma,
            encoder_hidden_states=e,
            encoder_hidden_states_mask=m,
            img_shapes=[[(1, h, w), (1, h, w)]] * r.batch,
            return_dict=False,
        )[0][:, :tokens]
        loss = F.mse_loss(out, noise - x0)
        running(step, optimiser_step(opt, loss, transformer.parameters(), clip=1.0), lr)
    transformer.eval()
    return running.losses


# ---- the whole recipe -------------------------------------------------------------------------------
def build_pipeline(r: Recipe):
    """The untrained pipeline of the recipe (diffusers' QwenImageEditPipeline of the real classes)."""
    from diffusers import QwenImageEditPipeline

    tok = build_tokenizer()
    check_tokenizer(tok)
    pipe = QwenImageEditPipeline(
        scheduler=build_scheduler(),
        vae=build_vae(r.arch, r.seed * 1000 + 3),
        text_encoder=build_text_encoder(tok),
        tokenizer=tok,
        processor=build_processor(tok),
        transformer=build_transformer(r.arch, r.seed * 1000 + 2),
    )
    assert pipe.prompt_template_encode == TEMPLATE and pipe.prompt_template_encode_start_idx == 64, (
        "diffusers changed the Qwen-Image-Edit prompt template; update difforge.training.qwen_parts.TEMPLATE"
    )
    return pipe


def encode_data(pipe, data: EditData, r: Recipe, log: Log) -> Encoded:
    """Set the VAE's latent statistics from the data, then encode everything the MMDiT needs."""
    t0 = time.perf_counter()
    src = encode_latents(pipe.vae, data.sources, r.encode_batch)
    tgt = encode_latents(pipe.vae, data.targets, r.encode_batch)
    both = torch.cat([src, tgt]).transpose(0, 1).reshape(src.shape[1], -1)
    mean, std = both.mean(1), both.std(1).clamp(min=1e-3)
    pipe.vae.register_to_config(latents_mean=[round(float(v), 6) for v in mean],
                                latents_std=[round(float(v), 6) for v in std])
    mean_t = torch.tensor(pipe.vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std_t = torch.tensor(pipe.vae.config.latents_std).view(1, -1, 1, 1, 1)
    ref, x0 = pack((src - mean_t) / std_t), pack((tgt - mean_t) / std_t)
    log(f"encoded {len(src) * 2} pictures ({time.perf_counter() - t0:.0f}s); latent grid {tuple(src.shape[3:])}")
    txt, txt_mask = encode_prompts(pipe, data.sources, data.instructions, r.encode_batch)
    neg, neg_mask = encode_prompts(pipe, data.sources, [NEGATIVE_PROMPT] * len(data.sources), r.encode_batch)
    log(f"encoded prompts: {txt.shape[1]} / {neg.shape[1]} tokens ({time.perf_counter() - t0:.0f}s)")
    return Encoded(ref, x0, txt, txt_mask, neg, neg_mask, (src.shape[3] // 2, src.shape[4] // 2))


def _load_vae(pipe, folder: Path, r: Recipe) -> None:
    """Stage 3 from an earlier run of the same VAE recipe (deterministic, so the same weights)."""
    from safetensors.torch import load_file

    meta = json.loads((Path(folder) / "training.json").read_text(encoding="utf-8"))["recipe"]
    mine = json.loads(json.dumps(r.to_json()))  # tuples as the JSON file's lists
    same = ("seed", "n_edits", "arch", "vae_steps", "vae_batch", "vae_lr", "vae_near", "vae_weight", "vae_noise")
    diff = [k for k in same if meta.get(k) != mine[k]]
    if diff:
        raise SystemExit(f"--vae-from {folder}: its VAE was trained with other {', '.join(diff)}")
    pipe.vae.load_state_dict(load_file(str(Path(folder) / "vae" / "diffusion_pytorch_model.safetensors")))
    pipe.vae.eval()


def train(r: Recipe, log: Log = print, vae_from: Path | None = None, readback: bool = False) -> tuple[object, dict]:
    """Run the recipe; returns the trained diffusers pipeline and a summary (losses, times, digest).
    ``vae_from``: take stage 3 from an earlier folder of the same VAE recipe instead of retraining;
    ``readback``: also measure the VAE's ceiling on the held-out edit pictures (``qwen_eval.vae_readback``)."""
    torch.manual_seed(r.seed)
    t0 = time.perf_counter()
    data = make_data(r.seed, r.n_edits)
    log(f"data: {r.n_edits} edits, sha256 {data.digest()[:16]} ({time.perf_counter() - t0:.0f}s)")
    pipe = build_pipeline(r)
    if vae_from is None:
        vae_losses = train_vae(pipe.vae, data, r, log)
    else:
        _load_vae(pipe, vae_from, r)
        vae_losses = []
        log(f"vae from {vae_from}")
    t_vae = time.perf_counter() - t0
    vae_readback = None
    if readback:
        from difforge.training.qwen_eval import vae_readback as measure

        vae_readback, bad = measure(pipe.vae)
        log(f"vae readback: {vae_readback:.1%} of 80 held-out edit pictures read back right" + "".join(
            f"\n  {b}" for b in bad[:5]))
    enc = encode_data(pipe, data, r, log)
    t_enc = time.perf_counter() - t0
    mmdit_losses = train_transformer(pipe.transformer, pipe.scheduler, enc, r, log)
    summary = {
        "recipe": r.to_json(),
        "data_sha256": data.digest(),
        "vae_readback": vae_readback,
        "vae_loss_last50": sum(vae_losses[-50:]) / len(vae_losses[-50:]) if vae_losses else None,
        "mmdit_loss_last100": sum(mmdit_losses[-100:]) / max(1, len(mmdit_losses[-100:])),
        "seconds": {"vae": round(t_vae), "encode": round(t_enc - t_vae), "mmdit": round(time.perf_counter() - t0 - t_enc)},
        "vae_losses": vae_losses,
        "mmdit_losses": mmdit_losses,
    }
    return pipe, summary


def save(pipe, out: Path, summary: dict) -> Path:
    """Write the folder atomically: a temporary sibling, then one rename over ``out``."""
    from difforge.models.qwen_edit.tiny import _quiet_progress, write_processor_layout

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    with _quiet_progress():
        pipe.save_pretrained(str(tmp), safe_serialization=True)
    write_processor_layout(tmp / "processor")
    (tmp / "difforge.json").write_text(json.dumps(SETTINGS, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    meta = {k: v for k, v in summary.items() if not k.endswith("_losses") and k != "seconds"}
    (tmp / "training.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    old = out.with_name(f".{out.name}.old-{os.getpid()}")
    if out.exists():
        out.rename(old)
    tmp.rename(out)
    shutil.rmtree(old, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m difforge.training.shapes_qwen_edit", description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="the model folder to write")
    parser.add_argument("--steps", type=int, default=None, help="MMDiT training steps (default: the recipe's)")
    parser.add_argument("--vae-steps", type=int, default=None, help="VAE training steps (default: the recipe's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (the budget is 2 cores)")
    parser.add_argument("--vae-from", type=Path, default=None,
                        help="reuse the VAE of an earlier folder trained with the same VAE settings")
    parser.add_argument("--no-eval", action="store_true",
                        help="skip the held-out evaluation (40 edits through the normal engine) after saving")
    parser.add_argument("--summary", type=Path, default=None,
                        help="write the numbers (losses, times, accuracy) here as JSON")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    r = Recipe(seed=args.seed)
    if args.steps is not None:
        r = replace(r, steps=args.steps)
    if args.vae_steps is not None:
        r = replace(r, vae_steps=args.vae_steps)
    start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - start:7.1f}s] {msg}", file=sys.stderr, flush=True)

    pipe, summary = train(r, log, vae_from=args.vae_from, readback=True)
    folder = save(pipe, args.out, summary)
    size = sum(p.stat().st_size for p in folder.rglob("*.safetensors"))
    summary["safetensors_bytes"] = size
    summary["cpu_seconds_train"] = round(_cpu_seconds())
    log(f"wrote {folder} ({size / 1e6:.2f} MB of safetensors); {summary['seconds']}; "
        f"CPU {summary['cpu_seconds_train']}s")
    if not args.no_eval:
        from difforge.training.qwen_eval import evaluate

        result = evaluate(folder)
        summary["heldout"] = {"correct": sum(i.correct for i in result.items), "n": len(result.items),
                              "by_kind": result.by_kind(), "seconds": round(result.seconds)}
        log(f"held-out edits (fp32, run defaults): {result.summary()}")
    if args.summary is not None:
        args.summary.write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    return 0


def _cpu_seconds() -> float:
    import resource

    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


if __name__ == "__main__":
    raise SystemExit(main())
