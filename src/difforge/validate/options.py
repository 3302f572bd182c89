"""The options of ``difforge validate`` and what a validation returns.

``ValidateOptions`` mirrors the CLI flags one to one, so the CLI only builds it and calls
:func:`difforge.validate.run_validation`; Python users and tests build it directly (tests also
pass ``op_overrides`` to plant a porting bug in the device under test only).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config import RunConfig, check_steps, check_transformer_file
from ..devices import DTYPES, dtype_name
from ..errors import InputError, OutputError
from ..models.registry import check_speed_names, family_of
from ..runtime.outputs import check_writable_folder
from .outdir import refuse_message, replaceable

if TYPE_CHECKING:
    from .verdict import RungResult, Verdict

#: Rungs in the order they run and appear in the report.
RUNGS = ("smoke", "determinism", "benchmark", "operator", "component", "step", "trajectory", "semantic")
#: The options that change only HOW the device under test runs (speed, memory), never what the reference
#: computes: the reference and the floor reset them to RunConfig's defaults (the plain path).
DUT_ONLY = ("compile", "fast", "disable", "offload", "vae_tiling", "parallel")


@dataclass
class ValidateOptions:
    """One validation run (``difforge validate`` flags)."""

    model: str
    out: str | Path
    device: str = "auto"
    dtype: str = "auto"
    reference: str = "cpu:float32"
    images: list[str] = field(default_factory=list)
    prompts: str | None = None  # a text file, one prompt (or edit instruction) per line
    #: A prompt set with expected attributes (difforge-prompt-set/1 JSON) for the semantic rung; the
    #: built-in shapes models bring their held-out set, other models skip the rung without one.
    prompt_set: str | None = None
    #: The model's Python source (a folder, file or module name) for ``difforge scan``; the report lists
    #: its porting hazards for the device under test's type.
    scan_source: str | None = None
    steps: int | None = None
    height: int | None = None
    width: int | None = None
    rounds: int = 3
    warmup: int = 1
    seed: int = 0
    quick: bool = False
    #: Time the performance table's other rows (the baseline and each approximate optimisation) too;
    #: each costs ``warmup + rounds`` more runs.  ``--no-speed-table`` times only the validated options.
    speed_table: bool = True
    lang: str = "en"
    quiet: bool = False
    #: Replace ops in the device-under-test pipeline only (tests plant porting bugs with this).
    op_overrides: dict[str, Callable[..., Any]] | None = None
    #: Extra seeds for the trajectory rung (clean runs are checked on several seeds).
    extra_seeds: list[int] = field(default_factory=list)
    #: A second real device as the precision floor (``cuda:bfloat16``); None: the emulated floor
    #: (the reference's float32 kernels rounding like the device), which never shares its kernels.
    floor: str | None = None
    #: Validate a device against itself (same device, same dtype): refused unless asked for, and then
    #: the report says it is not a port test.
    allow_self_compare: bool = False
    #: ``warn``: a WARN verdict exits 1 too (a sign-off that accepts no open question).
    fail_on: str = "fail"
    #: ``RUNG=REASON`` (repeatable): a WARN from a floor ratio between PASS and FAIL on RUNG is accepted for
    #: REASON (printed in the report) instead of failing the sign-off (:func:`~.verdict.overall`).
    accept_warn: list[str] = field(default_factory=list)
    #: A golden bundle (``difforge golden --out``): the reference and floor are read from it, not computed.
    golden: str | None = None
    #: A capture bundle (``difforge capture --out``): the device under test's half of this validation, made
    #: on the device; the reference and floor are computed here (or read from ``golden``).
    capture: str | None = None
    #: The digest ``difforge golden`` / ``capture`` printed (:func:`~.bundle.bundle_digest`), kept outside the bundle:
    #: the bundle must be that one.  Without it the report says its identity was not checked.
    golden_digest: str | None = None
    capture_digest: str | None = None
    #: Also write msprobe dumps of the device's and the floor's step 0 and msprobe compare's table
    #: (:mod:`.msprobe_view`; needs ``pip install 'difforge[msprobe]'``).
    msprobe: bool = False
    # ---- the configuration that ships (``difforge generate``/``edit`` flags) ----------------------------
    #: Transformer-only safetensors (an FP8 re-pack) replacing the folder's: loaded on every side, so the
    #: reference and the floor upcast the same weights and the comparison measures the port, not the
    #: quantisation.
    transformer: str | None = None
    #: DUT_ONLY below: how the device under test runs; the reference and the floor run the plain path.
    compile: bool = False
    fast: list[str] = field(default_factory=list)
    disable: list[str] = field(default_factory=list)
    offload: str = "none"
    vae_tiling: bool = False
    #: ``cfg``: under torchrun, the device under test's runs split their two CFG branches over 2 ranks
    #: (docs/parallel.md); the reference and the floor stay one process, on rank 0, which alone writes.
    parallel: str = "none"
    #: None: the family's (or the probe's) default; applied on every side.
    num_frames: int | None = None
    guidance: float | None = None
    guidance_trunc: float | None = None
    true_cfg: float | None = None
    negative_prompt: str | None = None

    def accepted_warns(self) -> dict[str, str]:
        """``--accept-warn`` as {rung: reason}; a bad one (unknown rung, no reason) is exit 2, one line."""
        from .verdict import parse_accept_warn

        try:
            return parse_accept_warn(self.accept_warn)
        except ValueError as exc:
            raise InputError(str(exc)) from None

    def check(self) -> None:
        """Reject bad usage early, as a DifforgeError (exit 2) with one actionable sentence."""
        if self.lang not in ("en", "zh"):
            raise InputError(f"--lang must be 'en' or 'zh', not '{self.lang}'.")
        if self.rounds < 1:
            raise InputError("--rounds must be at least 1.")
        if self.warmup < 0:
            raise InputError("--warmup must be 0 or more.")
        check_steps(self.steps)
        if self.parallel == "data":
            raise InputError("validate runs one device-under-test run at a time; --parallel data has no prompt file "
                             "to shard there: use --parallel cfg (or none).")
        if self.parallel.startswith("ulysses"):
            raise InputError("validate takes --parallel cfg as the device under test's split; ulysses=N is built for "
                             "difforge generate only.")
        self.check_run_options()
        for flag, value in (("--height", self.height), ("--width", self.width)):
            if value is not None and value <= 0:
                raise InputError(f"{flag} must be a positive number of pixels, not {value}.")
        if self.prompts is not None:
            _check_input_file(self.prompts, "--prompts", "give a text file, one prompt a line")
        for img in self.images:
            _check_input_file(img, "--image", "give an image file")
        parse_reference(self.reference)
        if self.floor is not None:
            parse_reference(self.floor, flag="--floor")
        if self.fail_on not in ("fail", "warn"):
            raise InputError(f"--fail-on must be 'fail' or 'warn', not '{self.fail_on}'.")
        self.accepted_warns()
        if self.msprobe:
            from .msprobe_view import require

            require()
        self.check_digests()
        check_out_dir(self.out)
        check_out_keeps_inputs(self)

    def check_digests(self) -> None:
        """``--golden-digest`` / ``--capture-digest``: 64 hex digits, and only beside the bundle they name."""
        from .bundle import parse_digest

        for flag, bundle, digest in (("--golden", self.golden, self.golden_digest),
                                     ("--capture", self.capture, self.capture_digest)):
            parse_digest(digest, f"{flag}-digest")
            if digest is not None and not bundle:
                raise InputError(f"{flag}-digest names a bundle's digest; give the bundle with {flag} too.")

    def run_overrides(self) -> dict[str, Any]:
        """The RunConfig fields these options set (guidance etc. only when given: RunConfig's defaults stay)."""
        fields: dict[str, Any] = {
            "transformer_file": self.transformer, "compile": self.compile, "fast": list(self.fast),
            "disable": list(self.disable), "offload": self.offload, "vae_tiling": self.vae_tiling,
            "parallel": self.parallel,
        }
        for name in ("num_frames", "guidance", "guidance_trunc", "true_cfg", "negative_prompt"):
            if getattr(self, name) is not None:
                fields[name] = getattr(self, name)
        return fields

    def check_run_options(self) -> None:
        """The shipped options, checked by RunConfig's own rules (seed, guidance, offload plan, negative
        prompt), the family's --fast/--disable names, and a --transformer that must be a file."""
        RunConfig(model=self.model, steps=self.steps, seed=self.seed, **self.run_overrides())
        if self.num_frames is not None and (not isinstance(self.num_frames, int) or self.num_frames < 1):
            raise InputError(f"--num-frames must be a whole number of at least 1, got {self.num_frames!r}.")
        if self.fast or self.disable:
            check_speed_names(family_of(self.model), list(self.disable), list(self.fast), self.compile)
        check_transformer_file(self.transformer)

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "op_overrides"}
        out["out"] = str(self.out)
        out["op_overrides"] = sorted(self.op_overrides) if self.op_overrides else []
        return out


def _check_input_file(path: str | Path, flag: str, hint: str) -> None:
    """A regular file (by the one reading rule: a FIFO or ``/dev/zero`` is named as what it is, never read)."""
    from ..runtime.reading import check_file

    p = Path(path)
    if p.is_dir():
        raise InputError(f"{flag} {p} is a folder; {hint}.")
    if not p.exists() and not p.is_symlink():
        raise InputError(f"{flag} {p} does not exist; {hint}.")
    try:
        check_file(p, what=f"{flag} {p}", error=InputError)
    except InputError as exc:
        raise InputError(f"{str(exc).rstrip('.')}; {hint}.") from None


def check_out_dir(out: str | Path) -> Path:
    """``--out`` must be a folder difforge can create or write into; checked before anything runs.

    An existing folder must be empty or a previous difforge report (see :mod:`.outdir`): anything
    else is refused, as the report would overwrite or mix with the user's own files.
    """
    path = Path(out)
    if str(out).strip() == "":
        raise InputError("--out is empty; give the folder the report should be written to.")
    if path.exists() and not path.is_dir():
        raise InputError(f"--out {path} is a file; give a folder for the report.")
    probe = path.absolute().parent  # the report is built beside DIR and renamed: its parent must be writable
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise InputError(f"--out {path} cannot be created: {probe} is a file, not a folder.")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise InputError(f"--out {path} is not writable: {probe} is not a writable folder.")
    check_writable_folder(path.absolute(), "--out")  # tried, not read from the mode bits (root passes those on /proc)
    if path.is_dir():  # new, empty or a previous report only: a user's own files are never overwritten
        try:
            ok = replaceable(path)
        except OSError as exc:
            raise InputError(f"--out {path} cannot be read ({exc.strerror or exc}).") from None
        if not ok:
            raise OutputError(refuse_message(path))
    return path


def _inputs(options: ValidateOptions) -> list[tuple[str, str, bool]]:
    """(flag, path, is a folder the report must not enter) of every file or folder a validation reads."""
    given: list[tuple[str, Any, bool]] = [
        ("--golden", options.golden, True), ("--capture", options.capture, True), ("--prompts", options.prompts, False),
        ("--prompt-set", options.prompt_set, False), ("--transformer", options.transformer, False),
        *(("--image", img, False) for img in options.images)]
    if options.model and Path(options.model).is_dir():  # a folder (not a built-in name): every file is hashed
        given.append(("--model", options.model, True))
    return [(flag, str(path), folder) for flag, path, folder in given if path]


def _kept_whole(flag: str, path: Path) -> bool:
    """A folder the report must not enter: the model folder, or a real bundle (a folder that is not one is
    refused as such when it is opened, with its own message)."""
    if flag == "--model":
        return True
    from .bundle import is_bundle_folder

    return is_bundle_folder(path)


def check_out_keeps_inputs(options: ValidateOptions) -> None:
    """``--out`` may not be, hold or lie inside what the run reads (OutputError, exit 2, before anything runs).

    The report is published by replacing ``--out`` whole, and a golden or capture bundle counts as a previous
    difforge folder: ``--golden G --out G`` would replace the bundle the report is judged against, ``--out``
    holding a ``--prompts`` file would delete it, and ``--out`` inside a bundle or model folder would add files to
    it, so its sha256 list no longer matches.  Paths are compared after every link is followed.
    """
    out = Path(os.path.realpath(options.out))
    for flag, given, folder in _inputs(options):
        path = Path(os.path.realpath(given))
        if path == out or out in path.parents:
            raise OutputError(f"--out {options.out} is or holds {flag} {given}, which the report would replace; "
                              "give the report its own folder.")
        if folder and path in out.parents and _kept_whole(flag, path):
            raise OutputError(f"--out {options.out} lies inside {flag} {given}; writing the report there would change "
                              "it, so give the report a folder outside it.")


def parse_reference(spec: str | None, flag: str = "--reference") -> tuple[str, str]:
    """``cpu:float32`` / ``cuda:1:bfloat16`` / ``cpu`` -> (device, dtype); dtype defaults to float32.

    ``None`` means the default (``cpu:float32``); an empty string or an unknown dtype is an InputError.
    """
    if spec is None:
        spec = "cpu:float32"
    text = str(spec).strip().lower()
    if not text:
        raise InputError(f"{flag} is empty; give a device and dtype, e.g. cpu:float32 or cuda:0:bfloat16.")
    head, sep, tail = text.rpartition(":")
    if not sep:
        device, dtype = text, "float32"
    elif not tail:
        raise InputError(f"{flag} '{spec}' ends with ':'; name a dtype after it, e.g. cpu:float32.")
    elif tail in DTYPES:
        device, dtype = head, dtype_name(DTYPES[tail])
    elif tail.isdigit():  # cuda:1, npu:0 (a device index, no dtype)
        device, dtype = text, "float32"
    else:
        raise InputError(f"{flag} '{spec}' names an unknown dtype '{tail}'; use float32, bfloat16 or float16, "
                         "e.g. cpu:float32.")
    if not device:
        raise InputError(f"{flag} '{spec}' needs a device, e.g. cpu:float32 or cuda:0:bfloat16.")
    return device, dtype


@dataclass
class ValidationResult:
    """What a validation concluded and where its report lies."""

    verdict: Verdict
    rungs: dict[str, RungResult]
    out_dir: Path
    report_paths: dict[str, Path] = field(default_factory=dict)
    #: Everything the report shows (environment, adaptations, benchmark, gallery ...), JSON-ready.
    data: dict[str, Any] = field(default_factory=dict)

    #: ``--fail-on``: "fail" (WARN exits 0) or "warn" (WARN exits 1 too).
    fail_on: str = "fail"

    @property
    def exit_code(self) -> int:
        """1 for FAIL (and for WARN under ``--fail-on warn``), else 0; bad usage never gets here: it
        raises DifforgeError, exit 2."""
        from .verdict import Verdict

        if self.verdict is Verdict.FAIL:
            return 1
        return 1 if (self.verdict is Verdict.WARN and self.fail_on == "warn") else 0

    def rung_verdicts(self) -> dict[str, str]:
        return {k: str(r.verdict) for k, r in self.rungs.items()}
