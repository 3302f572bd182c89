"""The state one validation shares between its rungs: options, the two parsed devices, inputs, the
output folder, and the precision floor.

The device under test and the reference are parsed here once into backends and dtypes; every load and
run goes through :mod:`difforge.engine` with those objects (so the backend that applied the env presets
is the one the report describes), and every family-specific question goes to the family's probe.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from .. import engine
from ..config import RunConfig
from ..devices import Backend, dtype_name, get_backend
from ..errors import DtypeError, SizeError
from ..models.registry import family_of, probe_class, probe_for
from ..runtime.atomic import atomic_save
from ..runtime.images import load_images, test_picture
from ..runtime.record import RunRecord
from .inputs import read_prompts
from .options import ValidateOptions, check_out_dir, parse_reference
from .outdir import StagedFolder
from .steps import StepTrace

QUICK_STEPS = 4
#: Side of the synthetic picture edits use when no --image is given.
SYNTHETIC_SIZE = 512
#: When the reference device refuses the device's dtype, the floor is built at the nearest one it runs.
NEAREST_DTYPES: dict[torch.dtype, tuple[torch.dtype, ...]] = {
    torch.float16: (torch.bfloat16,),
    torch.bfloat16: (torch.float16,),
}


def short_error(exc: BaseException) -> str:
    """An exception as one line for the report (class name and at most 300 characters)."""
    return f"{exc.__class__.__name__}: {' '.join(str(exc).split())[:300]}"


class Ladder:
    """State shared by the rungs of one validation."""

    def __init__(self, options: ValidateOptions) -> None:
        self.o = options
        self.out = Path(options.out)
        self.quick = options.quick
        self.rounds = min(options.rounds, 2) if self.quick else options.rounds
        self.warmup = min(options.warmup, 1) if self.quick else options.warmup
        ref_device, ref_dtype = parse_reference(options.reference)
        self.dut_backend: Backend = get_backend(options.device)
        self.dut_dtype: torch.dtype = self.dut_backend.resolve_dtype(options.dtype)
        self.ref_backend: Backend = get_backend(ref_device)
        self.ref_dtype: torch.dtype = self.ref_backend.resolve_dtype(ref_dtype)
        self.family = family_of(options.model)
        self.probe_type = probe_class(self.family)
        self.prompts = read_prompts(options.prompts) if options.prompts else list(self.probe_type.default_prompts)
        if self.quick:
            self.prompts = self.prompts[:1]
        self.images: list[Image.Image] = []
        self.image_paths: list[str] = [str(p) for p in options.images]
        self.files: list[Path] = []
        self.notes: list[str] = []
        #: Stages that failed outside the rungs (the gallery ...): each makes the verdict at least WARN.
        self.caveats: list[str] = []
        self.synthetic = False
        #: The report is written into a hidden sibling of DIR and renamed to DIR only when complete.
        self.staged = StagedFolder(self.out)
        #: Where this run's files go: the staging folder once make_out_dir() ran.
        self.work = self.out
        self.ref: Any = None
        self.floor_label = f"{self.ref_label.split()[0]} {dtype_name(self.dut_dtype)}"
        self.floor_dtype = self.dut_dtype
        self._probes: dict[int, Any] = {}

    # ---- labels ---------------------------------------------------------------------------------
    @property
    def dut_label(self) -> str:
        return f"{self.dut_backend.device} {dtype_name(self.dut_dtype)}"

    @property
    def ref_label(self) -> str:
        return f"{self.ref_backend.device} {dtype_name(self.ref_dtype)}"

    @property
    def same_place(self) -> bool:
        """Device under test and reference are one device: the floor is then the device itself."""
        return self.ref_backend.device == self.dut_backend.device

    @property
    def floor_is_dut(self) -> bool:
        return self.same_place and not self.o.op_overrides

    def probe(self, pipeline: Any) -> Any:
        """The family probe of ``pipeline`` (one per pipeline, so identity checks hold)."""
        key = id(pipeline)
        if key not in self._probes:
            self._probes[key] = probe_for(pipeline)
        return self._probes[key]

    # ---- configs --------------------------------------------------------------------------------
    def config(self, prompt: str, seed: int, backend: Backend, dtype: torch.dtype) -> RunConfig:
        steps = self.o.steps if self.o.steps is not None else (QUICK_STEPS if self.quick else None)
        return RunConfig(
            model=self.o.model, prompt=prompt, device=str(backend.device), dtype=dtype_name(dtype),
            height=self.o.height, width=self.o.width, steps=steps, seed=seed, images=list(self.image_paths),
            quiet=True, negative_prompt=self.probe_type.negative_prompt,
        )

    def dut_cfg(self, prompt: str | None = None, seed: int | None = None) -> RunConfig:
        return self.config(prompt or self.prompts[0], self.o.seed if seed is None else seed, self.dut_backend,
                           self.dut_dtype)

    def ref_cfg(self, cfg: RunConfig) -> RunConfig:
        return replace(cfg, device=str(self.ref_backend.device), dtype=dtype_name(self.ref_dtype))

    def floor_cfg(self, cfg: RunConfig) -> RunConfig:
        return replace(cfg, device=str(self.ref_backend.device), dtype=dtype_name(self.floor_dtype))

    # ---- inputs ---------------------------------------------------------------------------------
    def prepare_inputs(self) -> None:
        """Decode the input pictures (InputError for a bad one); nothing is written yet."""
        if not self.probe_type.takes_images:
            return
        if self.image_paths:
            self.images = load_images(self.image_paths)
            return
        self.images = [test_picture(SYNTHETIC_SIZE)]
        self.synthetic = True

    def save_inputs(self) -> None:
        """Once DIR exists: save the synthetic test picture the edits use (if any)."""
        if self.synthetic:
            path = self.save_image(self.images[0], "input_synthetic.png")
            self.image_paths = [str(path)]
            self.notes.append("no --image given: edits use a synthetic test picture (input_synthetic.png)")

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

    def floor_candidates(self) -> list[torch.dtype]:
        """Dtypes to build the floor at: the device's own, then the nearest ones (never the reference's)."""
        return [d for d in (self.dut_dtype, *NEAREST_DTYPES.get(self.dut_dtype, ())) if d != self.ref_dtype]

    def load_floor(self, same_place: bool) -> Any | None:
        """The reference device at the device's dtype (or the nearest it supports); None when none can run."""
        want = dtype_name(self.dut_dtype)
        ref_device = str(self.ref_backend.device)
        self.set_floor(f"{ref_device} {want}", dtype=self.dut_dtype)
        if same_place and not self.o.op_overrides:
            self.set_floor(self.floor_label, f"the precision floor ({self.floor_label}) is the device under test "
                           "itself: same device, same dtype, no op overrides, so its trajectory is reused")
            return None
        if self.dut_dtype == self.ref_dtype:
            self.set_floor(self.floor_label, f"device and reference share {dtype_name(self.ref_dtype)}: the floor "
                           "is the reference itself (zero), raised to the 1-level quantisation step")
            return self.ref
        refused: list[str] = []
        for dtype in self.floor_candidates():
            name = dtype_name(dtype)
            try:
                self.ref_backend.resolve_dtype(dtype)
            except DtypeError:
                refused.append(name)
                continue
            try:
                floor, _ = self.load(self.ref_backend, dtype)
            except Exception as exc:  # an OOM or crash here costs the floor, not the report
                self.set_floor(f"none ({ref_device} {name} failed to load)",
                               f"no precision floor: loading the reference at {name} failed ({short_error(exc)}); "
                               "the trajectory is judged only by an absolute bound, at best WARN")
                return None
            if name != want:
                self.set_floor(f"{ref_device} {name}, nearest to {want}",
                               f"{ref_device} does not run {want}, so the precision floor is built at {name}, the "
                               f"nearest dtype it supports: a looser floor than {want} would give", dtype=dtype)
            else:
                self.set_floor(f"{ref_device} {name}", dtype=dtype)
            return floor
        self.set_floor(f"none ({ref_device} runs none of {', '.join(refused) or want})",
                       f"no precision floor: {ref_device} runs neither {want} nor a nearby 16-bit dtype, so the "
                       "trajectory is judged only by an absolute bound (diffusers fp16 test), at best WARN")
        return None

    # ---- runs ---------------------------------------------------------------------------------------
    def load(self, backend: Backend, dtype: torch.dtype, overrides: dict | None = None) -> tuple[Any, RunRecord]:
        record = RunRecord(kind="edit" if self.probe_type.takes_images else "generate")
        cfg = self.config(self.prompts[0], self.o.seed, backend, dtype)
        pipe = engine.load_pipeline(self.o.model, backend, dtype, cfg=cfg, record=record, op_overrides=overrides)
        return pipe, record

    def run(self, pipe: Any, cfg: RunConfig, record: RunRecord | None = None,
            trace: StepTrace | None = None) -> tuple[list[Image.Image], RunRecord]:
        res = engine.run_pipeline(pipe, cfg, images=self.images or None, record=record,
                                  step_hook=trace.hook if trace is not None else None)
        return res.images, res.record
