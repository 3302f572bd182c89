"""RunConfig: everything that defines one generation or edit, independent of the CLI."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

OFFLOAD_PLANS = ("none", "before-decode", "model", "sequential")


@dataclass
class RunConfig:
    """The knobs of one run.  Family-specific fields are ignored by the other family."""

    model: str
    prompt: str = ""
    negative_prompt: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    height: int | None = None
    width: int | None = None
    steps: int | None = None  # None: the family's default (URSA 25, Qwen-Edit 50)
    seed: int = 0
    # URSA
    guidance: float = 7.0
    guidance_trunc: float = 0.9
    num_frames: int = 1
    # Qwen-Image-Edit
    images: list[str] = field(default_factory=list)
    true_cfg: float = 4.0
    transformer_file: str | None = None
    # memory / speed
    offload: str = "none"
    vae_tiling: bool = False
    compile: bool = False
    fast: list[str] = field(default_factory=list)  # opt-in approximate optimisations, by name
    disable: list[str] = field(default_factory=list)  # exact optimisations switched off, by name
    # outputs
    output: str | None = None
    record: str | None = None
    quiet: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def fingerprint(self) -> str:
        """Hash of every field that changes the pixels (not output paths or verbosity)."""
        data = {k: v for k, v in self.to_dict().items() if k not in ("output", "record", "quiet")}
        return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]
