"""The Qwen-Image-Edit denoising loop and its speed options, shared by the pipeline and the benchmark.

One step is: the transformer call(s), the true-CFG combine (rescaled to the conditional norm), and
the scheduler's Euler step.  diffusers makes two batch-1 transformer calls per CFG step; difforge by
default makes one batch-2 call (``batched-cfg``), with the shorter text padded once per run and
each row attending only to its own valid text (see :mod:`.attention`), so the shapes are static
and the result equals the two calls within float rounding.

The loop is free of host synchronisation: no ``.item()``, no device-to-host copies, no
data-dependent shapes (``tests/models/qwen_edit/test_perf_exact.py`` checks this with a dispatch
mode); timesteps stay on the device and the scheduler's sigmas are host scalars.  A ``step_hook``
asks for CPU copies, and so does synchronise - that is the caller's explicit choice.  So does the
opt-in ``first-block-cache``: diffusers reads its residual ratio with ``.item()`` in each
transformer call (the RunRecord's ``denoise loop`` entry says so, see :func:`.speed.record_loop`).

Speed options are named so a run can say exactly what it did:

* exact, on by default, switched off with ``cfg.disable``: ``batched-cfg``, ``real-rope``,
  ``npu-attention``;
* approximate, off by default, switched on with ``cfg.fast``: ``first-block-cache[=threshold]``,
  ``taylorseer[=interval]``;
* ``cfg.compile``: regional ``torch.compile`` of the 60 repeated blocks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ...errors import InputError
from ...runtime.stages import CFG, timed_stage

EXACT_OPTIMISATIONS = ("batched-cfg", "real-rope", "npu-attention", "vae-2d")
FAST_OPTIMISATIONS = ("first-block-cache", "taylorseer")
#: diffusers' FirstBlockCacheConfig default threshold; TaylorSeer's default refresh interval.
DEFAULT_FBC_THRESHOLD = 0.05
DEFAULT_TAYLORSEER_INTERVAL = 5

OnStep = Callable[[int, Tensor, Tensor, Tensor, Tensor], None]


@dataclass(frozen=True)
class SpeedOptions:
    """Which speed-ups a load/run uses, parsed and checked from ``cfg.disable`` / ``cfg.fast`` / ``cfg.compile``."""

    batched_cfg: bool = True
    real_rope: bool = True
    npu_attention: bool = True
    vae_2d: bool = True
    compile: bool = False
    first_block_cache: float | None = None  # threshold, None = off
    taylorseer: int | None = None  # cache interval, None = off

    @classmethod
    def parse(cls, disable: list[str] | tuple[str, ...] = (), fast: list[str] | tuple[str, ...] = (),
              compile: bool = False) -> SpeedOptions:
        unknown = sorted(set(disable) - set(EXACT_OPTIMISATIONS))
        if unknown:
            raise InputError(
                f"Unknown --disable '{unknown[0]}' for Qwen-Image-Edit; exact optimisations are"
                f" {', '.join(EXACT_OPTIMISATIONS)}."
            )
        fbc: float | None = None
        taylor: int | None = None
        for item in fast:
            name, _, value = item.partition("=")
            if name not in FAST_OPTIMISATIONS:
                raise InputError(
                    f"Unknown --fast '{item}' for Qwen-Image-Edit; approximate optimisations are"
                    f" {', '.join(FAST_OPTIMISATIONS)} (optionally name=value)."
                )
            try:
                if name == "first-block-cache":
                    fbc = float(value) if value else DEFAULT_FBC_THRESHOLD
                    if not fbc > 0:
                        raise ValueError
                else:
                    taylor = int(value) if value else DEFAULT_TAYLORSEER_INTERVAL
                    if taylor < 1:
                        raise ValueError
            except ValueError:
                kind = "a positive threshold" if name == "first-block-cache" else "a positive integer interval"
                raise InputError(f"--fast {item}: the value must be {kind}.") from None
        if fbc is not None and taylor is not None:
            raise InputError("--fast first-block-cache and taylorseer cannot be combined; choose one.")
        return cls(
            batched_cfg="batched-cfg" not in disable,
            real_rope="real-rope" not in disable,
            npu_attention="npu-attention" not in disable,
            vae_2d="vae-2d" not in disable,
            compile=bool(compile),
            first_block_cache=fbc,
            taylorseer=taylor,
        )

    @classmethod
    def from_config(cls, cfg: Any) -> SpeedOptions:
        return cls.parse(list(cfg.disable), list(cfg.fast), bool(cfg.compile))

    def names(self) -> tuple[list[str], list[str]]:
        """``(cfg.disable, cfg.fast)`` that parse back to these options."""
        flags = (self.batched_cfg, self.real_rope, self.npu_attention, self.vae_2d)
        disable = [n for n, on in zip(EXACT_OPTIMISATIONS, flags, strict=True) if not on]
        fast = [f"first-block-cache={self.first_block_cache!r}"] if self.first_block_cache is not None else []
        fast += [f"taylorseer={self.taylorseer}"] if self.taylorseer is not None else []
        return disable, fast

    @classmethod
    def reference(cls) -> SpeedOptions:
        """Everything off: diffusers' own behaviour (two batch-1 calls, complex RoPE, eager)."""
        return cls(batched_cfg=False, real_rope=False, npu_attention=False)

    @property
    def needs_processor(self) -> bool:
        """difforge's attention processor is needed for real RoPE and for ragged batched CFG."""
        return self.real_rope or self.batched_cfg


@dataclass
class Prepared:
    """Everything the denoiser needs that does not change between steps, for one RunConfig."""

    key: str
    height: int
    width: int
    prompt_embeds: Tensor
    prompt_mask: Tensor | None
    negative_embeds: Tensor | None
    negative_mask: Tensor | None
    image_latents: Tensor
    img_shapes: list[list[tuple[int, int, int]]]
    noise: Tensor  # packed initial latents
    _batch: CfgBatch | None = field(default=None, repr=False)

    @property
    def do_cfg(self) -> bool:
        return self.negative_embeds is not None


@dataclass
class CfgBatch:
    """The static inputs of one batch-2 CFG call: padded texts, and how each row is kept exact."""

    embeds: Tensor  # [2, L, D]: prompt, negative prompt; the shorter one zero-padded at the end
    mask: Tensor | None  # [2, L] bool (True = valid) when the texts carry their own masks
    text_lengths: tuple[int, int] | None  # valid lengths, for difforge's per-row attention
    image_latents: Tensor  # [2, N_ref, C]
    img_shapes: list[list[tuple[int, int, int]]]

    @property
    def attention_kwargs(self) -> dict[str, Any]:
        return {"text_lengths": self.text_lengths} if self.text_lengths is not None else {}

    @property
    def tokens_per_forward(self) -> int:
        return int(self.embeds.shape[1] + self.image_latents.shape[1])


def _pad_rows(x: Tensor, length: int) -> Tensor:
    return F.pad(x, (0, 0, 0, length - x.shape[1])) if x.shape[1] < length else x


def _valid(mask: Tensor | None, n: int, length: int, like: Tensor) -> Tensor:
    row = torch.ones(1, n, dtype=torch.bool, device=like.device) if mask is None else mask.to(like.device).bool()
    return F.pad(row, (0, length - n), value=False)


def build_cfg_batch(p: Prepared, per_row_attention: bool) -> CfgBatch:
    """Pad the two texts to one length once per run (static shapes for every step and for compile).

    With difforge's processor (``per_row_attention``) no mask is passed: each row's valid length
    goes to the attention as a Python int.  Otherwise, or when a text carries its own mask, a
    boolean mask marks the padding, which diffusers' processor honours (exact, but masked kernels).
    """
    assert p.negative_embeds is not None
    lc, lu = int(p.prompt_embeds.shape[1]), int(p.negative_embeds.shape[1])
    length = max(lc, lu)
    embeds = torch.cat([_pad_rows(p.prompt_embeds, length), _pad_rows(p.negative_embeds, length)])
    own_masks = p.prompt_mask is not None or p.negative_mask is not None
    mask: Tensor | None = None
    lengths: tuple[int, int] | None = None
    if own_masks or (lc != lu and not per_row_attention):
        mask = torch.cat([_valid(p.prompt_mask, lc, length, embeds), _valid(p.negative_mask, lu, length, embeds)])
    elif lc != lu:
        lengths = (lc, lu)
    return CfgBatch(embeds, mask, lengths, torch.cat([p.image_latents, p.image_latents]), p.img_shapes * 2)


def uses_difforge_processor(transformer: torch.nn.Module) -> bool:
    from .attention import QwenJointAttnProcessor

    blocks = getattr(transformer, "transformer_blocks", None)
    return bool(blocks) and isinstance(blocks[0].attn.processor, QwenJointAttnProcessor)


@timed_stage(CFG)
def combine_cfg(cond: Tensor, uncond: Tensor, true_cfg: float) -> Tensor:
    """diffusers' true-CFG combine, rescaled to the conditional prediction's per-token norm."""
    combined = uncond + true_cfg * (cond - uncond)
    return combined * (torch.norm(cond, dim=-1, keepdim=True) / torch.norm(combined, dim=-1, keepdim=True))


class Denoiser:
    """The transformer side of one denoising step: conditional/unconditional calls and the combine."""

    def __init__(self, transformer: torch.nn.Module, batched_cfg: bool = True, split: Any = None,
                 sequence: Any = None) -> None:
        self.transformer = transformer
        self.batched_cfg = batched_cfg
        #: ``--parallel ulysses=N``: the group whose ranks split every call's sequence (diffusers' context
        #: parallelism, :mod:`.ulysses`); a status header before each step, so no rank starts a call's
        #: collectives when a peer has given up between calls.
        self.sequence = sequence
        #: ``--parallel cfg``: the group (``.rank``, ``.all_gather``) whose rank 0 runs the conditional
        #: branch and rank 1 the unconditional; one gather per step, the same combine on both ranks.
        self.split = split

    def _call(self, hidden: Tensor, timestep: Tensor, embeds: Tensor, mask: Tensor | None,
              img_shapes: list, attention_kwargs: dict[str, Any]) -> Tensor:
        return self.transformer(
            hidden_states=hidden,
            timestep=timestep,
            guidance=None,
            encoder_hidden_states_mask=mask,
            encoder_hidden_states=embeds,
            img_shapes=img_shapes,
            attention_kwargs=attention_kwargs,
            return_dict=False,
        )[0]

    def cfg_batch(self, p: Prepared) -> CfgBatch:
        if p._batch is None:
            p._batch = build_cfg_batch(p, uses_difforge_processor(self.transformer))
        return p._batch

    def combine(self, cond: Tensor, uncond: Tensor, true_cfg: float) -> Tensor:
        """The true-CFG combine of the two branches (:func:`combine_cfg`); a method so validation can see the
        branches the network gave (the probe wraps it on its own denoiser), the run never keeps them."""
        return combine_cfg(cond, uncond, true_cfg)

    def forwards_per_step(self, p: Prepared) -> int:
        return 1 if (not p.do_cfg or self.batched_cfg or self.split is not None) else 2

    def velocity(self, p: Prepared, latents: Tensor, t: Tensor, true_cfg: float) -> Tensor:
        """The (true-CFG combined, norm-rescaled) velocity at timestep ``t`` - what the scheduler steps with."""
        if self.sequence is None:
            return self._velocity(p, latents, t, true_cfg)
        self.sequence.check()
        # diffusers' all-to-alls run inside the calls, with no status header a failing rank could meet:
        # the group's opaque section makes a failure here end the peers out of band (runtime.parallel).
        with self.sequence.opaque():
            return self._velocity(p, latents, t, true_cfg)

    def _velocity(self, p: Prepared, latents: Tensor, t: Tensor, true_cfg: float) -> Tensor:
        transformer = self.transformer
        n = latents.shape[1]
        if p.do_cfg and self.batched_cfg:
            batch = self.cfg_batch(p)
            model_input = torch.cat([torch.cat([latents, latents]), batch.image_latents], dim=1)
            timestep = t.expand(2).to(latents.dtype) / 1000
            with transformer.cache_context("cfg"):
                out = self._call(model_input, timestep, batch.embeds, batch.mask, batch.img_shapes,
                                 batch.attention_kwargs)
            cond, uncond = out[:1, :n], out[1:, :n]
            return self.combine(cond, uncond, true_cfg)
        model_input = torch.cat([latents, p.image_latents], dim=1)
        timestep = t.expand(latents.shape[0]).to(latents.dtype) / 1000
        if p.do_cfg and self.split is not None:  # this rank's branch, then both branches on both ranks
            branch = "cond" if self.split.rank == 0 else "uncond"
            embeds, mask = (p.prompt_embeds, p.prompt_mask) if branch == "cond" else (p.negative_embeds, p.negative_mask)
            with transformer.cache_context(branch):
                mine = self._call(model_input, timestep, embeds, mask, p.img_shapes, {})[:, :n]
            cond, uncond = self.split.all_gather(mine)
            return self.combine(cond, uncond, true_cfg)
        with transformer.cache_context("cond"):
            cond = self._call(model_input, timestep, p.prompt_embeds, p.prompt_mask, p.img_shapes, {})[:, :n]
        if not p.do_cfg:
            return cond
        with transformer.cache_context("uncond"):
            uncond = self._call(model_input, timestep, p.negative_embeds, p.negative_mask, p.img_shapes, {})[:, :n]
        return self.combine(cond, uncond, true_cfg)


def schedule(scheduler: Any, image_seq_len: int, steps: int, device: torch.device) -> Tensor:
    """The run's timesteps (diffusers' dynamic shift for this image length), on ``device``."""
    from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit import calculate_shift, retrieve_timesteps

    get = scheduler.config.get
    mu = calculate_shift(
        image_seq_len,
        get("base_image_seq_len", 256),
        get("max_image_seq_len", 4096),
        get("base_shift", 0.5),
        get("max_shift", 1.15),
    )
    sigmas = np.linspace(1.0, 1 / steps, steps)
    timesteps, _ = retrieve_timesteps(scheduler, steps, device, sigmas=sigmas, mu=mu)
    scheduler.set_begin_index(0)
    return timesteps


def denoise(
    denoiser: Denoiser,
    scheduler: Any,
    p: Prepared,
    timesteps: Tensor,
    true_cfg: float,
    on_step: OnStep | None = None,
    steps: Any = None,
) -> Tensor:
    """Run the loop from ``p.noise``; ``on_step(i, latents, t, velocity, stepped)`` after each step.

    ``steps`` may wrap ``enumerate(timesteps)`` (a progress bar).  Caches from ``--fast`` are reset
    first, so every run starts from the same state.
    """
    reset = getattr(denoiser.transformer, "_reset_stateful_cache", None)
    if reset is not None and getattr(denoiser.transformer, "is_cache_enabled", False):
        reset()
    latents = p.noise
    for i, t in steps if steps is not None else enumerate(timesteps):
        velocity = denoiser.velocity(p, latents, t, true_cfg)
        stepped = scheduler.step(velocity, t, latents, return_dict=False)[0]
        if on_step is not None:
            on_step(i, latents, t, velocity, stepped)
        latents = stepped
    return latents
