"""What one Qwen-Image-Edit call is made of: its checked inputs, and the speed and memory settings it runs with.

:class:`EditCall` is stage 1's answer (the inputs every later stage reads, decided before any work);
:class:`RunSettings` is stage 2's (what ``configure`` returns: the options the call runs with, kept by
the pipeline as the ones its modules are set up for).  Both are values: a stage that needs the call's
settings is handed them instead of reading attributes an earlier call left behind.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import PIL.Image
import torch
from torch import Tensor

from ...config import RunConfig
from ...runtime.record import RunRecord
from .loop import SpeedOptions

StepHook = Callable[[int, dict[str, Tensor], dict[str, Tensor]], None]


@dataclass(frozen=True)
class RunSettings:
    """The speed and memory options of one call: parsed speed-ups, offload plan, VAE tiling, and the
    ``--disable``/``--fast`` names as given (what a diffusers-style call of the pipeline runs with next)."""

    options: SpeedOptions
    offload: str
    vae_tiling: bool
    disable: tuple[str, ...]
    fast: tuple[str, ...]

    @classmethod
    def of(cls, cfg: RunConfig) -> RunSettings:
        """``cfg``'s settings (the speed names checked by :meth:`SpeedOptions.from_config`)."""
        return cls(SpeedOptions.from_config(cfg), cfg.offload, bool(cfg.vae_tiling), tuple(cfg.disable), tuple(cfg.fast))

    @classmethod
    def loaded(cls, options: SpeedOptions, offload: str, vae_tiling: bool) -> RunSettings:
        """The settings a pipeline is loaded with (the names spelled back from ``options``)."""
        disable, fast = options.names()
        return cls(options, offload, vae_tiling, tuple(disable), tuple(fast))

    def config_fields(self) -> dict[str, Any]:
        """The :class:`RunConfig` fields that ask for these settings."""
        return {"disable": list(self.disable), "fast": list(self.fast), "compile": self.options.compile,
                "offload": self.offload, "vae_tiling": self.vae_tiling}


@dataclass(frozen=True)
class EditCall:
    """One call's checked inputs (stage 1): the config and record, the reference pictures, the step count
    and output size, and the optional step hook and generator (the diffusers-style call's)."""

    cfg: RunConfig
    record: RunRecord
    images: list[PIL.Image.Image]
    steps: int
    height: int
    width: int
    step_hook: StepHook | None = None
    generator: torch.Generator | None = None
