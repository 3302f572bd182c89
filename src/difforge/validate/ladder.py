"""The state one validation shares between its rungs: options, the two parsed devices, inputs, the
output folder, and the precision floor.

The device under test and the reference are parsed here once into backends and dtypes; every load and
run goes through :mod:`difforge.engine` with those objects (so the backend that applied the env presets
is the one the report describes), and every family-specific question goes to the family's probe.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import MISSING, fields, replace
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from .. import engine
from ..config import RunConfig
from ..devices import DTYPES, Backend, dtype_name, get_backend
from ..errors import DtypeError, InputError, SizeError
from ..models.registry import (
    family_of,
    probe_class,
    probe_for,
    prompt_set_for,
    same_stream_names,
    validation_image,
    validation_prompts,
)
from ..runtime.atomic import atomic_save
from ..runtime.images import load_images, test_picture
from ..runtime.record import RunRecord
from ..shapes.prompts import load_prompt_set
from .floor import EmulatedPrecision, InPrecision, emulate
from .inputs import read_prompts
from .options import DUT_ONLY, ValidateOptions, check_out_dir, parse_reference
from .outdir import StagedFolder
from .semantic import FULL_N as FULL_SEMANTIC
from .semantic import QUICK_N as QUICK_SEMANTIC
from .steps import StepTrace

QUICK_STEPS = 4
#: Side of the synthetic picture edits use when no --image is given.
SYNTHETIC_SIZE = 512
#: The report's note on the input picture when no --image is given: the generic test picture, or (a trained edit
#: model) that model's own held-out source, saved under the same name.
SYNTHETIC_NOTE = "no --image given: edits use a synthetic test picture (input_synthetic.png)"
OWN_SOURCE_NOTE = "no --image given: edits use the model's own held-out source picture (input_synthetic.png)"
#: When the reference device refuses the device's dtype, the floor is built at the nearest one it runs.
NEAREST_DTYPES: dict[torch.dtype, tuple[torch.dtype, ...]] = {
    torch.float16: (torch.bfloat16,),
    torch.bfloat16: (torch.float16,),
}


#: RunConfig's defaults for the DUT_ONLY options: the plain path of the reference and the floor.
PLAIN_PATH: dict[str, Any] = {
    f.name: f.default_factory() if f.default is MISSING else f.default  # type: ignore[misc]
    for f in fields(RunConfig) if f.name in DUT_ONLY
}


class PlainSide:
    """A reference or floor probe: every RunConfig handed to it runs on the plain path (:meth:`Ladder.plain`).

    The rungs give all sides the device's RunConfig; a probe that configures its pipeline from it (Qwen's
    ``forward_step``) would otherwise switch the reference to the device's --fast/--offload/--compile.
    """

    def __init__(self, probe: Any, plain: Callable[[RunConfig], RunConfig]) -> None:
        self._probe = probe
        self._plain = plain

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._probe, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            args = tuple(self._plain(a) if isinstance(a, RunConfig) else a for a in args)
            kwargs = {k: self._plain(v) if isinstance(v, RunConfig) else v for k, v in kwargs.items()}
            return attr(*args, **kwargs)

        return call


def short_error(exc: BaseException) -> str:
    """An exception as one line for the report (class name and at most 300 characters)."""
    return f"{exc.__class__.__name__}: {' '.join(str(exc).split())[:300]}"


class Ladder:
    """State shared by the rungs of one validation."""

    #: Whether the device under test's runs go into a capture bundle (``capture.RecordingLadder``), which stores
    #: every distinct picture: the stages that would add optional runs (off-identity's one-by-one search) skip them.
    records_device_runs: bool = False

    def __init__(self, options: ValidateOptions, golden_ref: tuple[str, str] | None = None,
                 making_golden: bool = False, group: Any = None, dut_backend: Any = None) -> None:
        """``golden_ref``: (device, dtype) of a golden bundle's reference, which then stands for the
        reference (nothing of it runs here); ``making_golden``: ``difforge golden`` runs the reference
        side for a device elsewhere, so a same-dtype "device" is not a self-comparison; ``group``:
        ``--parallel cfg``, the process group whose rank 1 follows the device under test's runs
        (:mod:`.split`); the device under test is then this rank's device (from ``LOCAL_RANK``);
        ``dut_backend``: the device under test as a capture measured it (``validate --capture``,
        :class:`~.captured.CapturedBackend`): that device is not on this machine."""
        self.o = options
        self.group = group
        self.golden_ref = golden_ref
        #: The default random stream of the device under test's backend (``difforge golden --for-device``
        #: sets the one of the device the bundle is for); the reference and floor draw from the same.
        self.stream_default = ""
        self.out = Path(options.out)
        self.quick = options.quick
        self.rounds = min(options.rounds, 2) if self.quick else options.rounds
        self.warmup = min(options.warmup, 1) if self.quick else options.warmup
        ref_device, ref_dtype = parse_reference(options.reference)
        self.dut_backend: Backend = (dut_backend if dut_backend is not None else
                                     group.backend if group is not None else get_backend(options.device))
        self.dut_dtype: torch.dtype = self.dut_backend.resolve_dtype(options.dtype)
        self.stream_default = self.dut_backend.random_stream
        self.ref_backend: Backend = get_backend(ref_device)
        self.ref_dtype: torch.dtype = self.ref_backend.resolve_dtype(ref_dtype)
        self.family = family_of(options.model)
        self.probe_type = probe_class(self.family)
        own = validation_prompts(options.model)
        #: A built-in trained model validates on its own prompts (and its own default negative prompt).
        self.own_prompts = own is not None
        self.prompts = (read_prompts(options.prompts) if options.prompts else own or list(self.probe_type.default_prompts))
        #: What --quick lowered ("steps 25 -> 4" ...), only what it changed; the report lists it.
        self.quick_reductions: list[str] = []
        if self.quick:
            family_steps = getattr(self.probe_type, "default_steps", None) or "the family default"
            steps = (family_steps, QUICK_STEPS) if options.steps is None else (options.steps, options.steps)
            for what, asked, ran in (("steps", *steps), ("prompts", len(self.prompts), min(len(self.prompts), 1)),
                                     ("rounds", options.rounds, self.rounds), ("warmup", options.warmup, self.warmup)):
                if asked != ran:
                    self.quick_reductions.append(f"{what} {asked} -> {ran}")
            self.prompts = self.prompts[:1]
        #: The semantic rung's prompts with expected attributes: --prompt-set, else the model's own (the
        #: shapes models' held-out sets), else none (the rung is skipped, which costs no verdict).
        n_semantic = QUICK_SEMANTIC if self.quick else FULL_SEMANTIC
        self.prompt_set = (load_prompt_set(options.prompt_set) if options.prompt_set
                           else prompt_set_for(options.model, n_semantic))
        if self.prompt_set is not None and self.quick and len(self.prompt_set.items) > n_semantic:
            self.quick_reductions.append(f"semantic prompts {len(self.prompt_set.items)} -> {n_semantic}")
        if self.prompt_set is not None and self.prompt_set.kind == "edit" and not self.probe_type.takes_images:
            raise InputError(f"--prompt-set holds edits, but {options.model} generates from text; give a caption set.")
        self.images: list[Image.Image] = []
        self.image_paths: list[str] = [str(p) for p in options.images]
        self.files: list[Path] = []
        self.notes: list[str] = []
        #: Stages that failed outside the rungs (the gallery ...): each makes the verdict at least WARN.
        self.caveats: list[str] = []
        self.synthetic = False
        self.own_source = False  # the synthetic input is the trained model's own held-out source picture
        #: The report is written into a hidden sibling of DIR and renamed to DIR only when complete.
        self.staged = StagedFolder(self.out)
        #: Where this run's files go: the staging folder once make_out_dir() ran.
        self.work = self.out
        self.ref: Any = None
        self.floor_label = f"{self.ref_label.split()[0]} {dtype_name(self.dut_dtype)}"
        self.floor_dtype = self.dut_dtype
        #: The emulated floor's pipeline and its rounding (None: a real floor, the reference, or none).
        self.floor_pipe: Any = None
        self.floor_backend: Backend = self.ref_backend
        self.emulation: EmulatedPrecision | None = None
        self._probes: dict[int, Any] = {}
        #: Pipelines loaded on the plain path (reference, floor): their probes run plain configs.
        self._plain_sides: set[int] = set()
        self.self_compare = not making_golden and self.same_place and (
            dtype_name(self.dut_dtype) == (golden_ref[1] if golden_ref else dtype_name(self.ref_dtype)))
        if self.self_compare and not options.allow_self_compare:
            raise InputError(
                f"--device {options.device} --dtype {options.dtype} is the reference itself ({self.ref_label}): a "
                "validation would compare it with itself and prove nothing about a port; give the dtype or device "
                "under test (e.g. --dtype bfloat16), or --allow-self-compare to run it anyway (reported as not a "
                "port test)."
            )

    # ---- labels ---------------------------------------------------------------------------------
    @property
    def dut_label(self) -> str:
        return f"{self.dut_backend.device} {dtype_name(self.dut_dtype)}"

    @property
    def ref_label(self) -> str:
        if self.golden_ref is not None:
            return f"{self.golden_ref[0]} {self.golden_ref[1]} (golden bundle)"
        return f"{self.ref_backend.device} {dtype_name(self.ref_dtype)}"

    @property
    def same_place(self) -> bool:
        """Device under test and reference are one device: the floor is then the device itself."""
        if self.golden_ref is not None:
            return self.golden_ref[0] == str(self.dut_backend.device)
        return self.ref_backend.device == self.dut_backend.device

    def probe(self, pipeline: Any) -> Any:
        """The family probe of ``pipeline`` (one per pipeline, so identity checks hold); the emulated
        floor's probe runs every call inside its rounding."""
        key = id(pipeline)
        if key not in self._probes:
            # a capture's stand-in pipeline (validate --capture) brings its own probe over the bundle
            probe = getattr(pipeline, "captured_probe", None) or probe_for(pipeline)
            if self.emulation is not None and pipeline is self.floor_pipe:
                probe = InPrecision(probe, self.emulation)
            if key in self._plain_sides:
                probe = PlainSide(probe, self.plain)
            elif self.group is not None:  # the device's own probe steps (no pipeline call) run on this rank alone
                probe = PlainSide(probe, lambda cfg: replace(cfg, parallel="none"))
            self._probes[key] = probe
        return self._probes[key]

    # ---- configs --------------------------------------------------------------------------------
    def config(self, prompt: str, seed: int, backend: Backend, dtype: torch.dtype) -> RunConfig:
        """The device under test's run: every shipped option (the DUT_ONLY ones too); see :meth:`plain`."""
        steps = self.o.steps if self.o.steps is not None else (QUICK_STEPS if self.quick else None)
        # a built-in trained model (its own validation prompts) keeps its pipeline's negative prompt, as generate does:
        # the family's (URSA's seed sentence) is words it never saw - a warning and a note on every clean run
        negative = None if self.own_prompts else self.probe_type.negative_prompt
        shipped = {"negative_prompt": negative, **self.o.run_overrides()}
        return RunConfig(
            model=self.o.model, prompt=prompt, device=str(backend.device), dtype=dtype_name(dtype),
            height=self.o.height, width=self.o.width, steps=steps, seed=seed, images=list(self.image_paths),
            quiet=True, **shipped,
        )

    def plain(self, cfg: RunConfig) -> RunConfig:
        """``cfg`` with the DUT_ONLY options (compile, fast, disable, offload, VAE tiling) at RunConfig's
        defaults: the plain path the reference and the floor run.  Everything that changes what is
        computed (--transformer, guidance, negative prompt, frames, size, steps) stays, and so does the
        random stream: the reference and floor draw from the stream the device under test draws from
        (an accelerator's default Philox stream on a CPU reference too), so the trajectories are comparable."""
        disable, fast = self.stream_names()
        return replace(cfg, **{**PLAIN_PATH, "disable": disable, "fast": fast})

    def stream_names(self) -> tuple[list[str], list[str]]:
        """The (--disable, --fast) names that put a side on the device under test's random stream."""
        return same_stream_names(self.family, self.stream_default, self.o.disable, self.o.fast)

    def dut_cfg(self, prompt: str | None = None, seed: int | None = None) -> RunConfig:
        return self.config(prompt or self.prompts[0], self.o.seed if seed is None else seed, self.dut_backend,
                           self.dut_dtype)

    def ref_cfg(self, cfg: RunConfig) -> RunConfig:
        return replace(self.plain(cfg), device=str(self.ref_backend.device), dtype=dtype_name(self.ref_dtype))

    def floor_cfg(self, cfg: RunConfig) -> RunConfig:
        return replace(self.plain(cfg), device=str(self.floor_backend.device), dtype=dtype_name(self.floor_dtype))

    # ---- inputs ---------------------------------------------------------------------------------
    def prepare_inputs(self) -> None:
        """Decode the input pictures (InputError for a bad one); nothing is written yet."""
        if not self.probe_type.takes_images:
            return
        if self.image_paths:
            self.images = load_images(self.image_paths)
            return
        own = validation_image(self.o.model)  # a trained edit model's own held-out source, else the generic one
        self.images = [own if own is not None else test_picture(SYNTHETIC_SIZE)]
        self.synthetic, self.own_source = True, own is not None

    def save_inputs(self) -> None:
        """Once DIR exists: save the synthetic test picture the edits use, or copy the user's pictures (their
        bytes, so the deliverables hold exactly what was tested, hashed in SHA256SUMS)."""
        if self.synthetic:
            path = self.save_image(self.images[0], "input_synthetic.png")
            self.image_paths = [str(path)]
            self.notes.append(OWN_SOURCE_NOTE if self.own_source else SYNTHETIC_NOTE)
            return
        for k, src in enumerate(self.image_paths):
            target = self.work / "images" / f"input_{k}{Path(src).suffix.lower() or '.png'}"
            target.parent.mkdir(parents=True, exist_ok=True)
            atomic_save(target, lambda tmp, src=src: shutil.copyfile(src, tmp))
            self.files.append(target)

    def check_size(self, pipe: Any) -> None:
        """Height/width must be positive multiples of the model's stride: a SizeError before DIR exists."""
        multiple = int(self.probe(pipe).size_multiple)
        for flag, value in (("--height", self.o.height), ("--width", self.o.width)):
            if value is not None and (value <= 0 or value % multiple):
                near = max(multiple, round(value / multiple) * multiple)
                raise SizeError(f"{flag} must be a positive multiple of {multiple} for this model, got {value}; "
                                f"try {near}.")

    # ---- the output folder ------------------------------------------------------------------------
    def make_out_dir(self) -> None:
        """Create the staging folder beside DIR (only once every input has been checked)."""
        check_out_dir(self.out)
        self.work = self.staged.create()

    def discard_output(self) -> None:
        """The run failed or was interrupted: remove the staging folder and the parents this run made.

        DIR itself (a previous report, an empty folder) was never touched, so nothing else to undo.
        """
        self.staged.discard()
        self.work = self.out

    def publish(self) -> None:
        """Move the finished report to DIR; the paths this run noted follow it."""
        work = self.work
        self.staged.publish()
        self.work = self.out
        self.files = [self.out / p.relative_to(work) for p in self.files]

    def save_image(self, img: Image.Image, name: str, record: RunRecord | None = None) -> Path:
        path = self.work / "images" / name

        def write() -> None:
            atomic_save(path, lambda tmp: img.save(tmp, format="PNG"))

        if record is not None:
            with record.phase("save"):
                write()
        else:
            write()
        self.files.append(path)
        return path

    # ---- the noise floor ----------------------------------------------------------------------------
    def set_floor(self, label: str, note: str | None = None, dtype: torch.dtype | None = None) -> None:
        """The one place the floor's label, dtype and the note saying why are changed."""
        self.floor_label = label
        if dtype is not None:
            self.floor_dtype = dtype
        if note:
            self.notes.append(note)

    def no_floor(self, why: str) -> None:
        self.set_floor(f"none ({why})", f"no precision floor: {why}; the trajectory is judged only by an absolute "
                                        "bound, at best WARN")

    def load_floor(self, dut: Any) -> Any | None:
        """The pipeline whose distance from the reference is what the device's dtype alone costs.

        Never the device under test: the same device, dtype and kernels would vouch for themselves.
        In order: a self-comparison (allowed explicitly) has none; a device computing in the
        reference's dtype is held to the reference itself (zero, raised to the 1-level quantisation
        step); ``--floor DEVICE[:DTYPE]`` loads a second real device; otherwise the floor is emulated
        (:mod:`.floor`): the reference's float32 kernels, rounding like the device.
        """
        want = dtype_name(self.dut_dtype)
        if self.self_compare:
            self.set_floor("none (self-comparison: not a port test)",
                           f"self-comparison asked for (--allow-self-compare): {self.dut_label} is the reference "
                           "itself, so this report is not a port test")
            return None
        if self.dut_dtype == self.ref_dtype:
            self.set_floor(f"{self.ref_label} (the reference itself)",
                           f"device and reference share {dtype_name(self.ref_dtype)}: the floor is the reference "
                           "itself (zero), raised to the 1-level quantisation step")
            return self.ref
        if self.o.floor is not None:
            return self._real_floor()
        try:
            pipe, _ = self.load(self.ref_backend, self.ref_dtype)
            plan = getattr(self.probe(dut), "dtype_plan", None)  # a capture: the plan the device held
            self.emulation = (EmulatedPrecision(probe_for(pipe).modules(), plan) if plan is not None
                              else emulate(probe_for(pipe), self.probe(dut)))
        except Exception as exc:  # an OOM or crash here costs the floor, not the report
            self.no_floor(f"the emulated floor failed to load ({short_error(exc)})")
            return None
        self.floor_pipe = pipe
        self._probes.pop(id(pipe), None)
        emulated = ", ".join(self.emulation.emulated_dtypes) or want
        self.set_floor(f"emulated {emulated} on {self.ref_label} kernels",
                       f"the precision floor is emulated: the reference's {dtype_name(self.ref_dtype)} kernels with "
                       f"every weight and module output rounded to the dtype the device holds it in ({emulated}); "
                       "it shares no kernel with the device under test", dtype=self.ref_dtype)
        return pipe

    def _real_floor(self) -> Any | None:
        """``--floor DEVICE[:DTYPE]``: a second real device at the device's dtype (or the one named), or the
        nearest dtype that device runs."""
        spec = str(self.o.floor)
        device, named = parse_reference(spec, flag="--floor")
        backend = get_backend(device)
        named_dtype = spec.strip().lower().rpartition(":")[2] in DTYPES
        first = backend.resolve_dtype(named) if named_dtype else self.dut_dtype
        want = dtype_name(first)
        candidates = [d for d in (first, *NEAREST_DTYPES.get(first, ())) if d != self.ref_dtype]
        refused: list[str] = []
        for dtype in candidates:
            name = dtype_name(dtype)
            try:
                backend.resolve_dtype(dtype)
            except DtypeError:
                refused.append(name)
                continue
            try:
                floor, _ = self.load(backend, dtype)
            except Exception as exc:  # an OOM or crash here costs the floor, not the report
                self.no_floor(f"loading the floor {backend.device} {name} failed ({short_error(exc)})")
                return None
            self.floor_backend = backend
            if name != want:
                self.set_floor(f"{backend.device} {name}, nearest to {want}",
                               f"{backend.device} does not run {want}, so the precision floor is built at {name}, "
                               f"the nearest dtype it supports: a looser floor than {want} would give", dtype=dtype)
            else:
                self.set_floor(f"{backend.device} {name} (--floor)", f"the precision floor is a second device: "
                               f"{backend.device} {name}", dtype=dtype)
            return floor
        self.no_floor(f"{backend.device} runs none of {', '.join(refused) or want}")
        return None

    # ---- runs ---------------------------------------------------------------------------------------
    def load(self, backend: Backend, dtype: torch.dtype, overrides: dict | None = None,
             dut: bool = False) -> tuple[Any, RunRecord]:
        """Load one side: ``dut=True`` the device under test with every shipped option; otherwise (the
        reference, either floor) the plain path, and its probe is given plain configs too (the rungs hand
        every probe the device's RunConfig)."""
        record = RunRecord(kind="edit" if self.probe_type.takes_images else "generate")
        cfg = self.config(self.prompts[0], self.o.seed, backend, dtype)
        if not dut:
            cfg = self.plain(cfg)
        pipe = engine.load_pipeline(self.o.model, backend, dtype, cfg=cfg, record=record, op_overrides=overrides)
        if not dut:
            self._plain_sides.add(id(pipe))
        return pipe, record

    def run(self, pipe: Any, cfg: RunConfig, record: RunRecord | None = None,
            trace: StepTrace | None = None, images: list[Image.Image] | None = None,
            ) -> tuple[list[Image.Image], RunRecord]:
        """One run of ``pipe`` (the floor's under its emulation); ``images``: input pictures of this run
        only (a semantic edit's source), else the validation's.  A device-under-test run of a ``--parallel
        cfg`` validation (``cfg.parallel``) is split with the follower rank (:func:`.split.lead`)."""
        replay = getattr(pipe, "replay_run", None)
        if replay is not None:  # validate --capture: the device's run of this config, as it made it
            return replay(cfg, record, trace, images)
        if self.group is not None and cfg.parallel != "none":
            from .split import lead

            res = lead(self.group, pipe, cfg, images or self.images or None, record,
                       trace.hook if trace is not None else None)
            return res.images, res.record
        emulated = self.emulation is not None and pipe is self.floor_pipe
        with self.emulation.active() if emulated else nullcontext():  # type: ignore[union-attr]
            res = engine.run_pipeline(pipe, cfg, images=images or self.images or None, record=record,
                                      step_hook=trace.hook if trace is not None else None)
        return res.images, res.record
