"""``difforge capture``: the device-under-test half of a validation, run on the device and kept.

msprobe's dump-then-compare workflow at pipeline level, the mirror image of a golden bundle
(:mod:`.golden` stores the reference side computed elsewhere): a device host with little host memory
or a weak CPU runs only the device under test and stores everything the judge needs from it; a large
machine later runs ``difforge validate --capture C`` (:mod:`.captured`), which computes the reference
and the floor there and climbs the same ladder - the rungs' judging code is the one of a validation
in one process.

What a capture holds (:mod:`.bundle`'s format ``difforge-capture``, bounded and hashed like golden
bundles): every device run validate asks for - the smoke run with its step trace, the warm-up and timed
rounds with their RunRecords (benchmark, determinism), the speed table's rows, the extra seeds' runs,
the semantic prompts' and the gallery's pictures - keyed by configuration and kept in order; per seed
the device's own free-running states and its teacher-forced outputs at them (with every transformer
block's output, for first-divergence); the component outputs on the inputs the device drew; the
operator rung's traced calls (inputs, outputs: :mod:`.opstore`) and the probe's fused-op cases; the
FLOPs, the module dtype plan the judge's emulated floor rounds to; and the device's environment.

With ``--golden G`` the device is teacher-forced on the golden bundle's reference states instead, fed its
component inputs and sampled by its plan, so ``validate --capture C --golden G`` computes neither side.

Outputs larger than the bundle limits are kept as the fixed sample of :class:`~.bundle.Reducer`
(its plan is stored, and the judge reduces the reference and floor with it).  The probe's operator
cases (fused kernels a trace cannot see) carry their reference and floor, computed on the capturing
host's CPU in float32 (no kernel of the device under test is in them); every other reference value
is computed by the judge.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from ..config import RunConfig
from ..devices import dtype_name
from ..errors import InputError
from ..models.registry import resolve_model
from ..runtime.record import RunRecord
from ..version import __version__
from .budget import LEVELS, Level, too_small
from .bundle import (
    CAPTURE_FORMAT,
    FORMAT_VERSION,
    FULL_LIMIT,
    BundleWriter,
    Reducer,
    image_hash,
    weight_hashes,
)
from .captured import CAPTURED, bundle_digest, prompt_set_digest, reduced_outputs, run_key
from .environment import fingerprint
from .floor import module_dtypes
from .golden import Golden, check_dtype_plan, check_settings, open_golden
from .ladder import Ladder, short_error
from .opstore import store_capture
from .options import ValidateOptions
from .runner import _Climb, _memory_now, _Progress, _Side
from .semantic import QUICK_N as QUICK_SEMANTIC
from .steps import StepTrace, capture_blocks
from .tracing import _flat, _pick, probe_captures
from .trajectory import LATENT_KEYS


@dataclass
class CaptureResult:
    out: Path
    manifest: dict[str, Any]
    seconds: float


class RecordingLadder(Ladder):
    """A Ladder whose device-under-test runs are kept in the bundle as they happen (and whose saved
    pictures go into it), so validate's own stages (smoke, benchmark, speed table) make the capture."""

    records_device_runs = True

    def __init__(self, options: ValidateOptions) -> None:
        super().__init__(options)
        self.writer: BundleWriter | None = None
        self.dut_pipe: Any = None
        self.runs: dict[str, list[dict[str, Any]]] = {}
        self.traces = 0

    def picture(self, img: Image.Image) -> str:
        """Store a picture once per content (determinism reruns repeat it); returns its name in the bundle."""
        assert self.writer is not None
        name = f"images/{image_hash(img)[:24]}.png"
        if not any(p.relative_to(self.writer.folder).as_posix() == name for p in self.writer.files):
            self.writer.image(img, name)
        return name

    def save_image(self, img: Image.Image, name: str, record: RunRecord | None = None) -> Path:
        if record is not None:
            with record.phase("save"):
                stored = self.picture(img)
        else:
            stored = self.picture(img)
        return self.work / stored

    def run(self, pipe: Any, cfg: RunConfig, record: RunRecord | None = None, trace: StepTrace | None = None,
            images: list[Image.Image] | None = None) -> tuple[list[Image.Image], RunRecord]:
        if pipe is not self.dut_pipe or self.writer is None:
            return super().run(pipe, cfg, record, trace, images)
        entry: dict[str, Any] = {}
        self.runs.setdefault(run_key(cfg, images), []).append(entry)
        try:
            imgs, rec = super().run(pipe, cfg, record, trace, images)
        except BaseException as exc:
            entry["error"] = short_error(exc)
            raise
        entry["images"] = [self.picture(img) for img in imgs]
        entry["record"] = json.loads(rec.to_json()) if record is not None else None
        if trace is not None:
            self.traces += 1
            entry["trace"] = self.writer.put(_trace_data(trace, self.writer.reducer), f"run{self.traces}/trace")
        return imgs, rec


def _trace_data(trace: StepTrace, reducer: Reducer) -> dict[str, Any]:
    """A run's step trace: each step's inputs whole (the judge teacher-forces on them), the latents/tokens
    the trajectory rung compares per step, and the last step's outputs (the smoke rung's NaN check;
    large ones sampled)."""
    outputs = [{k: v for k, v in o.items() if k in LATENT_KEYS} for o in trace.outputs]
    if outputs:
        outputs[-1] = {k: reducer.output(v) if isinstance(v, torch.Tensor) else v for k, v in trace.outputs[-1].items()}
    return {"inputs": [dict(x) for x in trace.inputs], "outputs": outputs}


def refuse_options(options: ValidateOptions) -> None:
    """What a capture cannot take (exit 2): the options not built for it."""
    if options.msprobe:
        raise InputError("--msprobe is not supported with a capture: validate on the device with --msprobe instead.")
    if options.parallel != "none":
        raise InputError("capture runs one device-under-test process: --parallel is not supported.")


def make_capture(options: ValidateOptions, log: Any = None, clean: bool = False,
                 max_bytes: int | None = None) -> CaptureResult:
    """Run the device under test through every stage validate needs from it; write the bundle to
    ``options.out`` (built in a hidden sibling, published whole; nothing is left on an error).

    ``clean``: the capturer states this is an unmodified port (a device kit's run); the manifest says so,
    and the fixture test (``tests/fixtures/captures/``) then requires the judge's PASS.  The judge never
    reads it: a verdict is computed, not declared.

    ``max_bytes``: the whole bundle (every file) fits it, by the first of :data:`.budget.LEVELS` that fits
    (recorded in the manifest's ``budget``); none fits: InputError naming the size needed, nothing written.
    None: validate's own caps, as without a budget."""
    say = log or (lambda _msg: None)
    t_start = time.perf_counter()
    options.check()
    refuse_options(options)
    golden = open_golden(options) if options.golden else None  # its files, weights, inputs: before anything loads
    lad = RecordingLadder(options)
    if golden is not None:
        check_settings(golden, options, lad)
        _golden_inputs(lad, golden)
    folder, _family = resolve_model(options.model)
    lad.prepare_inputs()
    say(f"load {options.model} on {lad.dut_label}")
    pipe, record = lad.load(lad.dut_backend, lad.dut_dtype, options.op_overrides, dut=True)
    lad.check_size(pipe)
    if golden is not None:
        check_dtype_plan(golden, lad.probe(pipe))
    lad.make_out_dir()
    try:
        # with a golden bundle, its sampling plan: the judge compares against the golden's stored samples
        reducer = (Reducer(dict(golden.bundle.reducer.plans), frozen=True, limits=golden.bundle.reducer.limits)
                   if golden is not None else Reducer())
        writer = lad.writer = BundleWriter(lad.work, reducer)
        lad.dut_pipe = pipe
        inputs = [writer.image(img, f"inputs/input_{k}.png") for k, img in enumerate(lad.images)]
        lad.image_paths = [str(lad.work / name) for name in inputs]
        probe = lad.probe(pipe)
        plan = {name: {sub: dtype_name(d) for sub, d in module_dtypes(m, probe.dtype).items()}
                for name, m in probe.modules().items()}
        data: dict[str, Any] = {"load_record": json.loads(record.to_json()), "size_multiple": int(probe.size_multiple),
                                "block_names": [name for name, _ in probe.transformer_blocks()]}
        memory, bounded = _record_device(lad, pipe, record, data, say, golden)

        def manifest_for(level: Level | None) -> dict[str, Any]:
            return {
                "format": CAPTURE_FORMAT, "format_version": FORMAT_VERSION, "difforge": __version__,
                "torch": torch.__version__, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "model": options.model, "options": {**manifest_config(options), "dtype": dtype_name(lad.dut_dtype)},
                "weights": weight_hashes(folder, options.transformer),
                "inputs": {"prompts": list(lad.prompts), "synthetic": lad.synthetic,
                           "images": [{"file": n, "sha256": image_hash(img)} for n, img in zip(inputs, lad.images,
                                                                                              strict=True)],
                           "prompt_set": prompt_set_digest(lad.prompt_set)},
                "device": {"label": lad.dut_label, "device": str(lad.dut_backend.device),
                           "dtype": dtype_name(lad.dut_dtype), "name": lad.dut_backend.device_name(),
                           "random_stream": lad.dut_backend.random_stream, "memory_after_load": memory,
                           "describe": lad.dut_backend.describe()},
                "environment": fingerprint(lad.dut_backend, lad.dut_backend, manifest_config(options)),
                "dtype_plan": plan,
                "clean": bool(clean),
                "golden": {"digest": bundle_digest(golden.bundle.folder),
                           "created": golden.bundle.manifest.get("created")} if golden is not None else None,
                "budget": None if level is None else level.describe(max_bytes),
                "notes": list(lad.notes),
            }

        manifest = _fit(writer, data, bounded, manifest_for, max_bytes, say)  # written: finished
        lad.publish()
    except BaseException:
        lad.discard_output()
        raise
    return CaptureResult(Path(options.out), manifest, time.perf_counter() - t_start)


def _golden_inputs(lad: Ladder, golden: Golden) -> None:
    """Prompts and pictures not given are the golden bundle's (the ones its reference ran on)."""
    inputs = golden.bundle.manifest["inputs"]
    if not lad.o.prompts:
        lad.prompts = list(inputs["prompts"])
    if not lad.o.images and inputs["images"]:
        lad.image_paths = [str(golden.bundle.path(x["file"])) for x in inputs["images"]]


def manifest_config(options: ValidateOptions) -> dict[str, Any]:
    return {name: getattr(options, name) for name in CAPTURED}


def _fit(writer: BundleWriter, data: dict[str, Any], bounded: Any, manifest_for: Any, max_bytes: int | None,
         say: Any) -> dict[str, Any]:
    """Store the bounded parts at the first level of caps whose whole bundle fits ``max_bytes`` and write it;
    without a budget, at validate's own caps (manifest ``budget`` null)."""
    if max_bytes is None:
        bounded(LEVELS[0])
        return writer.finish(manifest_for(None), data)
    mark, need = writer.mark(), 0
    for level in LEVELS:
        bounded(level)
        manifest = manifest_for(level)
        need = writer.size(manifest, data)
        if need <= max_bytes:
            say(f"budget {max_bytes} B: {level.name} ({need} B)")
            manifest = writer.finish(manifest, data)
            written = sum(p.stat().st_size for p in writer.folder.rglob("*") if p.is_file())
            if written > max_bytes:  # the estimate is exact up to JSON spacing; never publish past the budget
                raise too_small(max_bytes, written)
            return manifest
        say(f"budget {max_bytes} B: {level.name} needs {need} B; lowering the caps")
        writer.rollback(mark)
    raise too_small(max_bytes, need)


def _record_device(lad: RecordingLadder, pipe: Any, record: RunRecord, data: dict[str, Any], say: Any,
                   golden: Golden | None = None) -> tuple[int | None, Any]:
    """Validate's device-side runs kept in ``data`` and the recorded runs; returns the memory after load and
    the function that stores the bounded parts (teacher-forced steps with their block outputs, components,
    operator calls) at a :class:`~.budget.Level` of caps, called once, or again after a rollback.

    ``golden``: the device is teacher-forced on the golden bundle's reference states and fed its component
    inputs (its reference holds no sampler or post-network step, so none is kept)."""
    writer = lad.writer
    assert writer is not None
    o = lad.o
    climb = _Climb(lad, _Progress(True, total=1), _Side(pipe=pipe, record=record), _Side(), lambda *a, **k: {})
    climb.cfg0 = lad.dut_cfg()
    say("smoke run")
    memory = None
    smoke = climb.smoke()
    data["runs"] = lad.runs
    if smoke.verdict.name == "FAIL":  # the judge fails the smoke rung from the stored error and skips the rest
        say(f"the smoke run failed: {climb.dut.error}")
        return memory, lambda level: None
    memory = _memory_now(lad.dut_backend)
    say(f"benchmark: {lad.warmup} warm-up, {lad.rounds} timed rounds" +
        (" and the speed table's rows" if o.speed_table else ""))
    climb.benchmark()
    seeds = climb.seeds
    traces = {o.seed: climb.smoke_trace}
    for seed in seeds[1:]:
        say(f"seed {seed}: device run")
        trace = StepTrace()
        lad.run(pipe, lad.dut_cfg(seed=seed), trace=trace)
        traces[seed] = trace
    if lad.prompt_set is not None:
        _semantic_runs(lad, pipe, say)
    for k, prompt in enumerate(lad.prompts[1:], start=1):  # the gallery's other prompts (runner._Climb.gallery)
        say(f"gallery prompt {k + 1}/{len(lad.prompts)}")
        lad.run(pipe, lad.dut_cfg(prompt=prompt))
    probe = lad.probe(pipe)
    cfg0 = climb.cfg0
    data["family"] = str(probe.family)
    stream = getattr(probe, "portable_stream", None)
    data["portable_stream"] = bool(stream(cfg0)) if stream is not None else False
    try:
        data["flops"] = probe.flops_per_step(cfg0)
    except NotImplementedError:
        data["flops"] = None
    states: dict[int, list[dict[str, torch.Tensor]]] = {}
    for seed, trace in traces.items():
        states[seed] = golden.ref.trajectory(lad.dut_cfg(seed=seed)).trace.inputs if golden is not None else trace.inputs

    def bounded(level: Level) -> None:
        if not writer.reducer.frozen:  # with --golden, its plans (and so its block samples) are the ones compared
            writer.reducer.block_full, writer.reducer.block_sample = level.block_full, level.block_sample
        _steps(lad, probe, states, data, golden, say)
        say("components")
        try:
            comp_inputs = (golden.ref.component_inputs(cfg0) if golden is not None else probe.component_inputs(cfg0))
        except NotImplementedError:
            comp_inputs = {}
        data["components"] = {"inputs": writer.put(comp_inputs, "components/inputs"), "outputs": {
            name: writer.put(writer.reducer.output(probe.run_component(name, kw)), f"components/dut/{name}")
            for name, kw in comp_inputs.items()}}
        say("operator calls (step 0 and each component)")
        first = states[o.seed][0] if states.get(o.seed) else None
        data["operator"] = _operators(lad, probe, cfg0, first, climb.dut.record.adaptations, level)

    return memory, bounded


def _steps(lad: RecordingLadder, probe: Any, states: dict[int, list[dict[str, torch.Tensor]]], data: dict[str, Any],
           golden: Golden | None, say: Any) -> None:
    """Per seed, the teacher-forcing states and the device's outputs at each (with every block's output, its
    sampler step and its post-network step with their teachers)."""
    writer = lad.writer
    assert writer is not None
    reduce_out, reduce_block = writer.reducer.output, writer.reducer.block
    data["states"], data["steps"] = {}, {}
    for seed, seed_states in states.items():
        cfg = lad.dut_cfg(seed=seed)
        whose = "the golden bundle's reference" if golden is not None else "the device's own"
        say(f"seed {seed}: {len(seed_states)} teacher-forced steps at {whose} states")
        data["states"][str(seed)] = writer.put([dict(x) for x in seed_states], f"seed{seed}/states")
        steps = []
        for i, inputs in enumerate(seed_states):
            with capture_blocks(probe, reduce=lambda t: _compact(reduce_block(t), probe.dtype)) as (_n, blocks):
                out = probe.forward_step(cfg, i, inputs)
            step = {"out": writer.put(reduced_outputs(out, reduce_out), f"seed{seed}/step{i}/out"),
                    "blocks": writer.put(blocks, f"seed{seed}/step{i}/blocks")}
            sampler = _sampler(probe, cfg, i, inputs, out, lad.notes) if golden is None else None
            if sampler is not None:
                step["sampler"] = writer.put(reduced_outputs(sampler, reduce_out), f"seed{seed}/step{i}/sampler")
            post = _post_network(probe, cfg, i, inputs, out, lad.notes) if golden is None else None
            if post is not None:
                step["post"] = {"teacher": writer.put(out, f"seed{seed}/step{i}/teacher"),
                                "out": writer.put(reduced_outputs(post, reduce_out), f"seed{seed}/step{i}/post")}
            steps.append(step)
        data["steps"][str(seed)] = steps


def _compact(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A float32 tensor that holds only values of the device's low-precision ``dtype`` (a block output the
    device computed in it, upcast on the way out) is stored in that dtype: the same values in half the bytes.
    Only for what the judge compares (it upcasts), never for what it feeds a reference as input."""
    if t.dtype != torch.float32 or dtype not in (torch.bfloat16, torch.float16):
        return t
    low = t.to(dtype)
    return low if torch.equal(low.to(torch.float32), t) else t


def _post_network(probe: Any, cfg: RunConfig, i: int, inputs: dict[str, torch.Tensor],
                  out: dict[str, torch.Tensor], notes: list[str]) -> dict[str, torch.Tensor] | None:
    """The device's work after the network at step ``i`` (the probe's ``post_network_step``), fed its own
    outputs at this state: the judge feeds the reference and floor the same stored outputs.  None when the
    family has no such step, or the outputs are too large to keep whole (the judge then has no teacher)."""
    step = getattr(probe, "post_network_step", None)
    if step is None:
        return None
    if any(isinstance(v, torch.Tensor) and v.numel() > FULL_LIMIT for v in out.values()):
        if not any("post-network" in n for n in notes):
            notes.append("the capture keeps no post-network steps: the network's outputs are too large to keep whole "
                         "as their teacher")
        return None
    low = (torch.bfloat16, torch.float16)
    return dict(step(cfg, i, inputs, out, hold=probe.dtype if probe.dtype in low else None))


def _sampler(probe: Any, cfg: RunConfig, i: int, inputs: dict[str, torch.Tensor], out: dict[str, torch.Tensor],
             notes: list[str]) -> dict[str, torch.Tensor] | None:
    """The device's sampler step ``i`` alone (the probe's ``sampler_step``: URSA's jump rates, jump
    probabilities, drawn targets and tokens) on its own logits at this state, its own targets drawn natively.
    The logits are kept whole with the step's outputs; the judge runs the reference's and floor's sampler on
    them with the device's targets.  None when the family has no sampler step or the logits are too large."""
    step = getattr(probe, "sampler_step", None)
    if step is None or "logits" not in out:
        return None
    if out["logits"].numel() > FULL_LIMIT:
        if not any("sampler" in n for n in notes):
            notes.append("the capture keeps no sampler steps: the logits are too large to keep whole")
        return None
    return dict(step(cfg, i, inputs, out["logits"]))


def _operators(lad: RecordingLadder, probe: Any, cfg: RunConfig, first: dict[str, torch.Tensor] | None,
               adaptations: list[Any], level: Level = LEVELS[0]) -> dict[str, Any]:
    """The probe's fused-op cases and the traced calls of step 0 and each component (stored one at a time)."""
    writer = lad.writer
    assert writer is not None
    if first is None:
        return {"cases": [], "captures": []}
    cases, dtype = [], probe.dtype
    for c in probe.operator_cases(torch.device("cpu"), cfg, first, list(adaptations)):
        # as a traced call: at most caps.outputs elements, the same fixed ones on every side
        caps = level.caps
        idx = _pick(c.dut.numel(), caps.outputs) if c.dut.numel() > caps.outputs else None
        kept = [t if t is None or idx is None else _flat(t.reshape(-1), idx) for t in (c.dut, c.ref, c.floor)]
        how = f"; {caps.outputs} of {c.dut.numel()} output elements kept" if idx is not None else ""
        cases.append({"op": c.op, "impl": c.impl, "exact": c.exact, "shape": c.shape, "dut": _compact(kept[0], dtype),
                      "ref": kept[1], "floor": _compact(kept[2], dtype), "note": c.note + how})
    captures = []
    for k, cap in enumerate(probe_captures(probe, cfg, first, level.caps)):
        captures.append(writer.put(store_capture(cap), f"operator/capture{k}"))
        del cap
    return {"cases": writer.put(cases, "operator/cases"), "captures": captures}


def _semantic_runs(lad: RecordingLadder, pipe: Any, say: Any) -> None:
    """The semantic rung's device pictures, run exactly as runner._Climb.semantic asks for them."""
    pset = lad.prompt_set
    items = list(pset.items[:QUICK_SEMANTIC] if lad.quick else pset.items)
    say(f"semantic: {len(items)} prompts")
    for item in items:
        images = [Image.fromarray(pset.source_image(item))] if pset.kind == "edit" else None
        cfg = lad.dut_cfg(prompt=item.prompt)
        if lad.quick and lad.o.steps is None:
            cfg = replace(cfg, steps=None)
        lad.run(pipe, cfg, images=images)


__all__ = ["CaptureResult", "make_capture"]
