"""RunConfig: everything that defines one generation or edit, independent of the CLI."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from numbers import Integral, Real
from pathlib import Path
from typing import Any

from .errors import InputError, StepsError

OFFLOAD_PLANS = ("none", "before-decode", "model", "sequential")
#: Largest seed.  Seeds go into int64 generators (torch, numpy, device RNGs) and the RunRecord; torch
#: would silently fold a negative seed or one of 2**63 .. 2**64 - 1 onto another seed's stream, and
#: crash above that, so only 0 .. 2**63 - 1 is accepted.
MAX_SEED = 2**63 - 1
#: Largest --guidance / --true-cfg.  Published recipes use 4 (Qwen-Image-Edit) to 7 (URSA); scales far
#: beyond that overflow the guided logits into inf/NaN (1e300 crashes the sampler), so cap them here.
MAX_GUIDANCE = 100.0
#: ``--parallel`` modes (docs/parallel.md): none, data (a --prompt-file sharded over ranks), cfg (the two
#: CFG branches on two ranks: URSA's CFG batch halves, Qwen-Edit's true-CFG calls), ``ulysses=N`` (URSA's
#: joint sequence over N ranks, attention heads split by all-to-all).
PARALLEL_MODES = ("none", "data", "cfg", "ulysses=N")
#: Most ``--steps``.  Published schedules use 25 (URSA) to 50 (Qwen-Image-Edit); past a thousand steps the
#: schedule's increments fall below what bfloat16 can tell apart, and a typo (``--steps 50000``) would hold
#: the device for hours (and a capture or golden bundle grows with every step), so larger counts are refused.
MAX_STEPS = 1000
#: Most characters of one prompt.  The text encoders keep a few hundred tokens (URSA 320), but a tokenizer
#: splits the whole text first, at about 200 bytes of memory per character (a 26 MB prompt line took 5.8 GB);
#: 100 000 characters is far beyond any prompt a model reads and bounds that at about 20 MB.
MAX_PROMPT_CHARS = 100_000


def ulysses_degree(mode: Any) -> int | None:
    """N of ``ulysses=N`` (a whole number of at least 2), None for another mode; InputError for a bad N."""
    if not isinstance(mode, str) or mode.partition("=")[0].strip() != "ulysses":
        return None
    value = mode.partition("=")[2].strip()
    if not value.isdigit() or int(value) < 2:
        raise InputError(f"--parallel ulysses=N takes the number of ranks the sequence is split over (2 or more), "
                         f"got {mode!r}.")
    return int(value)


def check_parallel(mode: Any) -> None:
    """``--parallel``: one of :data:`PARALLEL_MODES` (InputError otherwise)."""
    if isinstance(mode, str) and mode in PARALLEL_MODES[:3]:
        return
    if ulysses_degree(mode) is not None:
        return
    raise InputError(f"Unknown --parallel mode {mode!r}; use one of {', '.join(PARALLEL_MODES)}.")


def check_text(value: Any, what: str) -> Any:
    """Raise InputError unless ``value`` is text that can be encoded as UTF-8, of at most :data:`MAX_PROMPT_CHARS`
    characters (or a list of such texts).

    The tokenizers need UTF-8: bytes, or a str holding lone surrogates (what Python makes of a
    non-UTF-8 command line), would otherwise crash deep inside them as an "unexpected TypeError".
    """
    for text in value if isinstance(value, list | tuple) else [value]:
        if not isinstance(text, str):
            hint = "; decode it first, e.g. data.decode('utf-8')" if isinstance(text, bytes | bytearray) else ""
            raise InputError(f"{what} must be text (str), got {type(text).__name__}{hint}.")
        if len(text) > MAX_PROMPT_CHARS:
            raise InputError(f"{what} is {len(text)} characters long; at most {MAX_PROMPT_CHARS} are accepted (the "
                             "model reads only its first few hundred tokens).")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InputError(
                f"{what} is not valid UTF-8 text (character {exc.start + 1} is an undecodable byte); check the"
                " encoding of your terminal or prompt file."
            ) from None
    return value


def check_steps(steps: Any) -> None:
    """``--steps``: None (the family's default) or a whole number from 2 to :data:`MAX_STEPS` (StepsError otherwise).

    The one place for this rule: RunConfig.validate and validate's option check both call it.
    """
    if steps is None:
        return
    if not isinstance(steps, Integral) or isinstance(steps, bool):
        raise StepsError(f"--steps must be a whole number, got {steps!r}.")
    if steps < 2:
        raise StepsError(f"--steps must be at least 2 (got {steps}); one step leaves pure noise.")
    if steps > MAX_STEPS:
        raise StepsError(f"--steps must be at most {MAX_STEPS} (got {steps}); the published schedules use 25 to 50.")


def check_transformer_file(path: Any) -> None:
    """``--transformer``: None, or an existing file (InputError naming a folder or a missing path).

    The one place for this rule: ``api`` (generate/edit) and validate's option check both call it.
    """
    if not path:
        return
    p = Path(path)
    if not p.is_file():
        kind = "is a folder" if p.is_dir() else "does not exist"
        raise InputError(f"--transformer {path} {kind}; give a .safetensors file.")


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
    #: Opt-in environment presets of the backend, ``NAME`` or ``NAME=VALUE`` (``ACL_PRECISION_MODE`` on the
    #: NPU); the backend checks the names (``Backend.opt_in_choices``) when the pipeline loads.
    presets: list[str] = field(default_factory=list)
    # outputs
    output: str | None = None
    record: str | None = None
    perf_dump: str | None = None  # SGLang-style per-stage / per-step timings (RunRecord.perf_dump)
    #: Replace a regular file at an output path that difforge did not write (``--overwrite``); a previous difforge
    #: output is replaced without it, a link, FIFO or device never (:mod:`difforge.runtime.outputs`).
    overwrite: bool = False
    quiet: bool = False
    #: ``--parallel`` mode under torchrun (:data:`PARALLEL_MODES`); "none" is the one-process run.
    parallel: str = "none"

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise a named InputError for a numeric option or prompt no run could use.

        The one place for these rules (steps, seed, guidance, offload plan, prompt text): every RunConfig (API, CLI, validate, the diffusers-style
        pipeline calls, ``dataclasses.replace``) passes through here, so a NaN guidance cannot
        silently switch guidance off and a huge seed cannot crash a generator halfway through a run.
        """
        check_steps(self.steps)
        if not isinstance(self.seed, Integral) or isinstance(self.seed, bool) or not 0 <= self.seed <= MAX_SEED:
            raise InputError(f"--seed must be a whole number from 0 to {MAX_SEED} (2**63 - 1), got {self.seed!r}.")
        for flag, value in (("--guidance", self.guidance), ("--true-cfg", self.true_cfg)):
            if not _real(value) or not 0 <= value <= MAX_GUIDANCE:
                raise InputError(
                    f"{flag} must be a number from 0 to {MAX_GUIDANCE:g} (1 or less switches guidance off), got {value!r}."
                )
        if not _real(self.guidance_trunc) or not 0 <= self.guidance_trunc <= 1:
            raise InputError(
                f"--guidance-trunc must be a number from 0 to 1 (the time after which guidance stops), "
                f"got {self.guidance_trunc!r}."
            )
        if self.offload not in OFFLOAD_PLANS:
            raise InputError(f"Unknown --offload plan '{self.offload}'; use one of {', '.join(OFFLOAD_PLANS)}.")
        check_parallel(self.parallel)
        check_text(self.prompt, "The prompt")
        if self.negative_prompt is not None:
            check_text(self.negative_prompt, "The negative prompt")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def fingerprint(self) -> str:
        """Hash of every field that changes the pixels (not output paths, verbosity or the ``--parallel`` layout)."""
        data = {k: v for k, v in self.to_dict().items()
                if k not in ("output", "record", "quiet", "parallel", "overwrite")}
        return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _real(value: Any) -> bool:
    """A finite real number (NaN and inf compare false to every bound, so they must be caught first)."""
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)
