"""A toy third model family: one package (this module) plus one registry line (``TOY``), nothing else.

It is what ``docs/architecture.md`` ("Adding a family") describes, small enough to read in one go: a
pipeline with ``from_pretrained`` and difforge's ``pipe(cfg, record)`` call in numbered stages, a probe
with the teacher-forced step validation replays, the speed-name check, and the :class:`Family` record
that names them by dotted path.  The network is a fixed 1x1 convolution; the "denoiser" moves the
noise toward it for ``steps`` Euler steps and the picture is its sigmoid, upsampled.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import PIL.Image
import torch
from torch import Tensor, nn

from difforge.config import RunConfig
from difforge.devices import Backend
from difforge.errors import InputError, SizeError
from difforge.models.checkpoint import read_json
from difforge.models.family import Family
from difforge.models.load_defaults import load_inputs
from difforge.runtime.record import RunRecord

NAME = "toy"
CLASS_NAME = "ToyPipeline"
DEFAULT_STEPS = 4
#: The picture side per latent cell.
STRIDE = 8

#: The one registry line (registered by the test, undone after).
TOY = Family(NAME, (CLASS_NAME,), ("generate",), f"{__name__}:ToyPipeline", f"{__name__}:ToyProbe",
             f"{__name__}:check_speed_names", "velocity")


def check_speed_names(disable: list[str], fast: list[str], compile: bool = False) -> None:
    """The toy has no speed-ups: any ``--disable``/``--fast`` name is refused."""
    given = [*disable, *fast]
    if given:
        raise InputError(f"Unknown speed-up '{given[0]}' for the toy family; it has none.")


def write_folder(folder: Path, channels: int = 3) -> Path:
    """A toy model folder: its ``model_index.json`` and its one config."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model_index.json").write_text(f'{{"_class_name": "{CLASS_NAME}"}}', encoding="utf-8")
    (folder / "toy.json").write_text(f'{{"channels": {channels}}}', encoding="utf-8")
    return folder


class ToyPipeline:
    family: ClassVar[str] = NAME

    def __init__(self, net: nn.Module, backend: Backend, dtype: torch.dtype) -> None:
        self.net, self.backend, self.dtype = net, backend, dtype

    @classmethod
    def from_pretrained(cls, folder: str | Path, backend: Backend | None = None, dtype: torch.dtype | None = None,
                        cfg: RunConfig | None = None, record: RunRecord | None = None,
                        op_overrides: dict[str, Callable[..., Any]] | None = None) -> ToyPipeline:
        folder, backend, dtype, cfg, record = load = load_inputs(folder, "generate", backend, dtype, cfg, record)
        with load.phase():
            channels = int(read_json(folder / "toy.json", root=folder)["channels"])
            net = nn.Conv2d(channels, channels, 1)
            weights = torch.Generator().manual_seed(0)
            with torch.no_grad():
                for p in net.parameters():
                    p.copy_(torch.randn(p.shape, generator=weights) * 0.5)
            net = net.to(backend.device, dtype)
        record.adapt("weights", "toy: seeded 1x1 convolution")
        return cls(net, backend, dtype)

    def velocity(self, latents: Tensor, t: Tensor) -> Tensor:
        """The network's step output: toward the convolution of the latents, faster late in the schedule."""
        return (self.net(latents) - latents) * (1.0 + t)

    @torch.inference_mode()
    def __call__(self, cfg: RunConfig, record: RunRecord, images: Any = None,
                 step_hook: Callable[..., None] | None = None) -> list[PIL.Image.Image]:
        # 1. check inputs
        steps = DEFAULT_STEPS if cfg.steps is None else int(cfg.steps)
        height, width = cfg.height or 32, cfg.width or 32
        if height % STRIDE or width % STRIDE:
            raise SizeError(f"--height and --width must be multiples of {STRIDE} for the toy, got {height}x{width}.")
        check_speed_names(list(cfg.disable), list(cfg.fast))
        # 2. draw the noise
        noise = torch.randn((1, self.net.in_channels, height // STRIDE, width // STRIDE),
                            generator=self.backend.generator(cfg.seed))
        latents = noise.to(self.backend.device, self.dtype)
        # 3. denoise
        with record.phase("denoise", self.backend):
            for i in range(steps):
                t = torch.tensor(1.0 - i / steps, dtype=self.dtype, device=self.backend.device)
                v = self.velocity(latents, t)
                if step_hook is not None:
                    step_hook(i, {"latents": latents.cpu(), "timestep": t.cpu()}, {"velocity": v.cpu()})
                latents = latents + v / steps
        # 4. decode
        with record.phase("decode", self.backend):
            pixels = torch.sigmoid(latents.float()).repeat_interleave(STRIDE, 2).repeat_interleave(STRIDE, 3)
            array = (pixels[0, :3].permute(1, 2, 0) * 255).round().to(torch.uint8).cpu().numpy()
        record.extra["steps"] = steps
        return [PIL.Image.fromarray(array)]


class ToyProbe:
    """What validation asks of the toy: its teacher-forced step (the other hooks are not needed here)."""

    family: ClassVar[str] = NAME
    takes_images: ClassVar[bool] = False
    default_prompts: ClassVar[tuple[str, ...]] = ("a toy",)
    negative_prompt: ClassVar[str | None] = None
    default_steps: ClassVar[int] = DEFAULT_STEPS
    exact_optimisations: ClassVar[tuple[str, ...]] = ()
    approximate_optimisations: ClassVar[tuple[str, ...]] = ()

    def __init__(self, pipeline: ToyPipeline) -> None:
        self.pipeline = pipeline

    @property
    def dtype(self) -> torch.dtype:
        return self.pipeline.dtype

    @property
    def size_multiple(self) -> int:
        return STRIDE

    @torch.inference_mode()
    def forward_step(self, cfg: RunConfig, i: int, inputs: dict[str, Tensor]) -> dict[str, Tensor]:
        """Step ``i`` on the recorded latents and timestep; ``scale`` (a float output listed first) is there
        so the step rung's key is the record's ``primary_output``, not merely the first floating output."""
        pipe = self.pipeline
        latents = inputs["latents"].to(pipe.backend.device, pipe.dtype)
        t = inputs["timestep"].to(pipe.backend.device, pipe.dtype)
        return {"scale": (1.0 + t).float().cpu().reshape(1), "velocity": pipe.velocity(latents, t).float().cpu()}
