"""The acceptance ladder, top to bottom: load, smoke, determinism, benchmark, operator, component,
teacher-forced steps, trajectory, gallery, then the report.

Pipelines run through :mod:`difforge.api`; every timing comes from their RunRecords.  A crash inside
a rung fails that rung (with the error in the report) instead of losing the whole report; user
mistakes (bad device, bad path) still raise DifforgeError before anything runs.
"""

from __future__ import annotations

import shlex
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from rich.console import Console

from ..config import RunConfig
from ..devices import dtype_name, get_backend
from ..errors import DeviceOutOfMemoryError, DifforgeError, DtypeError, SizeError
from ..models.registry import URSA, resolve_model
from ..runtime.atomic import atomic_save
from ..runtime.record import RunRecord
from .bench import bench_rung
from .components import component_rung
from .determinism import determinism_rung
from .environment import fingerprint
from .gallery import contact_sheet, pair
from .inputs import URSA_NEGATIVE, default_prompts, read_prompts, synthetic_image
from .operators import operator_rung
from .options import RUNGS, ValidateOptions, ValidationResult, check_out_dir, parse_reference
from .outdir import StagedFolder
from .smoke import smoke_rung
from .steps import StepTrace, step_rung
from .trajectory import TrajectoryRun, trajectory_rung
from .verdict import RungResult, Verdict, overall

QUICK_STEPS = 4
#: When the reference device refuses the device's dtype, the floor is built at the nearest one it runs.
NEAREST_DTYPES: dict[torch.dtype, tuple[torch.dtype, ...]] = {
    torch.float16: (torch.bfloat16,),
    torch.bfloat16: (torch.float16,),
}


def _short(exc: BaseException) -> str:
    return f"{exc.__class__.__name__}: {' '.join(str(exc).split())[:300]}"


class _Progress:
    """One line per stage on stderr (rich), silent when quiet."""

    def __init__(self, quiet: bool, total: int) -> None:
        self.console = None if quiet else Console(file=sys.stderr)
        self.total = total
        self.n = 0

    def start(self, what: str) -> float:
        self.n += 1
        if self.console is not None:
            self.console.print(f"[bold][{self.n}/{self.total}][/bold] {what} ...", highlight=False)
        return time.perf_counter()

    def done(self, rung: RungResult | None, t0: float, note: str = "") -> float:
        dt = time.perf_counter() - t0
        if self.console is not None:
            if rung is not None:
                colour = {"PASS": "green", "WARN": "yellow", "FAIL": "red"}.get(str(rung.verdict), "dim")
                self.console.print(f"      [{colour}]{rung.verdict}[/{colour}] {rung.key} ({dt:.1f} s) "
                                   f"{rung.summary}", highlight=False)
            else:
                self.console.print(f"      done ({dt:.1f} s) {note}", highlight=False)
        return dt


def _guard(key: str, fn: Callable[[], RungResult]) -> RungResult:
    """Run one rung; an exception fails it (NotImplementedError: the pipeline lacks the hook -> SKIP)."""
    t0 = time.perf_counter()
    try:
        result = fn()
    except DeviceOutOfMemoryError as exc:
        result = RungResult(key, Verdict.FAIL, f"out of memory: {exc}", data={"error": str(exc)})
    except NotImplementedError as exc:
        result = RungResult(key, Verdict.SKIP, f"not available for this pipeline: {exc}")
    except Exception as exc:  # a crash on the device is a failed rung, not a lost report
        msg = f"{exc.__class__.__name__}: {' '.join(str(exc).split())[:300]}"
        result = RungResult(key, Verdict.FAIL, f"error: {msg}",
                            data={"error": msg, "traceback": traceback.format_exc(limit=8)})
    result.seconds = time.perf_counter() - t0
    return result


def _reproduce(options: ValidateOptions) -> list[str]:
    """The exact command line that re-runs this validation."""
    args = ["difforge", "validate", "--model", options.model, "--device", options.device, "--dtype",
            options.dtype, "--reference", options.reference]
    for img in options.images:
        args += ["--image", str(img)]
    if options.prompts:
        args += ["--prompts", str(options.prompts)]
    for flag, value in (("--steps", options.steps), ("--height", options.height), ("--width", options.width)):
        if value is not None:
            args += [flag, str(value)]
    args += ["--rounds", str(options.rounds), "--warmup", str(options.warmup), "--seed", str(options.seed)]
    if options.quick:
        args.append("--quick")
    args += ["--lang", options.lang, "--out", str(options.out)]
    return [shlex.join(args)]


class Ladder:
    """State shared by the rungs of one validation."""

    def __init__(self, options: ValidateOptions) -> None:
        from .. import api

        self.api = api
        self.o = options
        self.out = Path(options.out)
        self.quick = options.quick
        self.rounds = min(options.rounds, 2) if self.quick else options.rounds
        self.warmup = min(options.warmup, 1) if self.quick else options.warmup
        self.ref_device, self.ref_dtype = parse_reference(options.reference)
        self.dut_backend = get_backend(options.device)
        self.dut_dtype = self.dut_backend.resolve_dtype(options.dtype)
        self.ref_backend = get_backend(self.ref_device)
        self.ref_torch_dtype = self.ref_backend.resolve_dtype(self.ref_dtype)
        _, self.family = resolve_model(options.model)
        self.prompts = read_prompts(options.prompts) if options.prompts else default_prompts(self.family)
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
        self.floor_label = f"{self.ref_device} {dtype_name(self.dut_dtype)}"
        self.floor_dtype = dtype_name(self.dut_dtype)

    # ---- configs ------------------------------------------------------------------------------
    def config(self, prompt: str, seed: int, device: str, dtype: str) -> RunConfig:
        steps = self.o.steps if self.o.steps is not None else (QUICK_STEPS if self.quick else None)
        return RunConfig(
            model=self.o.model, prompt=prompt, device=device, dtype=dtype, height=self.o.height,
            width=self.o.width, steps=steps, seed=seed, images=list(self.image_paths), quiet=True,
            negative_prompt=URSA_NEGATIVE if self.family == URSA else None,
        )

    def dut_cfg(self, prompt: str | None = None, seed: int | None = None) -> RunConfig:
        return self.config(prompt or self.prompts[0], self.o.seed if seed is None else seed, self.o.device,
                           dtype_name(self.dut_dtype))

    def ref_cfg(self, cfg: RunConfig) -> RunConfig:
        return replace(cfg, device=self.ref_device, dtype=self.ref_dtype)

    # ---- inputs --------------------------------------------------------------------------------
    def prepare_inputs(self) -> None:
        """Decode the input pictures (InputError for a bad one); nothing is written yet."""
        if self.family == URSA:
            return
        if self.image_paths:
            self.images = self.api.load_images(self.image_paths)
            return
        self.images = [synthetic_image()]
        self.synthetic = True

    def save_inputs(self) -> None:
        """Once DIR exists: save the synthetic test picture the edits use (if any)."""
        if self.synthetic:
            path = self.save_image(self.images[0], "input_synthetic.png")
            self.image_paths = [str(path)]
            self.notes.append("no --image given: edits use a synthetic test picture (input_synthetic.png)")

    def check_size(self, pipe: Any) -> None:
        """Height/width must be positive multiples of the model's stride: a SizeError before DIR exists."""
        multiple = int(pipe.spatial_stride if self.family == URSA else pipe.size_multiple)
        for flag, value in (("--height", self.o.height), ("--width", self.o.width)):
            if value is not None and (value <= 0 or value % multiple):
                near = max(multiple, round(value / multiple) * multiple)
                raise SizeError(f"{flag} must be a positive multiple of {multiple} for this model, got {value}; "
                                f"try {near}.")

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

    # ---- the noise floor -------------------------------------------------------------------------
    def floor_candidates(self) -> list[torch.dtype]:
        """Dtypes to build the floor at: the device's own, then the nearest ones (never the reference's)."""
        return [d for d in (self.dut_dtype, *NEAREST_DTYPES.get(self.dut_dtype, ())) if d != self.ref_torch_dtype]

    def load_floor(self, same_place: bool) -> Any | None:
        """The reference device at the device's dtype (or the nearest it supports); None when none can run.

        Sets ``floor_label``/``floor_dtype`` and says in the notes what was built and why.
        """
        want = dtype_name(self.dut_dtype)
        self.floor_dtype = want
        self.floor_label = f"{self.ref_device} {want}"
        if same_place and not self.o.op_overrides:
            self.notes.append(f"the precision floor ({self.floor_label}) is the device under test itself: same "
                              "device, same dtype, no op overrides, so its trajectory is reused")
            return None
        if self.dut_dtype == self.ref_torch_dtype:
            self.notes.append(f"device and reference share {self.ref_dtype}: the floor is the reference itself "
                              "(zero), raised to the 1-level quantisation step")
            return self.ref
        refused: list[str] = []
        for dtype in self.floor_candidates():
            name = dtype_name(dtype)
            try:
                self.ref_backend.resolve_dtype(name)
            except DtypeError:
                refused.append(name)
                continue
            try:
                floor, _ = self.load(self.ref_device, name)
            except Exception as exc:  # an OOM or crash here costs the floor, not the report
                self.notes.append(f"no precision floor: loading the reference at {name} failed ({_short(exc)}); "
                                  "the trajectory is judged only by an absolute bound, at best WARN")
                self.floor_label = f"none ({self.ref_device} {name} failed to load)"
                return None
            self.floor_dtype = name
            if name != want:
                self.floor_label = f"{self.ref_device} {name}, nearest to {want}"
                self.notes.append(f"{self.ref_device} does not run {want}, so the precision floor is built at "
                                  f"{name}, the nearest dtype it supports: a looser floor than {want} would give")
            else:
                self.floor_label = f"{self.ref_device} {name}"
            return floor
        self.floor_label = f"none ({self.ref_device} runs none of {', '.join(refused) or want})"
        self.notes.append(f"no precision floor: {self.ref_device} runs neither {want} nor a nearby 16-bit dtype, so "
                          "the trajectory is judged only by an absolute bound (diffusers fp16 test), at best WARN")
        return None

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

    # ---- runs ----------------------------------------------------------------------------------
    def load(self, device: str, dtype: str, overrides: dict | None = None) -> tuple[Any, RunRecord]:
        record = RunRecord(kind="generate" if self.family == URSA else "edit")
        cfg = self.config(self.prompts[0], self.o.seed, device, dtype)
        pipe = self.api.load_pipeline(self.o.model, device, dtype, cfg=cfg, record=record, op_overrides=overrides)
        return pipe, record

    def run(self, pipe: Any, cfg: RunConfig, record: RunRecord | None = None,
            trace: StepTrace | None = None) -> tuple[list[Image.Image], RunRecord]:
        res = self.api.run_pipeline(pipe, cfg, images=self.images or None, record=record,
                                    step_hook=trace.hook if trace is not None else None)
        return res.images, res.record


def run_validation(options: ValidateOptions) -> ValidationResult:
    """Run the whole ladder on ``options`` and write the report into ``options.out``.

    Every user mistake (bad flag, prompts file, image, size, ``--out``) raises DifforgeError before
    ``DIR`` is created; the device-under-test pipeline is loaded first so its size check runs before
    the reference is loaded.
    """
    options.check()
    lad = Ladder(options)
    prog = _Progress(options.quiet, total=10)
    data: dict[str, Any] = {"options": options.to_dict(), "family": lad.family, "notes": lad.notes}
    seeds = [options.seed, *[s for s in options.extra_seeds if s != options.seed]]

    # 1. load -----------------------------------------------------------------------------------
    t0 = prog.start(f"load {options.model} on {lad.dut_backend} {dtype_name(lad.dut_dtype)} and reference "
                    f"{lad.ref_device} {lad.ref_dtype}")
    lad.prepare_inputs()
    dut_error: str | None = None
    dut = None
    dut_record = RunRecord(kind="generate" if lad.family == URSA else "edit")
    try:
        dut, dut_record = lad.load(options.device, dtype_name(lad.dut_dtype), options.op_overrides)
    except DeviceOutOfMemoryError as exc:
        dut_error = str(exc)
    except DifforgeError:
        raise
    except Exception as exc:
        dut_error = f"{exc.__class__.__name__}: {exc}"
    if dut is not None:
        lad.check_size(dut)
    ref_error: str | None = None
    ref_record = RunRecord(kind=dut_record.kind)
    try:
        lad.ref, ref_record = lad.load(lad.ref_device, lad.ref_dtype)
    except DeviceOutOfMemoryError as exc:
        ref_error = str(exc)
    except DifforgeError:
        raise
    except Exception as exc:  # the reference crashing costs the rungs that need it, not the report
        ref_error = _short(exc)
    ref = lad.ref
    if dut is None and ref is not None:
        lad.check_size(ref)
    lad.make_out_dir()
    try:
        return _climb(lad, prog, t0, data, seeds, dut, dut_record, dut_error, ref, ref_record, ref_error)
    except BaseException:  # a user error, a crash, Ctrl-C or SIGTERM: no half-filled report, no stray folder
        lad.discard_output()
        raise


def _not_run(key: str, why: str) -> RungResult:
    return RungResult(key, Verdict.FAIL, f"not run: {why}", data={"error": why})


def _climb(lad: Ladder, prog: _Progress, t0: float, data: dict[str, Any], seeds: list[int], dut: Any,
           dut_record: RunRecord, dut_error: str | None, ref: Any, ref_record: RunRecord, ref_error: str | None,
           ) -> ValidationResult:
    """Everything after the inputs were checked and DIR made: floor, rungs, gallery, report."""
    options = lad.o
    rungs: dict[str, RungResult] = {}
    lad.save_inputs()
    same_place = lad.ref_backend.device == lad.dut_backend.device
    floor = None
    if ref is None:
        lad.notes.append(f"the reference ({lad.ref_device} {lad.ref_dtype}) could not be loaded: {ref_error}")
        lad.floor_label = "none (the reference could not be loaded)"
    elif dut is not None:
        floor = lad.load_floor(same_place)
    floor_label = lad.floor_label
    prog.done(None, t0)

    # 2. smoke ------------------------------------------------------------------------------------
    t0 = prog.start("smoke")
    cfg0 = lad.dut_cfg()
    smoke_trace = StepTrace()
    smoke_images: list[Image.Image] = []
    if dut is not None and dut_error is None:
        try:
            smoke_images, dut_record = lad.run(dut, cfg0, record=dut_record, trace=smoke_trace)
            lad.save_image(smoke_images[0], f"device_seed{cfg0.seed}.png", dut_record)
        except DifforgeError as exc:
            if not isinstance(exc, DeviceOutOfMemoryError):
                raise
            dut_error = str(exc)
        except Exception as exc:
            dut_error = _short(exc)
    rungs["smoke"] = smoke_rung(dut_record, smoke_images, smoke_trace.final() or None, dut_error)
    prog.done(rungs["smoke"], t0)
    data["adaptations"] = [vars(a) for a in dut_record.adaptations]
    data["reference_adaptations"] = [vars(a) for a in ref_record.adaptations]
    data["dut_record"] = dut_record.to_dict()

    if rungs["smoke"].verdict is Verdict.FAIL:
        for key in RUNGS[1:]:
            rungs[key] = RungResult(key, Verdict.SKIP, "skipped: the smoke run failed")
        return _finish(lad, rungs, data, prog, seeds)

    # 3. determinism + benchmark -----------------------------------------------------------------------
    t0 = prog.start(f"benchmark ({lad.warmup} warm-up, {lad.rounds} timed rounds)")
    bench_records: list[RunRecord] = []
    runs_images = [smoke_images]

    def bench() -> RungResult:
        for _ in range(lad.warmup):
            lad.run(dut, cfg0)
        for _ in range(lad.rounds):
            imgs, rec = lad.run(dut, cfg0, record=RunRecord(kind=dut_record.kind))
            bench_records.append(rec)
            runs_images.append(imgs)
        try:
            flops = dut.flops_per_step(cfg0)
        except (NotImplementedError, AttributeError):
            flops = None
        steps = len(smoke_trace.inputs)
        return bench_rung(bench_records, lad.warmup, flops, lad.dut_backend.device_name(), lad.dut_dtype, steps)

    rungs["benchmark"] = _guard("benchmark", bench)
    rungs["determinism"] = determinism_rung(runs_images)
    prog.done(rungs["benchmark"], t0)

    # 4. reference and floor runs (one per seed) ----------------------------------------------------------
    t0 = prog.start(f"reference runs on {lad.ref_device} {lad.ref_dtype} (seeds {seeds})")
    runs = _RefRuns(seeds)
    if ref is None:
        runs.error = f"the reference could not be loaded ({ref_error})"
    else:
        try:
            _reference_runs(lad, dut, ref, floor, same_place, smoke_images, smoke_trace, runs)
        except Exception as exc:  # an OOM or crash here fails the rungs that need these runs, not the report
            runs.error = f"{runs.stage} failed ({_short(exc)})"
    if runs.floor_error is not None:
        floor = None
        lad.notes.append(f"no precision floor: {runs.floor_error}; the trajectory is judged only by an absolute "
                         "bound, at best WARN")
    prog.done(None, t0, runs.error or "")

    # 5-8. accuracy ladder -------------------------------------------------------------------------------
    t0 = prog.start("operator rung")
    first_inputs = runs.step_runs[0][1].inputs[0] if runs.step_runs and runs.step_runs[0][1].inputs else None
    if first_inputs:
        rungs["operator"] = _guard("operator", lambda: operator_rung(
            dut, lad.ref_backend.device, cfg0, first_inputs, dut_record.adaptations))
    elif runs.error:
        rungs["operator"] = _not_run("operator", runs.error)
    else:
        rungs["operator"] = RungResult("operator", Verdict.SKIP, "the reference run recorded no step")
    prog.done(rungs["operator"], t0)
    t0 = prog.start("component rung")
    if ref is None:
        rungs["component"] = _not_run("component", f"the reference could not be loaded ({ref_error})")
    else:
        rungs["component"] = _guard("component", lambda: component_rung(dut, ref, cfg0))
    prog.done(rungs["component"], t0)
    t0 = prog.start("teacher-forced step rung")
    if runs.error:
        rungs["step"] = _not_run("step", runs.error)
    else:
        step_floor = dut if (same_place and not options.op_overrides) else floor
        rungs["step"] = _guard("step", lambda: step_rung(dut, ref, runs.step_runs, step_floor))
    prog.done(rungs["step"], t0)
    t0 = prog.start("trajectory rung")
    if runs.error:
        rungs["trajectory"] = _not_run("trajectory", runs.error)
    else:
        label = floor_label if runs.floor_error is None else f"none ({runs.floor_error})"
        rungs["trajectory"] = _guard("trajectory", lambda: trajectory_rung(runs.traj, label))
    prog.done(rungs["trajectory"], t0)

    # 9. gallery -------------------------------------------------------------------------------------------
    t0 = prog.start(f"gallery ({len(lad.prompts)} prompt(s))")
    if ref is not None:
        try:
            data["gallery"] = _gallery(lad, dut, ref, smoke_images, runs.ref_images0)
        except Exception as exc:  # the report is written without it; the verdict says so
            data["gallery"] = {"error": _short(exc)}
            lad.caveats.append(f"the gallery failed ({_short(exc)})")
    prog.done(None, t0)
    return _finish(lad, rungs, data, prog, seeds)


class _RefRuns:
    """What stage 4 produced: per seed the device/reference/floor runs, and what went wrong."""

    def __init__(self, seeds: list[int]) -> None:
        self.seeds = seeds
        self.traj: list[tuple[int, TrajectoryRun, TrajectoryRun, TrajectoryRun | None]] = []
        self.step_runs: list[tuple[RunConfig, StepTrace]] = []
        self.ref_images0: list[Image.Image] = []
        self.stage = "the reference runs"
        self.error: str | None = None
        self.floor_error: str | None = None


def _reference_runs(lad: Ladder, dut: Any, ref: Any, floor: Any, same_place: bool, smoke_images: list[Image.Image],
                    smoke_trace: StepTrace, runs: _RefRuns) -> None:
    """Stage 4: the device on the extra seeds, the reference and the floor on every seed (CPU noise)."""
    options = lad.o
    for seed in runs.seeds:
        cfg = lad.dut_cfg(seed=seed)
        if seed == options.seed:
            dut_run = TrajectoryRun(smoke_images, smoke_trace)
        else:
            runs.stage = f"the device run (seed {seed})"
            tr = StepTrace()
            imgs, _ = lad.run(dut, cfg, trace=tr)
            dut_run = TrajectoryRun(imgs, tr)
        runs.stage = f"the reference run (seed {seed})"
        rtr = StepTrace()
        rimgs, _ = lad.run(ref, lad.ref_cfg(cfg), trace=rtr)
        if seed == options.seed:
            runs.ref_images0 = rimgs
            lad.save_image(rimgs[0], f"reference_seed{seed}.png")
        floor_run = None
        if floor is ref:
            floor_run = TrajectoryRun(rimgs, rtr)
        elif floor is not None and runs.floor_error is None:
            ftr = StepTrace()
            try:
                fimgs, _ = lad.run(floor, replace(cfg, device=lad.ref_device, dtype=lad.floor_dtype), trace=ftr)
                floor_run = TrajectoryRun(fimgs, ftr)
            except Exception as exc:  # the floor is lost, not the report
                runs.floor_error = f"the floor run ({lad.floor_label}, seed {seed}) failed ({_short(exc)})"
        elif floor is None and same_place and not options.op_overrides:
            floor_run = dut_run
        runs.traj.append((seed, dut_run, TrajectoryRun(rimgs, rtr), floor_run))
        runs.step_runs.append((cfg, rtr))
    if runs.floor_error is not None:  # one seed without a floor: judge every seed the same way
        runs.traj = [(seed, d, r, None) for seed, d, r, _ in runs.traj]


def _gallery(lad: Ladder, dut: Any, ref: Any, first_dut: list[Image.Image], first_ref: list[Image.Image],
             ) -> dict[str, Any]:
    """Every prompt on the device (and the reference, for pairs); one contact sheet."""
    entries: list[dict[str, Any]] = []
    dut_label = f"{lad.dut_backend.device} {dtype_name(lad.dut_dtype)}"
    ref_label = f"{lad.ref_device} {lad.ref_dtype}"
    sheet_images: list[Image.Image] = []
    for k, prompt in enumerate(lad.prompts):
        cfg = lad.dut_cfg(prompt=prompt)
        if k == 0:
            d_img, r_img = first_dut[0], (first_ref[0] if first_ref else None)
        else:
            d_img = lad.run(dut, cfg)[0][0]
            r_img = lad.run(ref, lad.ref_cfg(cfg))[0][0]
        d_path = lad.save_image(d_img, f"gallery_{k}_device.png")
        entry: dict[str, Any] = {"prompt": prompt, "device": d_path.name}
        if r_img is not None:
            p_path = lad.save_image(pair(d_img, r_img, dut_label, ref_label), f"gallery_{k}_pair.png")
            entry["pair"] = p_path.name
        entries.append(entry)
        sheet_images.append(d_img)
    sheet = lad.save_image(contact_sheet(sheet_images, lad.prompts), "contact_sheet.png")
    return {"entries": entries, "contact_sheet": sheet.name, "device_label": dut_label, "reference_label": ref_label,
            "inputs": [Path(p).name for p in lad.image_paths]}


def _finish(lad: Ladder, rungs: dict[str, RungResult], data: dict[str, Any], prog: _Progress,
            seeds: list[int]) -> ValidationResult:
    from ..report import write_report

    t0 = prog.start("report")
    ordered = {k: rungs[k] for k in RUNGS if k in rungs}
    verdict, reasons = overall(ordered, lad.caveats)
    data["verdict_reasons"] = reasons
    config = {**lad.o.to_dict(), "rounds_effective": lad.rounds, "warmup_effective": lad.warmup, "seeds": seeds}
    data["environment"] = fingerprint(lad.dut_backend, lad.ref_backend, config)
    data["reproduce"] = _reproduce(lad.o)
    data["config"] = config
    data["device_label"] = f"{lad.dut_backend.device} {dtype_name(lad.dut_dtype)}"
    data["reference_label"] = f"{lad.ref_device} {lad.ref_dtype}"
    data["images"] = [p.name for p in lad.files]
    if lad.work != lad.out:  # paths the runs saw (the synthetic input ...) are reported where they end up
        data = _retarget(data, str(lad.work), str(lad.out))
        for rung in ordered.values():
            _retarget_rung(rung, str(lad.work), str(lad.out))
    result = ValidationResult(verdict=verdict, rungs=ordered, out_dir=lad.out, data=data)
    work = lad.work
    paths = write_report(result, work, lang=lad.o.lang, files=lad.files)
    lad.publish()
    result.report_paths = {k: lad.out / p.relative_to(work) for k, p in paths.items()}
    prog.done(None, t0, f"verdict {verdict}: {lad.out}")
    return result


def _retarget(obj: Any, old: str, new: str) -> Any:
    """``obj`` with the staging folder ``old`` (a unique random name) replaced by DIR ``new`` in every string."""
    if isinstance(obj, str):
        return obj.replace(old, new)
    if isinstance(obj, dict):
        return {k: _retarget(v, old, new) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_retarget(v, old, new) for v in obj)
    return obj


def _retarget_rung(rung: RungResult, old: str, new: str) -> None:
    rung.summary = _retarget(rung.summary, old, new)
    rung.data = _retarget(rung.data, old, new)
    for row in rung.rows:
        row.note = _retarget(row.note, old, new)
