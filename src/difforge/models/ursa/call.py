"""What one URSA call is made of: its arguments, its speed-up switches, and the state its stages pass on.

Kept apart from :mod:`.pipeline` so the pipeline file holds only the stages; both call styles
(difforge's ``pipe(cfg, record)`` and the reference's ``pipe(prompt=..., generator=g)``) are turned
into one :class:`URSACall` by stage 1, and stage 3 hands the denoiser a :class:`TokenState`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ...config import RunConfig
from ...devices import PHILOX_STREAM, REFERENCE_STREAM
from ...errors import InputError
from ...runtime.record import RunRecord
from .sampling import Draws

DEFAULT_HEIGHT, DEFAULT_WIDTH, DEFAULT_STEPS = 320, 512, 25
#: The random-stream switch, the one name both lists take: ``--fast philox-rng`` draws from the portable
#: Philox stream on any device (the CPU included), ``--disable philox-rng`` from the reference's CPU
#: stream on any device; neither: the backend's ``random_stream`` (Philox on every accelerator, the
#: reference's stream on the CPU).  Both streams are exact in distribution; they are different numbers.
PHILOX_RNG = "philox-rng"
EXACT_OPTIMISATIONS = ("lm-head-slice", "reuse-first-forward", "rope-cache", "pinned-draws", PHILOX_RNG)
FAST_OPTIMISATIONS = ("unguided-tail", PHILOX_RNG)
#: Retired names still accepted: ``--fast device-rng`` named a per-device torch.Generator stream, which
#: differed between device types; it now selects the portable stream.
STREAM_ALIASES = {"device-rng": PHILOX_RNG}
OUTPUT_TYPES = ("pil", "np", "latent")

StepHook = Callable[[int, dict[str, torch.Tensor], dict[str, torch.Tensor]], None]


def check_optimisation_names(disable: list[str] | tuple[str, ...], fast: list[str] | tuple[str, ...]) -> None:
    """Refuse an unknown ``--disable`` / ``--fast`` name (InputError naming the known ones), and the stream
    switch given both ways."""
    for flag, given, known, kind in (("--disable", disable, EXACT_OPTIMISATIONS, "exact optimisations"),
                                     ("--fast", fast, FAST_OPTIMISATIONS, "approximate optimisations")):
        unknown = sorted(set(given) - set(known) - (set(STREAM_ALIASES) if flag == "--fast" else set()))
        if unknown:
            raise InputError(f"Unknown {flag} '{unknown[0]}' for URSA; {flag} takes the {kind} "
                             f"{', '.join(known)}.")
    if PHILOX_RNG in disable and PHILOX_RNG in {STREAM_ALIASES.get(n, n) for n in fast}:
        raise InputError(f"'{PHILOX_RNG}' is in both --fast and --disable; give it once: --fast {PHILOX_RNG} for the "
                         f"portable Philox stream, --disable {PHILOX_RNG} for the reference's CPU stream.")


def random_stream(default: str, disable: list[str] | tuple[str, ...], fast: list[str] | tuple[str, ...]) -> str:
    """The stream a run draws from, ``philox`` or ``reference``: as the switch names it, else ``default``
    (the backend's :attr:`~difforge.devices.Backend.random_stream`)."""
    if PHILOX_RNG in {STREAM_ALIASES.get(n, n) for n in fast}:
        return PHILOX_STREAM
    if PHILOX_RNG in disable:
        return REFERENCE_STREAM
    return default


def cpu_copy(x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A CPU tensor that owns its memory (``.cpu()`` on a CPU tensor would alias it)."""
    return x.detach().to("cpu", dtype or x.dtype, copy=True)


@dataclass
class URSAPipelineOutput:
    """What the diffusers-style call returns: ``frames`` as PIL images, a uint8 array or token ids."""

    frames: Any


@dataclass(frozen=True)
class Optimisations:
    """The speed-up switches of one call, decided once from ``cfg.disable`` / ``cfg.fast`` and the device."""

    lm_head_slice: bool
    reuse_first: bool  # metric path only: off the metric path step 0 can move tokens
    rope_cache: bool
    pinned_draws: bool  # only where the backend's host-to-device copies can overlap the host
    unguided_tail: bool
    random_stream: str  # PHILOX_STREAM or REFERENCE_STREAM (see :func:`random_stream`)
    stream_named: bool = False  # True when --fast/--disable chose it, False for the backend's default

    @property
    def philox(self) -> bool:
        return self.random_stream == PHILOX_STREAM


@dataclass(frozen=True)
class ReferenceArgs:
    """The reference pipeline's call arguments, argument for argument, with its defaults.

    ``pipe(prompt=..., generator=g, output_type="np")`` (or :meth:`URSAPipeline.generate`) takes
    exactly these keywords.  ``output_type``: "pil" (one image per frame), "np" (uint8 ``[B, H, W, 3]``,
    or ``[B, T, H, W, 3]`` for video) or "latent" (token ids ``[B, T, h, w]``).  ``generator`` None:
    a fresh CPU generator seeded from ``torch.seed()``, like the reference.
    """

    prompt: str | list[str] = ""
    negative_prompt: str | list[str] | None = None
    height: int = DEFAULT_HEIGHT
    width: int = DEFAULT_WIDTH
    num_frames: int = 1
    num_inference_steps: int = DEFAULT_STEPS
    guidance_scale: float = 7.0
    guidance_trunc: float = 0.9
    num_images_per_prompt: int = 1
    generator: torch.Generator | None = None
    output_type: str = "pil"
    disable: tuple[str, ...] = ()
    fast: tuple[str, ...] = ()

    def run_config(self) -> RunConfig:
        """The numeric options as a RunConfig (checked by ``RunConfig.validate`` like every other call)."""
        if self.output_type not in OUTPUT_TYPES:
            raise InputError(f"output_type must be 'pil', 'np' or 'latent', got {self.output_type!r}.")
        return RunConfig(model="", height=self.height, width=self.width, num_frames=self.num_frames,
                         steps=self.num_inference_steps, guidance=self.guidance_scale,
                         guidance_trunc=self.guidance_trunc, disable=list(self.disable), fast=list(self.fast),
                         quiet=True)


@dataclass(frozen=True)
class URSACall:
    """One call after stage 1 (check inputs): everything the later stages read, decided once."""

    cfg: RunConfig
    prompt: str | list[str]
    negative_prompt: str | list[str] | None
    latent_shape: tuple[int, int, int]
    steps: int
    flags: Optimisations
    generator: torch.Generator
    per_prompt: int = 1
    #: None: the reference's call, which records nothing, takes no step hook and decodes where the VAE is.
    record: RunRecord | None = None
    step_hook: StepHook | None = None
    #: None: difforge's call (a list of PIL images, one per frame); else the reference's output_type.
    output_type: str | None = None


@dataclass
class TokenState:
    """Stage 3's result: the initial codes and what every denoising step reuses."""

    x: torch.Tensor  # [B, N] current codes, int64 on the device
    ids: torch.Tensor  # [rows, L] transformer input: text | bov | image tokens, both CFG halves
    pos: torch.Tensor  # [L, 3] positions on the device
    rope: object | None  # the rotary table when rope-cache is on
    draws: Draws
    latent_shape: tuple[int, int, int]
    guided: bool

    @property
    def batch(self) -> int:
        return self.x.shape[0]

    @property
    def n_img(self) -> int:
        return self.x.shape[1]
