"""The acceptance ladder, top to bottom: load, smoke, determinism, benchmark, operator, component,
teacher-forced steps, trajectory, gallery, then the report.

Pipelines load and run through :mod:`difforge.engine` (the :class:`~.ladder.Ladder` holds the two parsed
devices); family questions go to the family's probe; every timing comes from the RunRecords.  A crash
inside a rung fails that rung (with the error in the report) instead of losing the whole report; user
mistakes (bad device, bad path) still raise DifforgeError before anything runs.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from rich.console import Console

from ..config import RunConfig
from ..devices import dtype_name
from ..errors import DeviceOutOfMemoryError, DifforgeError, InputError
from ..models.registry import resolve_model
from ..runtime.progress import track
from ..runtime.record import RunRecord
from ..shapes.prompts import score as score_item
from .bench import bench_rung, speed_row, speed_table
from .bundle import identity_notes, weight_hashes
from .captured import Captured, CapturedRunError, capture_images, check_prompt_set, open_capture
from .components import component_rung
from .determinism import determinism_rung
from .environment import fingerprint
from .gallery import contact_sheet, label, pair, picture_steps, semantic_sheet, strip
from .golden import Golden, Reduced, check_dtype_plan, check_settings, open_golden, refuse_reference_flags
from .identity import DIFFERS, UNDECIDED, Identity, off_identity
from .ladder import Ladder, short_error
from .operators import operator_rung
from .options import RUNGS, ValidateOptions, ValidationResult
from .semantic import QUICK_N as QUICK_SEMANTIC
from .semantic import Scored, semantic_rung
from .smoke import smoke_rung
from .steps import StepTrace, step_rung
from .trajectory import StepReplay, TrajectoryRun, shared_stream, trajectory_rung
from .verdict import RungResult, Verdict, overall

#: Writes report.md/.html/.json for a result into a folder; returns {kind: path}.  Passed in by the
#: caller (difforge.api) because the report box sits to the right of validate.
ReportWriter = Callable[..., dict[str, Path]]

__all__ = ["Ladder", "ReportWriter", "run_validation"]


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


def _memory_now(backend: Any) -> int | None:
    """Memory held right now: the device's allocator, else (a CPU) this process's resident set."""
    allocated = backend.memory_allocated_bytes()
    if allocated is not None:
        return int(allocated)
    import psutil

    return int(psutil.Process().memory_info().rss)


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
        msg = short_error(exc)
        result = RungResult(key, Verdict.FAIL, f"error: {msg}",
                            data={"error": msg, "traceback": traceback.format_exc(limit=8)})
    result.seconds = time.perf_counter() - t0
    return result


def _not_run(key: str, why: str) -> RungResult:
    return RungResult(key, Verdict.FAIL, f"not run: {why}", data={"error": why})


def _reproduce(options: ValidateOptions) -> list[str]:
    """The exact command line that re-runs this validation (input files as absolute paths; every
    option not at its default, so it parses back to the same ValidateOptions)."""
    launch = ["torchrun", "--nproc-per-node", "2", "-m", "difforge"] if options.parallel != "none" else ["difforge"]
    args = [*launch, "validate", "--model", options.model, "--device", options.device, "--dtype",
            options.dtype, "--reference", options.reference]
    for img in options.images:
        args += ["--image", os.path.abspath(img)]
    if options.prompts:
        args += ["--prompts", os.path.abspath(options.prompts)]
    if options.prompt_set:
        args += ["--prompt-set", os.path.abspath(options.prompt_set)]
    if options.scan_source:  # a module name stays a name; a path becomes absolute
        src = options.scan_source
        args += ["--scan-source", os.path.abspath(src) if os.path.exists(src) else src]
    if options.transformer:
        args += ["--transformer", os.path.abspath(options.transformer)]
    for flag, value in (("--steps", options.steps), ("--height", options.height), ("--width", options.width),
                        ("--num-frames", options.num_frames), ("--guidance", options.guidance),
                        ("--guidance-trunc", options.guidance_trunc), ("--true-cfg", options.true_cfg)):
        if value is not None:
            args += [flag, str(value)]
    if options.negative_prompt is not None:  # free text (may start with '-'): one --flag=value word
        args.append(f"--negative-prompt={options.negative_prompt}")
    if options.compile:
        args.append("--compile")
    for name in options.fast:
        args += ["--fast", name]
    for name in options.disable:
        args += ["--disable", name]
    if options.offload != "none":
        args += ["--offload", options.offload]
    if options.vae_tiling:
        args.append("--vae-tiling")
    if options.parallel != "none":
        args += ["--parallel", options.parallel]
    args += ["--rounds", str(options.rounds), "--warmup", str(options.warmup), "--seed", str(options.seed)]
    if options.quick:
        args.append("--quick")
    if not options.speed_table:
        args.append("--no-speed-table")
    if options.floor is not None:
        args += ["--floor", options.floor]
    if options.allow_self_compare:
        args.append("--allow-self-compare")
    if options.fail_on != "fail":
        args += ["--fail-on", options.fail_on]
    for accepted in options.accept_warn:
        args += ["--accept-warn", accepted]
    if options.golden:
        args += ["--golden", os.path.abspath(options.golden)]
    if options.capture:
        args += ["--capture", os.path.abspath(options.capture)]
    if options.msprobe:
        args.append("--msprobe")
    args += ["--lang", options.lang, "--out", str(options.out)]
    return [shlex.join(args)]


@dataclass
class _Side:
    """One loaded pipeline (device under test or reference), its record, and why it is missing if it is."""

    pipe: Any = None
    record: RunRecord = field(default_factory=lambda: RunRecord(kind="generate"))
    error: str | None = None


def _load_side(lad: Ladder, backend: Any, dtype: Any, kind: str, overrides: dict | None = None,
               dut: bool = False) -> _Side:
    """Load one side; an OOM or a crash is kept as the side's error (it costs rungs, not the report).

    ``dut``: the device under test, with every shipped option; otherwise the plain path (see Ladder.load)."""
    side = _Side(record=RunRecord(kind=kind))
    try:
        side.pipe, side.record = lad.load(backend, dtype, overrides, dut=dut)
    except DeviceOutOfMemoryError as exc:
        side.error = str(exc)
    except DifforgeError:
        raise
    except Exception as exc:
        side.error = short_error(exc)
    return side


def run_validation(options: ValidateOptions, write_report: ReportWriter, group: Any = None) -> ValidationResult:
    """Run the whole ladder on ``options`` and write the report (with ``write_report``) into ``options.out``.

    ``group``: rank 0 of ``--parallel cfg`` (:mod:`.split`): the device under test's runs are split with rank 1.

    Every user mistake (bad flag, prompts file, image, size, ``--out``) raises DifforgeError before
    ``DIR`` is created; the device-under-test pipeline is loaded first so its size check runs before
    the reference is loaded.
    """
    options.check()
    golden: Golden | None = None
    captured: Captured | None = None
    if options.capture:  # the device under test's half, made on the device (difforge capture)
        _refuse_with_capture(options)
        captured = open_capture(options, _probe_type(options.model))
    if options.golden:
        refuse_reference_flags(options)
        golden = open_golden(options)  # its files, the weights, prompts and pictures: before anything loads
        if options.msprobe:
            from .msprobe_view import check_golden

            check_golden(golden, options.golden)
        if captured is not None:
            captured.check_golden(golden)
    lad = Ladder(options, golden_ref=golden.reference if golden is not None else None, group=group,
                 dut_backend=captured.backend if captured is not None else None)
    scanned = _scan_source(options.scan_source, lad.dut_backend.device.type) if options.scan_source else None
    if golden is not None:
        check_settings(golden, options, lad)
        _use_golden_inputs(lad, golden)
    if captured is not None:
        _use_capture_inputs(lad, captured)
    prog = _Progress(options.quiet, total=10 + bool(options.msprobe) + (lad.prompt_set is not None))
    t0 = prog.start(f"load {options.model} on {lad.dut_label} and reference {lad.ref_label}")
    lad.prepare_inputs()
    kind = "edit" if lad.probe_type.takes_images else "generate"
    dut = (_Side(pipe=captured.pipe, record=captured.pipe.load_record()) if captured is not None else
           _load_side(lad, lad.dut_backend, lad.dut_dtype, kind, options.op_overrides, dut=True))
    if dut.pipe is not None:
        lad.check_size(dut.pipe)
        if golden is not None and captured is None:  # a capture made with --golden was checked on the device
            check_dtype_plan(golden, lad.probe(dut.pipe))
    ref = _load_side(lad, lad.ref_backend, lad.ref_dtype, kind) if golden is None else _Side(record=RunRecord(kind=kind))
    lad.ref = ref.pipe
    if dut.pipe is None and ref.pipe is not None:
        lad.check_size(ref.pipe)
    lad.make_out_dir()
    try:
        climb = _Climb(lad, prog, dut, ref, write_report, golden, captured)
        if scanned is not None:
            climb.data["scan"] = scanned
        return climb.run(t0)
    except BaseException:  # a user error, a crash, Ctrl-C or SIGTERM: no half-filled report, no stray folder
        lad.discard_output()
        raise


def validate_rank(options: ValidateOptions, write_report: ReportWriter, group: Any) -> ValidationResult:
    """One rank of ``validate --parallel cfg`` (run by :func:`difforge.runtime.parallel.guarded`; see
    :mod:`.split`): rank 0 the whole validation, rank 1 only the device under test's split runs."""
    from . import split

    options.check()  # the same input errors on both ranks (rank 0 reports them)
    if group.rank != 0:  # the same device-under-test pipeline as rank 0's; nothing is judged here
        lad = Ladder(replace(options, allow_self_compare=True), group=group)
        pipe, record = lad.load(lad.dut_backend, lad.dut_dtype, options.op_overrides, dut=True)
        verdict, _code = split.follow(group, pipe, record)
        return ValidationResult(Verdict(verdict), {}, Path(options.out), fail_on=options.fail_on)
    try:
        result = run_validation(options, write_report, group=group)
    except split.Aborted as exc:
        raise exc.error from None
    split.done(group, str(result.verdict), result.exit_code)
    return result


def _scan_source(source: str, device_type: str) -> dict[str, Any]:
    """``difforge scan`` of the model's source for the device under test's type (static, before any model
    loads, so a bad path is exit 2 at once); a CUDA device is scanned as the NPU port it is a stand-in for."""
    from ..scan import TARGETS, scan

    result = scan(source, device_type if device_type in TARGETS else "npu")
    return {**result.to_dict(), "device": device_type if device_type in TARGETS else "npu"}


def _probe_type(model: str) -> Any:
    from ..models.registry import family_of, probe_class

    return probe_class(family_of(model))


def _refuse_with_capture(options: ValidateOptions) -> None:
    """What ``--capture`` cannot be combined with (exit 2, one line, before anything loads)."""
    for flag, given in (("--msprobe", options.msprobe), ("--parallel", options.parallel != "none")):
        if given:
            raise InputError(f"{flag} cannot be combined with --capture: the device's half was made by 'difforge "
                             "capture'; judge it alone (the reference and the floor are computed here).")


def _use_capture_inputs(lad: Ladder, captured: Captured) -> None:
    """Prompts and pictures are the ones the device ran (the bundle's); the semantic set must be its set."""
    inputs = captured.manifest["inputs"]
    lad.prompts = list(inputs["prompts"])
    if inputs["images"]:
        lad.image_paths, _ = capture_images(captured)
        if inputs.get("synthetic"):
            lad.notes.append("no --image given to the capture: edits use the capture's synthetic test picture")
    check_prompt_set(captured, lad.prompt_set)


def _use_golden_inputs(lad: Ladder, golden: Golden) -> None:
    """Prompts and pictures the user did not give are the bundle's (the ones its reference ran on)."""
    inputs = golden.bundle.manifest["inputs"]
    if not lad.o.prompts:
        lad.prompts = list(inputs["prompts"])
    if not lad.o.images and inputs["images"]:
        lad.image_paths = [str(golden.bundle.path(x["file"])) for x in inputs["images"]]
        if inputs.get("synthetic"):
            lad.notes.append("no --image given: edits use the golden bundle's synthetic test picture")


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


class _Climb:
    """Everything after the inputs were checked and DIR made: floor, rungs, gallery, report."""

    def __init__(self, lad: Ladder, prog: _Progress, dut: _Side, ref: _Side, write_report: ReportWriter,
                 golden: Golden | None = None, captured: Captured | None = None) -> None:
        self.lad, self.prog, self.dut, self.ref, self.write_report = lad, prog, dut, ref, write_report
        #: A golden bundle standing for the reference and the floor (nothing of them runs here).
        self.golden = golden
        #: A capture standing for the device under test (nothing of it runs here).
        self.captured = captured
        self.o = lad.o
        self.seeds = [self.o.seed, *[s for s in self.o.extra_seeds if s != self.o.seed]]
        self.rungs: dict[str, RungResult] = {}
        self.data: dict[str, Any] = {"options": self.o.to_dict(), "family": lad.family, "notes": lad.notes}
        self.floor: Any = None
        self.cfg0: RunConfig = lad.dut_cfg()  # remade once the inputs are saved (their paths go in it)
        self.smoke_trace = StepTrace()
        self.smoke_images: list[Image.Image] = []
        self.runs_images: list[list[Image.Image]] = []

    def run(self, t0: float) -> ValidationResult:
        lad = self.lad
        # 1. load (the floor) -------------------------------------------------------------------------
        lad.save_inputs()
        self.cfg0 = lad.dut_cfg()
        if self.captured is not None:
            self.data["capture"] = summary = self.captured.summary()
            lad.notes.append(f"the device under test ({lad.dut_label}, {summary['device_name']}) ran elsewhere: its "
                             f"half of this validation is the capture {self.o.capture} (made {summary['created']} by "
                             f"difforge {summary['difforge']}, digest {summary['digest'][:16]}); the reference and "
                             "the floor ran here, teacher-forced on the device's own recorded states")
            if self.captured.budget_note():
                lad.notes.append(self.captured.budget_note())
        if self.golden is not None:
            self.floor = self.golden.floor
            self.data["golden"] = _golden_summary(self.golden)
            lad.set_floor(f"{self.golden.floor_label} (golden bundle)",
                          f"reference and floor read from the golden bundle {self.o.golden} (made "
                          f"{self.data['golden']['created']} by difforge {self.data['golden']['difforge']}): nothing of "
                          "them ran here; the operator rung replays the device's captured calls on this host's float32 "
                          "kernels")
        elif self.ref.pipe is None:
            lad.set_floor("none (the reference could not be loaded)",
                          f"the reference ({lad.ref_label}) could not be loaded: {self.ref.error}")
        elif self.dut.pipe is not None:
            self.floor = lad.load_floor(self.dut.pipe)
        lad.notes.extend(identity_notes(self.golden.bundle if self.golden else None,
                                        self.captured.bundle if self.captured else None))  # no external digest given
        self.prog.done(None, t0)
        # 2. smoke ------------------------------------------------------------------------------------
        if self.smoke().verdict is Verdict.FAIL:
            for key in RUNGS[1:]:
                self.rungs[key] = RungResult(key, Verdict.SKIP, "skipped: the smoke run failed")
            return self.finish()
        # 3. determinism + benchmark ----------------------------------------------------------------------
        self.benchmark()
        # 4. reference and floor runs (one per seed) ---------------------------------------------------------
        runs = self.reference_runs()
        self.rungs["determinism"] = determinism_rung(self.runs_images, _floor_rmse(runs), lad.floor_label)
        # 5-8. accuracy ladder --------------------------------------------------------------------------------
        self.accuracy(runs)
        # 8b. semantic: the prompts drawn correctly, device against reference and floor --------------------------
        self.semantic()
        # 9. gallery ------------------------------------------------------------------------------------------
        t0 = self.prog.start(f"gallery ({len(lad.prompts)} prompt(s))")
        if self.ref.pipe is not None or self.golden is not None:
            try:
                self.data["gallery"] = self.gallery(runs.ref_images0)
            except Exception as exc:  # the report is written without it; the verdict says so
                self.data["gallery"] = {"error": short_error(exc)}
                lad.caveats.append(f"the gallery failed ({short_error(exc)})")
        self.prog.done(None, t0)
        # 9b. the msprobe view (--msprobe): last, as msprobe patches torch process-wide -------------------------
        self.data["msprobe"] = self.msprobe(runs)
        # 10. report --------------------------------------------------------------------------------------
        return self.finish()

    # ---- stages ---------------------------------------------------------------------------------------
    def smoke(self) -> RungResult:
        t0 = self.prog.start("smoke")
        dut = self.dut
        if dut.pipe is not None and dut.error is None:
            try:
                self.smoke_images, dut.record = self.lad.run(dut.pipe, self.cfg0, record=dut.record,
                                                             trace=self.smoke_trace)
                self.lad.save_image(self.smoke_images[0], f"device_seed{self.cfg0.seed}.png", dut.record)
            except DifforgeError as exc:
                if not isinstance(exc, DeviceOutOfMemoryError):
                    raise
                dut.error = str(exc)
            except Exception as exc:
                dut.error = short_error(exc)
        rung = self.rungs["smoke"] = smoke_rung(dut.record, self.smoke_images, self.smoke_trace.final() or None,
                                                dut.error)
        self.prog.done(rung, t0)
        self.data["adaptations"] = [vars(a) for a in dut.record.adaptations]
        self.data["reference_adaptations"] = [vars(a) for a in self.ref.record.adaptations]
        self.data["dut_record"] = dut.record.to_dict()
        self.note_prompt_domain(dut.record)
        return rung

    def note_prompt_domain(self, record: RunRecord) -> None:
        """A device run's prompt outside what the model was trained on (engine.note_prompt_domain kept it in
        the record) becomes a report note, once: a reader sees why such a picture does not follow its prompt."""
        for line in (record.extra or {}).get("prompt_domain") or []:
            if line not in self.lad.notes:
                self.lad.notes.append(line)

    def benchmark(self) -> None:
        lad, pipe = self.lad, self.dut.pipe
        t0 = self.prog.start(f"benchmark ({lad.warmup} warm-up, {lad.rounds} timed rounds)")
        records: list[RunRecord] = []
        runs_images = [self.smoke_images]

        def bench() -> RungResult:
            memory_after_load = _memory_now(lad.dut_backend)
            for _ in range(lad.warmup):
                lad.run(pipe, self.cfg0)
            for _ in range(lad.rounds):
                imgs, rec = lad.run(pipe, self.cfg0, record=RunRecord(kind=self.dut.record.kind))
                records.append(rec)
                runs_images.append(imgs)
            try:
                flops = lad.probe(pipe).flops_per_step(self.cfg0)
            except NotImplementedError:
                flops = None
            rung = bench_rung(records, lad.warmup, flops, lad.dut_backend.device_name(), lad.dut_dtype,
                              len(self.smoke_trace.inputs))
            rung.data["memory_after_load_bytes"] = memory_after_load
            rung.data["speed"] = self.speed_rows(records, memory_after_load)
            rung.data["off_identity"] = self.off_identity(runs_images).to_dict()
            return rung

        self.rungs["benchmark"] = _guard("benchmark", bench)
        self.runs_images = runs_images  # judged once the floor's runs say what precision costs
        self.prog.done(self.rungs["benchmark"], t0)

    def off_identity(self, on_runs: list[list[Image.Image]]) -> Identity:
        """Prove the exact label of the optimisations the validated run used, on the device under test
        (:mod:`.identity`); its note goes into the report's notes when the label does not hold here."""
        lad, pipe = self.lad, self.dut.pipe
        disable, fast = lad.stream_names()
        try:  # a capture made the off runs on its device (RecordingLadder keeps them) and the judge replays them
            found = off_identity(lambda cfg: lad.run(pipe, cfg)[0], self.cfg0, on_runs,
                                 lad.probe(pipe).exact_optimisations, [*disable, *fast],
                                 localise=not lad.records_device_runs and getattr(pipe, "replay_run", None) is None)
        except CapturedRunError:  # a capture of an earlier release holds no off run
            found = Identity(UNDECIDED, [], "the capture holds no run with the exact optimisations off")
        note = found.note()
        if note is not None and found.status == DIFFERS:
            lad.notes.append(note)
        return found

    def speed_rows(self, records: list[RunRecord], memory_after_load: int | None) -> dict[str, Any]:
        """The ModelZoo-style performance table: the baseline (every exact optimisation off), the
        defaults, the validated options when they are neither, and each approximate optimisation on top
        of the defaults; the options this validation judged reuse the rung's own timed rounds."""
        lad, pipe = self.lad, self.dut.pipe
        rec_cfg = self.dut.record.config or {}
        # the size the pictures came out at (a model folder's default when --height/--width were not given)
        width, height = (self.smoke_images[0].size if self.smoke_images else
                         (rec_cfg.get("width") or self.cfg0.width, rec_cfg.get("height") or self.cfg0.height))
        header = {"device": lad.dut_backend.device_name(), "dtype": dtype_name(lad.dut_dtype),
                  "height": height, "width": width,
                  "steps": len(self.smoke_trace.inputs) or self.cfg0.steps, "batch": 1,
                  "rounds": lad.rounds, "warmup": lad.warmup}
        if not lad.o.speed_table:
            return {"header": header, "rows": [], "skipped": "--no-speed-table"}
        probe = lad.probe(pipe)
        plain = replace(self.cfg0, disable=[], fast=[])
        variants: list[tuple[str, str, RunConfig]] = [
            ("baseline", "--disable " + ",".join(probe.exact_optimisations),
             replace(plain, disable=list(probe.exact_optimisations))),
            ("exact", "defaults", plain)]
        variants += [("approximate", f"--fast {n}", replace(plain, fast=[n])) for n in probe.approximate_optimisations]

        def same(a: RunConfig, b: RunConfig) -> bool:
            return sorted(a.disable) == sorted(b.disable) and sorted(a.fast) == sorted(b.fast)

        if not any(same(cfg, self.cfg0) for _, _, cfg in variants):
            given = " ".join(f"--{k} {','.join(v)}" for k, v in (("disable", self.cfg0.disable),
                                                                 ("fast", self.cfg0.fast)) if v)
            variants.insert(2, ("validated", given, self.cfg0))
        # every row is measured as the validated row is (its warm-up, then its timed rounds), so the rows compare
        warmup, rounds = lad.warmup, lad.rounds
        header.update({"variant_rounds": rounds, "variant_warmup": warmup})
        rows = []
        for kind, name, cfg in variants:
            validated = same(cfg, self.cfg0)
            if validated:
                recs = records
            else:
                try:
                    for _ in range(warmup):
                        lad.run(pipe, cfg)
                    recs = [lad.run(pipe, cfg, record=RunRecord(kind=self.dut.record.kind))[1]
                            for _ in range(rounds)]
                except Exception as exc:  # a variant that breaks (an OOM included) is a row, not a lost rung
                    why = str(exc) if isinstance(exc, DifforgeError) else short_error(exc)
                    rows.append({"kind": kind, "name": name, "validated": False, "error": why})
                    continue
            rows.append(speed_row(kind, name, recs, memory_after_load, validated, warmup))
        return {"header": header, "rows": speed_table(rows)}

    def reference_runs(self) -> _RefRuns:
        lad = self.lad
        t0 = self.prog.start(f"reference runs on {lad.ref_label} (seeds {self.seeds})")
        runs = _RefRuns(self.seeds)
        if self.golden is not None:
            try:
                self._golden_runs(runs)
            except Exception as exc:
                runs.error = f"{runs.stage} failed ({short_error(exc)})"
        elif self.ref.pipe is None:
            runs.error = f"the reference could not be loaded ({self.ref.error})"
        else:
            try:
                self._reference_runs(runs)
            except Exception as exc:  # an OOM or crash here fails the rungs that need these runs, not the report
                runs.error = f"{runs.stage} failed ({short_error(exc)})"
        if runs.floor_error is not None:
            self.floor = None
            lad.no_floor(runs.floor_error)
        self.prog.done(None, t0, runs.error or "")
        return runs

    def _dut_run(self, runs: _RefRuns, seed: int, cfg: RunConfig) -> TrajectoryRun:
        """The device's run of ``seed``: the smoke run for the main seed, a new traced run for the others."""
        if seed == self.o.seed:
            return TrajectoryRun(self.smoke_images, self.smoke_trace)
        runs.stage = f"the device run (seed {seed})"
        trace = StepTrace()
        imgs, _ = self.lad.run(self.dut.pipe, cfg, trace=trace)
        return TrajectoryRun(imgs, trace)

    def _reference_runs(self, runs: _RefRuns) -> None:
        """The device on the extra seeds, the reference and the floor on every seed (CPU noise)."""
        lad, ref, floor = self.lad, self.ref.pipe, self.floor
        for seed in runs.seeds:
            cfg = lad.dut_cfg(seed=seed)
            dut_run = self._dut_run(runs, seed, cfg)
            runs.stage = f"the reference run (seed {seed})"
            rtr = StepTrace()
            rimgs, _ = lad.run(ref, lad.ref_cfg(cfg), trace=rtr)
            if seed == self.o.seed:
                runs.ref_images0 = rimgs
                lad.save_image(rimgs[0], f"reference_seed{seed}.png")
            floor_run = None
            if self.captured is not None:  # teacher forcing on the device's own states (see captured.py)
                runs.step_runs.append((cfg, self.captured.states(seed)))
            if floor is ref:
                floor_run = TrajectoryRun(rimgs, rtr)
            elif floor is not None and runs.floor_error is None:
                ftr = StepTrace()
                try:
                    fimgs, _ = lad.run(floor, lad.floor_cfg(cfg), trace=ftr)
                    floor_run = TrajectoryRun(fimgs, ftr)
                except Exception as exc:  # the floor is lost, not the report
                    runs.floor_error = f"the floor run ({lad.floor_label}, seed {seed}) failed ({short_error(exc)})"
            runs.traj.append((seed, dut_run, TrajectoryRun(rimgs, rtr), floor_run))
            if self.captured is None:
                runs.step_runs.append((cfg, rtr))
        if runs.floor_error is not None:  # one seed without a floor: judge every seed the same way
            runs.traj = [(seed, d, r, None) for seed, d, r, _ in runs.traj]

    def _golden_runs(self, runs: _RefRuns) -> None:
        """The device on the extra seeds; the reference and floor runs as the bundle stored them."""
        lad, golden = self.lad, self.golden
        assert golden is not None
        floor = golden.floor
        for seed in runs.seeds:
            cfg = lad.dut_cfg(seed=seed)
            dut_run = self._dut_run(runs, seed, cfg)
            runs.stage = f"reading the golden run (seed {seed})"
            ref_run = golden.ref.trajectory(cfg)
            if seed == self.o.seed:
                runs.ref_images0 = ref_run.images
                lad.save_image(ref_run.images[0], f"reference_seed{seed}.png")
            floor_run = floor.trajectory(cfg) if floor is not None else None
            runs.traj.append((seed, dut_run, ref_run, floor_run))
            runs.step_runs.append((cfg, ref_run.trace))

    def accuracy(self, runs: _RefRuns) -> None:
        """Rungs 5-8: operator, component, teacher-forced step, trajectory."""
        lad, prog, rungs = self.lad, self.prog, self.rungs
        dut = lad.probe(self.dut.pipe)
        ref = lad.probe(self.ref.pipe) if self.ref.pipe is not None else None
        floor = lad.probe(self.floor) if self.floor is not None and self.golden is None else None
        operator_dut = dut
        if self.golden is not None:  # the device's outputs reduced like the bundle's samples
            ref, floor, dut = self.golden.ref, self.golden.floor, Reduced(dut, self.golden.bundle.reducer)
        elif self.captured is not None:  # the reference and floor fed the capture's inputs, reduced like its samples
            ref, floor = self.captured.side(ref), self.captured.side(floor)
        t0 = prog.start("operator rung")
        first = runs.step_runs[0][1].inputs[0] if runs.step_runs and runs.step_runs[0][1].inputs else None
        if first:
            adaptations = self.dut.record.adaptations
            rungs["operator"] = _guard("operator", lambda: operator_rung(
                operator_dut, lad.ref_backend.device, self.cfg0, first, adaptations))
        elif runs.error:
            rungs["operator"] = _not_run("operator", runs.error)
        else:
            rungs["operator"] = RungResult("operator", Verdict.SKIP, "the reference run recorded no step")
        prog.done(rungs["operator"], t0)
        t0 = prog.start("component rung")
        if ref is None:
            rungs["component"] = _not_run("component", f"the reference could not be loaded ({self.ref.error})")
        else:
            rungs["component"] = _guard("component", lambda: component_rung(dut, ref, self.cfg0, floor))
        prog.done(rungs["component"], t0)
        t0 = prog.start("teacher-forced step rung")
        if runs.error:
            rungs["step"] = _not_run("step", runs.error)
        else:
            rungs["step"] = _guard("step", lambda: step_rung(dut, ref, runs.step_runs, floor))
        prog.done(rungs["step"], t0)
        t0 = prog.start("trajectory rung")
        if runs.error:
            rungs["trajectory"] = _not_run("trajectory", runs.error)
        else:
            label = lad.floor_label
            shared = shared_stream(dut, self.cfg0)  # discrete tokens are judged only on a shared stream
            live = self.golden is None and ref is not None  # can replay any state (a capture's judge too)
            replay = StepReplay(ref, floor, {cfg.seed: cfg for cfg, _ in runs.step_runs}) if live else None
            rungs["trajectory"] = _guard("trajectory", lambda: trajectory_rung(runs.traj, label, shared, replay))
        prog.done(rungs["trajectory"], t0)

    def semantic(self) -> None:
        """The semantic rung (validate/semantic.py): every prompt of the set on the device, the reference
        and the floor, each picture scored by the shapes checker; skipped (no verdict cost) without a set."""
        lad = self.lad
        pset = lad.prompt_set
        if pset is None:
            self.rungs["semantic"] = RungResult("semantic", Verdict.SKIP, "no prompt set with expected attributes "
                                                "for this model (--prompt-set)")
            return
        if self.golden is not None:  # a bundle stores no semantic runs: judging needs the reference here
            self.rungs["semantic"] = RungResult("semantic", Verdict.SKIP, "a golden bundle holds no reference runs "
                                                "of the prompt set; validate without --golden to judge meaning")
            return
        items = list(pset.items[:QUICK_SEMANTIC] if lad.quick else pset.items)
        t0 = self.prog.start(self._semantic_cost(len(items)))
        if self.ref.pipe is None:
            self.rungs["semantic"] = _not_run("semantic", f"the reference could not be loaded ({self.ref.error})")
            self.prog.done(self.rungs["semantic"], t0)
            return

        def rung() -> RungResult:
            scored, sheet, sources = [], [], []
            for item in track(items, total=len(items), description="semantic", quiet=self.o.quiet):
                images = ([Image.fromarray(pset.source_image(item))] if pset.kind == "edit" else None)
                sources.append(images[0] if images else None)
                cfg = lad.dut_cfg(prompt=item.prompt)
                if lad.quick and lad.o.steps is None:
                    # meaning is judged at the steps the model draws with: --quick's 4 steps make a
                    # trained model draw half-formed pictures on every side, and a rung that cannot
                    # tell clean from broken is no rung (only the prompt count is lowered)
                    cfg = replace(cfg, steps=None)
                d_img = lad.run(self.dut.pipe, cfg, images=images)[0][0]
                r_img = lad.run(self.ref.pipe, lad.ref_cfg(cfg), images=images)[0][0]
                f_img = (lad.run(self.floor, lad.floor_cfg(cfg), images=images)[0][0]
                         if self.floor is not None and self.floor is not self.ref.pipe else None)
                scored.append(Scored(item.id, item.prompt, score_item(d_img, item), score_item(r_img, item),
                                     score_item(f_img, item) if f_img is not None else None))
                sheet.append(d_img)
            rung = semantic_rung(scored, lad.floor_label)
            path = lad.save_image(semantic_sheet(sheet, [i.prompt for i in items], sources, self.o.lang),
                                  "semantic_device.png")
            rung.data["contact_sheet"] = path.name
            return rung

        self.rungs["semantic"] = _guard("semantic", rung)
        self.prog.done(self.rungs["semantic"], t0)

    def _semantic_cost(self, n: int) -> str:
        """The semantic stage's progress line: what it runs (it keeps the model's default steps under --quick,
        so it is the longest stage of a quick validation) and, once the benchmark timed a step, about how long
        the device's share takes."""
        sides = 2 + (self.floor is not None and self.floor is not self.ref.pipe)
        steps = (self.lad.o.steps if self.lad.o.steps is not None else
                 getattr(self.lad.probe_type, "default_steps", None) if self.lad.quick else self.cfg0.steps)
        line = f"semantic rung ({n} prompts x {sides} sides = {n * sides} runs"
        line += f" at {steps} steps" if steps else " at the model's default steps"
        bench = self.rungs.get("benchmark")
        step_s = ((bench.data or {}).get("step") or {}).get("median") if bench is not None else None
        if steps and step_s:
            line += f"; the device's share about {n * steps * step_s:.0f} s at its benchmark step time"
        return line + ")"

    def msprobe(self, runs: _RefRuns) -> dict[str, Any]:
        """msprobe dumps of the device's and the floor's step 0, and msprobe compare's table (see msprobe_view)."""
        from . import msprobe_view

        if not self.o.msprobe:
            return msprobe_view.how_to()
        t0 = self.prog.start("msprobe view (dumps of step 0, msprobe compare)")
        out = msprobe_view.view(self, runs)
        self.prog.done(None, t0, out.get("error") or f"{out.get('rows_total', 0)} rows compared")
        return out

    def gallery(self, first_ref: list[Image.Image]) -> dict[str, Any]:
        """Every prompt on the device (and the reference, for pairs); one contact sheet."""
        lad, dut, ref = self.lad, self.dut.pipe, self.ref.pipe
        entries: list[dict[str, Any]] = []
        sheet_images: list[Image.Image] = []
        for k, prompt in enumerate(lad.prompts):
            cfg = lad.dut_cfg(prompt=prompt)
            if k == 0:
                d_img, r_img = self.smoke_images[0], (first_ref[0] if first_ref else None)
            else:
                d_imgs, d_rec = lad.run(dut, cfg)
                d_img = d_imgs[0]
                self.note_prompt_domain(d_rec)
                r_img = (self.golden.gallery_image(k) if self.golden is not None
                         else lad.run(ref, lad.ref_cfg(cfg))[0][0])
            d_path = lad.save_image(d_img, f"gallery_{k}_device.png")
            d_label = label(self.o.lang, "device", label=lad.dut_label)
            r_label = label(self.o.lang, "reference", label=lad.ref_label)
            entry: dict[str, Any] = {"prompt": prompt, "device": d_path.name}
            if r_img is not None:
                p_path = lad.save_image(pair(d_img, r_img, d_label, r_label), f"gallery_{k}_pair.png")
                entry["pair"] = p_path.name
                s_path = lad.save_image(strip(d_img, r_img, d_label, r_label, lad.images[0] if lad.images else None,
                                              self.o.lang), f"gallery_{k}_strip.png")
                entry["strip"] = s_path.name
            entries.append(entry)
            sheet_images.append(d_img)
        sheet = lad.save_image(contact_sheet(sheet_images, lad.prompts), "contact_sheet.png")
        return {"entries": entries, "contact_sheet": sheet.name, "device_label": lad.dut_label,
                "reference_label": lad.ref_label, "inputs": [Path(p).name for p in lad.image_paths],
                **picture_steps(len(self.smoke_trace.inputs) or self.cfg0.steps,
                                getattr(lad.probe_type, "default_steps", None), lad.quick and lad.o.steps is None)}

    def finish(self) -> ValidationResult:
        lad, data = self.lad, self.data
        t0 = self.prog.start("report")
        if "msprobe" not in data:  # the climb stopped before the view (the smoke run failed)
            from .msprobe_view import how_to

            data["msprobe"] = {**how_to(), "requested": True, "error": "not run: the validation stopped before it"
                               } if self.o.msprobe else how_to()
        ordered = {k: self.rungs[k] for k in RUNGS if k in self.rungs}
        accepted = self.o.accepted_warns()
        verdict, reasons = overall(ordered, lad.caveats, accepted)
        data["verdict_reasons"] = reasons
        data["accepted_warn"] = accepted
        config = {**self.o.to_dict(), "rounds_effective": lad.rounds, "warmup_effective": lad.warmup,
                  "seeds": self.seeds}
        if self.captured is not None:  # the device's environment is the capture's; this machine only judged
            data["environment"] = {**self.captured.manifest.get("environment", {}),
                                   "reference_device": lad.ref_backend.describe(),
                                   "judged_on": fingerprint(lad.ref_backend, lad.ref_backend, config),
                                   "config_hash": fingerprint(lad.ref_backend, lad.ref_backend, config)["config_hash"]}
        else:
            data["environment"] = fingerprint(lad.dut_backend, lad.ref_backend, config)
        data["reproduce"] = _reproduce(self.o)
        data["signoff"] = _signoff(self.o, lad)
        data["config"] = config
        data["quick_reductions"] = list(lad.quick_reductions)
        data["floor_label"] = lad.floor_label
        data["self_comparison"] = lad.self_compare
        data["device_label"] = lad.dut_label
        data["reference_label"] = lad.ref_label
        data["images"] = [p.name for p in lad.files]
        if lad.work != lad.out:  # paths the runs saw (the synthetic input ...) are reported where they end up
            data = _retarget(data, str(lad.work), str(lad.out))
            for rung in ordered.values():
                _retarget_rung(rung, str(lad.work), str(lad.out))
        result = ValidationResult(verdict=verdict, rungs=ordered, out_dir=lad.out, data=data, fail_on=self.o.fail_on)
        work = lad.work
        paths = self.write_report(result, work, lang=self.o.lang, files=lad.files)
        lad.publish()
        result.report_paths = {k: lad.out / p.relative_to(work) for k, p in paths.items()}
        self.prog.done(None, t0, f"verdict {verdict}: {lad.out}")
        return result


def _signoff(options: ValidateOptions, lad: Ladder) -> dict[str, Any]:
    """What the sign-off names: the model folder, the sha256 of every file in it (read once, cached), the
    input pictures as copied into the deliverables, and a reproduce command that runs from the report folder
    on those copies (the report's own reproduce command uses the original absolute paths)."""
    folder, _family = resolve_model(options.model)
    inputs = [p for p in lad.files if p.name.startswith("input_")]
    here = None
    if options.images and len(inputs) == len(options.images):
        here = _reproduce(options)[0]
        for src, copy in zip(options.images, inputs, strict=True):
            here = here.replace(shlex.quote(os.path.abspath(src)), f"images/{copy.name}")
        here = here.replace(shlex.quote(str(options.out)), shlex.quote(f"../{Path(options.out).name}-again"))
    return {"model": options.model, "folder": str(folder.resolve()),
            "weights": weight_hashes(folder, getattr(options, "transformer", None)),
            "inputs": [f"images/{p.name}" for p in inputs], "reproduce_here": here}


def _golden_summary(golden: Golden) -> dict[str, Any]:
    """What the report says about the bundle the reference came from."""
    m = golden.bundle.manifest
    return {"path": str(golden.bundle.folder.resolve()), "created": m.get("created"), "difforge": m.get("difforge"),
            "torch": m.get("torch"), "reference": m["reference"]["label"], "floor": m["floor"]["label"],
            "weights": len(m.get("weights", {})), "bytes": m.get("bytes")}


def _floor_rmse(runs: _RefRuns) -> float | None:
    """The floor's image RMSE against the reference on the first seed (0-255 levels), None without one."""
    for _seed, _dut, ref, floor in runs.traj[:1]:
        if floor is not None and floor.images and ref.images and floor.images[0].size == ref.images[0].size:
            a = np.asarray(floor.images[0].convert("RGB"), dtype=np.float64)
            b = np.asarray(ref.images[0].convert("RGB"), dtype=np.float64)
            return float(np.sqrt(np.mean((a - b) ** 2)))
    return None


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


