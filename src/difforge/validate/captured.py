"""A capture bundle read back by the judge: the device under test as a probe, a pipeline and a backend.

``difforge capture`` (:mod:`.capture`) ran the device-under-test half of a validation on the device
and stored it (:mod:`.bundle` format ``difforge-capture``).  ``difforge validate --capture C`` runs the
other half anywhere: it loads the reference and the floor and climbs the same ladder
(:mod:`.runner`), with the device standing in as three objects that answer from the bundle:

* :class:`CapturedPipe` - the device-under-test "pipeline": each run validate asks of it (smoke,
  warm-up, timed rounds, speed-table rows, extra seeds, semantic prompts, gallery) is answered with
  the run the device made for the same configuration, in the same order (:meth:`CapturedPipe.replay_run`,
  reached through :meth:`.ladder.Ladder.run`);
* :class:`CaptureProbe` - its probe: teacher-forced step outputs at the device's own recorded states,
  component outputs on the inputs the device drew, the operator rung's traced calls and cases, FLOPs;
* :class:`CapturedBackend` - the device's name, dtype, random stream and memory as measured there.

Teacher forcing on the device's states: the device cannot run the reference, so it records its own
free-running states ``s_i`` and its outputs ``f_dut(s_i)`` there; the judge computes ``f_ref(s_i)`` and
``f_floor(s_i)`` on the same states (:class:`JudgeSide`), which is all a teacher-forced comparison needs.
The judge's reference and floor outputs are reduced with the bundle's sampling plan, so both sides
are compared on the same elements (as with golden bundles, :class:`~.bundle.Reducer`).

Refused (exit 2, one line, before any model loads): a damaged or altered bundle (every file's sha256),
another format or release line, other weights (every model file's sha256), other prompts, pictures or
prompt set, and any run setting given that differs from the bundle's (``--steps``, ``--seed``,
``--device`` ...); a setting not given is the bundle's.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from torch import nn

from ..config import RunConfig
from ..devices import DTYPES, dtype_name
from ..models.probing import OpCase
from ..models.registry import resolve_model
from ..runtime.images import load_images
from ..runtime.record import RunRecord
from .bundle import (
    CAPTURE_FORMAT,
    Bundle,
    GoldenError,
    Reducer,
    bundle_digest,
    check_shape,
    first_difference,
    image_hash,
    open_bundle,
    parse_digest,
    weight_hashes,
)
from .opstore import load_capture
from .steps import StepTrace, capture_blocks
from .tracing import Capture

#: ValidateOptions fields a capture fixes: given to the judge, each must equal the bundle's; not given,
#: it is the bundle's.  (Prompts, pictures, prompt set and weights are checked by their content.)
CAPTURED = ("device", "dtype", "steps", "height", "width", "seed", "extra_seeds", "quick", "rounds", "warmup",
            "speed_table", "compile", "fast", "disable", "offload", "vae_tiling", "num_frames", "guidance",
            "guidance_trunc", "true_cfg", "negative_prompt")
#: Given to the judge, these name files on the capturing machine: the bundle holds their content instead.
BY_CONTENT = ("prompts", "images", "prompt_set", "transformer")


#: What a capture's device probe answers from the family's probe class (no computation).
FAMILY_ATTRIBUTES = ("takes_images", "default_prompts", "negative_prompt", "exact_optimisations",
                     "approximate_optimisations", "default_steps", "informative_outputs")


def reduced_outputs(out: dict[str, Any], reduce: Any) -> dict[str, Any]:
    """Every output of a step (or a post-network step): floating ones reduced by the bundle's sampling plan
    (the same plan on every side), the rest (URSA's sampled tokens) whole."""
    return {k: reduce(v) if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in out.items()}


class CaptureError(GoldenError):
    """A capture that cannot be judged with these options (exit 2, one line)."""


def _same(name: str, given: Any, stored: Any) -> bool:
    """A given setting equals the bundle's (a dtype by what it names: bf16 is bfloat16)."""
    if name == "dtype" and isinstance(given, str) and given.lower() in DTYPES:
        given = dtype_name(DTYPES[given.lower()])
    if isinstance(given, tuple):
        given = list(given)
    return bool(given == stored)


def run_key(cfg: RunConfig, images: list[Image.Image] | None = None) -> str:
    """What makes two device runs the same run: every RunConfig field that changes what or how it computes
    (not where its files are: paths differ between the capturing and the judging machine), and the pixels
    of pictures handed to this run only (a semantic edit's source)."""
    skip = {"model", "device", "dtype", "images", "transformer_file", "output", "record", "perf_dump", "quiet",
            "overwrite"}
    fields = {k: v for k, v in vars(cfg).items() if k not in skip}
    if images:
        fields["pictures"] = [image_hash(img) for img in images]
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:24]


def prompt_set_digest(pset: Any) -> str | None:
    """A prompt set's identity (kind, ids, prompts, expectations): the semantic images were drawn for it."""
    if pset is None:
        return None
    return hashlib.sha256(json.dumps(pset.to_json(), sort_keys=True, default=str).encode()).hexdigest()


# ---- the judge's options ------------------------------------------------------------------------------
def read_manifest(folder: str | Path) -> dict[str, Any]:
    """The manifest alone (to fill the options; :func:`open_capture` verifies the whole bundle later)."""
    from ..runtime.reading import read_text
    from .bundle import MAX_MANIFEST_BYTES
    from .schema import CAPTURE_MANIFEST, SchemaError, check

    root = Path(folder)
    try:
        manifest = json.loads(read_text(root / "manifest.json", limit=MAX_MANIFEST_BYTES, root=root,
                                        what=f"--capture {folder}: manifest.json", error=CaptureError))
    except (CaptureError, ValueError, RecursionError):
        raise CaptureError(f"--capture {folder} is not a capture bundle (no readable manifest.json); make one with "
                           "'difforge capture'.") from None
    if not isinstance(manifest, dict) or manifest.get("format") != CAPTURE_FORMAT:
        raise CaptureError(f"--capture {folder} is not a capture bundle (format "
                           f"{manifest.get('format') if isinstance(manifest, dict) else None!r}).")
    try:
        check(manifest, {"model": CAPTURE_MANIFEST["model"], "options": CAPTURE_MANIFEST["options"]})
    except SchemaError as exc:
        raise CaptureError(f"--capture {folder}: manifest.json is malformed at {exc}; capture again.") from None
    return manifest


def judge_options(given: dict[str, Any]) -> dict[str, Any]:
    """``validate --capture C``'s options: the given ones, the rest from the bundle; a given run setting that
    differs from the bundle's is refused (it would judge other runs than the device made)."""
    folder = given["capture"]
    manifest = read_manifest(folder)
    settings = manifest["options"]
    out = {k: v for k, v in given.items() if k not in BY_CONTENT or v}
    for name in CAPTURED:
        if name in given and not _same(name, given[name], settings.get(name)):
            flag = "--" + name.replace("_", "-")
            raise CaptureError(f"--capture {folder} was made with {flag} {settings.get(name)!r}, this validation "
                               f"asks for {flag} {given[name]!r}; pass the bundle's value (or none) or capture again.")
        out[name] = settings.get(name)
    out.setdefault("model", manifest["model"])
    return out


# ---- the device's stand-ins ------------------------------------------------------------------------
class CapturedBackend:
    """The device under test as the capture measured it (nothing of it exists on the judging machine)."""

    def __init__(self, device: dict[str, Any]) -> None:
        self.info = device
        self.device = torch.device(device["device"])
        self.dtype: torch.dtype = DTYPES[device["dtype"]]
        self.random_stream: str = device["random_stream"]
        self.applied_presets: dict[str, str] = dict(device.get("describe", {}).get("env_presets_applied", {}))

    def resolve_dtype(self, _dtype: Any = None) -> torch.dtype:
        return self.dtype

    def device_name(self) -> str:
        return str(self.info.get("name") or self.device)

    def memory_allocated_bytes(self) -> int | None:
        """What the device held after loading (measured there), so the benchmark reports the device's."""
        value = self.info.get("memory_after_load")
        return None if value is None else int(value)

    def describe(self) -> dict[str, Any]:
        return dict(self.info.get("describe", {}))

    def __str__(self) -> str:
        return str(self.device)


class CapturedRunError(RuntimeError):
    """A run the device made (or failed) is not the one asked for, or failed on the device."""


class _Block(nn.Module):
    """A stand-in transformer block: returns the output the device's block gave, so block hooks
    (:func:`~.steps.capture_blocks`) see the device's recorded outputs when :meth:`CaptureProbe.forward_step`
    plays them back."""

    def forward(self, recorded: torch.Tensor) -> torch.Tensor:
        return recorded


class CaptureProbe:
    """The device under test's probe, answering from the bundle (see the module docstring)."""

    def __init__(self, bundle: Bundle, probe_type: Any) -> None:
        self.bundle = bundle
        self._type = probe_type
        data = bundle.data
        self.dtype: torch.dtype = DTYPES[bundle.manifest["device"]["dtype"]]
        self.family = str(data.get("family") or getattr(probe_type, "family", ""))
        self.size_multiple = int(data["size_multiple"])
        self.dtype_plan = {name: {sub: DTYPES[d] for sub, d in subs.items()}
                           for name, subs in bundle.manifest["dtype_plan"].items()}
        self._blocks = {name: _Block() for name in data.get("block_names", [])}

    def __getattr__(self, name: str) -> Any:
        """The family's class-level answers (prompts, optimisation names); nothing that would compute: a
        rung asking for a device computation the capture does not hold (``hasattr`` checks) skips it."""
        if name in FAMILY_ATTRIBUTES:
            return getattr(self._type, name)
        if name == "post_network_step" and self._has("post"):
            return self._post_network_step
        if name == "sampler_step" and self._has("sampler"):
            return self._sampler_step
        raise AttributeError(f"a capture's device has no {name!r}")

    def _has(self, part: str) -> bool:
        """Every recorded step kept ``part`` (its post-network step, its sampler step)."""
        steps = self.bundle.data.get("steps") or {}
        return bool(steps) and all(part in s for runs in steps.values() for s in runs)

    def _sampler_step(self, cfg: RunConfig, i: int, inputs: dict[str, torch.Tensor], logits: torch.Tensor,
                      **_kw: Any) -> dict[str, torch.Tensor]:
        """The device's sampler step at its state ``i`` on its own logits, its targets its own draws."""
        return dict(self._step(cfg, i)["sampler"])

    def sampler_teacher(self, cfg: RunConfig, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(the logits the device's sampler step was fed, the targets it drew): what every side is fed."""
        step = self._step(cfg, i)
        return step["out"]["logits"], step["sampler"]["x1"]

    def _post_network_step(self, cfg: RunConfig, i: int, inputs: dict[str, torch.Tensor],
                           teacher: dict[str, torch.Tensor], **_kw: Any) -> dict[str, torch.Tensor]:
        """The device's post-network step at its state ``i``, fed its own outputs there (``teacher``: the
        judge feeds the reference and floor the same stored outputs, :class:`JudgeSide`)."""
        return dict(self._step(cfg, i)["post"]["out"])

    def teacher(self, cfg: RunConfig, i: int) -> dict[str, torch.Tensor]:
        """The device's own outputs at its state ``i``, whole: what its post-network step was fed."""
        return dict(self._step(cfg, i)["post"]["teacher"])

    def portable_stream(self, cfg: RunConfig) -> bool:
        """Whether the device's runs drew from the portable stream (measured there, for validate's config)."""
        return bool(self.bundle.data.get("portable_stream"))

    # ---- teacher-forced steps -------------------------------------------------------------------
    def _step(self, cfg: RunConfig, i: int) -> dict[str, Any]:
        steps = self.bundle.data["steps"].get(str(cfg.seed))
        if steps is None or not 0 <= i < len(steps):
            raise CapturedRunError(f"the capture holds no teacher-forced step {i} for seed {cfg.seed}")
        return steps[i]

    def states(self, seed: int) -> list[dict[str, torch.Tensor]]:
        """The teacher-forcing states of ``seed``: the device's own recorded inputs of every step of its free run
        (a capture made with ``--golden``: the golden reference's)."""
        return list(self.bundle.data["states"][str(seed)])

    def forward_step(self, cfg: RunConfig, i: int, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        step = self._step(cfg, i)
        for name, outputs in step["blocks"].items():  # block hooks, when installed, see what the device's saw
            block = self._blocks.get(name)
            for out in outputs if block is not None else ():
                block(out)
        return dict(step["out"])

    def transformer_blocks(self) -> list[tuple[str, nn.Module]]:
        return list(self._blocks.items())

    def modules(self) -> dict[str, nn.Module]:
        return {}

    # ---- components, operators, FLOPs -------------------------------------------------------------
    def component_inputs(self, cfg: RunConfig) -> dict[str, dict[str, torch.Tensor]]:
        return self.bundle.data["components"]["inputs"]

    def run_component(self, name: str, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.bundle.data["components"]["outputs"][name]

    def operator_cases(self, *_args: Any) -> list[OpCase]:
        return [OpCase(c["op"], c["impl"], bool(c["exact"]), c["shape"], c["dut"].float(), c["ref"], c["floor"].float(),
                       c["note"])
                for c in self.bundle.data["operator"]["cases"]]

    def recorded_captures(self, cfg: RunConfig, inputs: dict[str, torch.Tensor]) -> Iterator[Capture]:
        """The traced calls the device kept (step 0, then each component), one component at a time."""
        for stored in self.bundle.data["operator"]["captures"]:
            yield load_capture(stored)

    def flops_per_step(self, cfg: RunConfig) -> dict[str, Any]:
        flops = self.bundle.data.get("flops")
        if flops is None:
            raise NotImplementedError("the capture holds no FLOP count")
        return flops


class CapturedPipe:
    """The device-under-test pipeline: its runs, replayed from the bundle in the order they were made."""

    def __init__(self, bundle: Bundle, probe: CaptureProbe) -> None:
        self.bundle = bundle
        self.captured_probe = probe
        self._next: dict[str, int] = {}

    def load_record(self) -> RunRecord:
        return RunRecord.from_dict(self.bundle.data["load_record"])

    def replay_run(self, cfg: RunConfig, record: RunRecord | None, trace: StepTrace | None,
                   images: list[Image.Image] | None) -> tuple[list[Image.Image], RunRecord]:
        key = run_key(cfg, images)
        runs = self.bundle.data["runs"].get(key, [])
        n = self._next.get(key, 0)
        if n >= len(runs):
            raise CapturedRunError(f"the capture holds {len(runs)} device run(s) of this configuration (prompt "
                                   f"{cfg.prompt[:40]!r}, seed {cfg.seed}), and run {n + 1} was asked for")
        self._next[key] = n + 1
        run = runs[n]
        if run.get("error"):
            raise CapturedRunError(f"on the device: {run['error']}")
        if trace is not None:
            stored = run.get("trace")
            if stored is None:
                raise CapturedRunError("the capture kept no step trace of this run")
            trace.inputs, trace.outputs = list(stored["inputs"]), list(stored["outputs"])
        kind = str(self.bundle.data["load_record"].get("kind", "generate"))
        rec = RunRecord.from_dict(run["record"]) if run.get("record") else (record or RunRecord(kind=kind))
        return self.bundle.images(run["images"]), rec


class JudgeSide:
    """The reference (or the floor) as the judge runs it against a capture: fed the device's component
    inputs, teacher-forced on the device's states, its outputs reduced with the bundle's sampling plan."""

    def __init__(self, probe: Any, device: CaptureProbe, reducer: Reducer) -> None:
        self._probe = probe
        self._device = device
        self._reducer = reducer

    def __getattr__(self, name: str) -> Any:
        if name in ("post_network_step", "sampler_step"):  # only when the capture kept the device's
            if not hasattr(self._device, name):
                raise AttributeError(name)
            return self._post_network_step if name == "post_network_step" else self._sampler_step
        return getattr(self._probe, name)

    def _sampler_step(self, cfg: RunConfig, i: int, inputs: dict[str, torch.Tensor], logits: torch.Tensor,
                      emulate: torch.dtype | None = None, x1: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """This side's sampler step on the device's logits at the device's state ``i`` (not ``logits``), its rates
        computed for the device's drawn targets (not ``x1``): every side computes the scheduler's arithmetic from
        the same tensors; the ``x1`` it returns is its own draw, so target agreement is still measured."""
        device_logits, device_x1 = self._device.sampler_teacher(cfg, i)
        out = self._probe.sampler_step(cfg, i, inputs, device_logits, emulate=emulate, x1=device_x1)
        return reduced_outputs(out, self._reducer.output)

    def component_inputs(self, cfg: RunConfig) -> dict[str, dict[str, torch.Tensor]]:
        return self._device.component_inputs(cfg)

    def run_component(self, name: str, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self._reducer.output(self._probe.run_component(name, inputs))

    def forward_step(self, cfg: RunConfig, i: int, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return reduced_outputs(self._probe.forward_step(cfg, i, inputs), self._reducer.output)

    def _post_network_step(self, cfg: RunConfig, i: int, inputs: dict[str, torch.Tensor],
                           teacher: dict[str, torch.Tensor], **kw: Any) -> dict[str, torch.Tensor]:
        """This side's post-network step fed the device's own outputs at the device's state ``i`` (the teacher the
        device's step was fed), not ``teacher``: every side then computes the stage from the same tensors."""
        out = self._probe.post_network_step(cfg, i, inputs, self._device.teacher(cfg, i), **kw)
        return reduced_outputs(out, self._reducer.output)

    def recorded_blocks(self, cfg: RunConfig, step: int) -> dict[str, list[torch.Tensor]]:
        """Every block's output at the device's state of ``step``, sampled as the device's were."""
        inputs = self._device.states(cfg.seed)[step]
        with capture_blocks(self._probe, reduce=self._reducer.block) as (_names, store):
            self._probe.forward_step(cfg, step, inputs)
        return store


class Captured:
    """An opened, verified capture checked against one validation's options."""

    def __init__(self, bundle: Bundle, probe_type: Any) -> None:
        self.bundle = bundle
        self.manifest = bundle.manifest
        self.backend = CapturedBackend(bundle.manifest["device"])
        self.probe = CaptureProbe(bundle, probe_type)
        self.pipe = CapturedPipe(bundle, self.probe)

    def side(self, probe: Any) -> JudgeSide | None:
        return None if probe is None else JudgeSide(probe, self.probe, self.bundle.reducer)

    def states(self, seed: int) -> StepTrace:
        """The device's free-running states of ``seed`` as a trace to teacher-force on (no outputs: the
        step rung's replay self-check is for a reference's own run)."""
        inputs = self.probe.states(seed)
        return StepTrace(inputs=inputs, outputs=[{} for _ in inputs])

    def summary(self) -> dict[str, Any]:
        """What the report says about the capture the device side came from."""
        m = self.manifest
        return {"path": str(self.bundle.folder.resolve()), "created": m.get("created"), "difforge": m.get("difforge"),
                "torch": m.get("torch"), "device": m["device"]["label"], "device_name": m["device"].get("name"),
                "digest": self.digest(), "bytes": m.get("bytes"), "environment": m.get("environment", {}),
                "weights": len(m.get("weights", {})), "budget": m.get("budget")}

    def budget_note(self) -> str | None:
        """The report's line on a capture made under ``--max-bytes`` (which caps bounded the device's side)."""
        b = self.manifest.get("budget")
        if not b:
            return None
        return (f"the capture was made under --max-bytes {b['max_bytes']} (level {b['level']}: {b['calls_per_op']} "
                f"operator calls per op type and component, {b['call_bytes']} B per call, {b['outputs']} output "
                f"elements per call, block outputs sampled to {b['block_sample']}); the operator rung judges those "
                "calls and samples, the other rungs what validate keeps")

    def digest(self) -> str:
        return self.bundle.digest

    def check_golden(self, golden: Any) -> None:
        """``--golden`` with ``--capture``: the device must have been teacher-forced on that very bundle's states
        (and its outputs sampled by its plan), so ``capture --golden`` with the same bundle is required."""
        made_with = (self.manifest.get("golden") or {}).get("digest")
        if made_with is None:
            raise CaptureError(f"--capture {self.bundle.folder} was made on the device's own states, not on a golden "
                               "bundle's: judge it without --golden, or capture with --golden G.")
        if made_with != golden.bundle.digest:
            raise CaptureError(f"--capture {self.bundle.folder} was teacher-forced on another golden bundle than "
                               f"--golden {golden.bundle.folder}; give the bundle the capture was made with.")


def open_capture(options: Any, probe_type: Any) -> Captured:
    """Open ``options.capture``, verify every file, and check the weights, inputs and settings against the
    options before anything loads.  Raises CaptureError (exit 2)."""
    from .inputs import read_prompts

    bundle = open_bundle(str(options.capture), fmt=CAPTURE_FORMAT, flag="--capture", maker="difforge capture",
                         digest=parse_digest(getattr(options, "capture_digest", None), "--capture-digest"))
    check_shape(bundle)
    m = bundle.manifest
    where = f"--capture {options.capture}"
    folder, _family = resolve_model(options.model)
    diff = first_difference(m["weights"], weight_hashes(folder, getattr(options, "transformer", None)))
    if diff is not None:
        raise CaptureError(f"{where} was made from other weights than --model {options.model} ({diff}); judge it "
                           "with the weights the device ran, or capture again.")
    settings = m["options"]
    for name in CAPTURED:
        if not _same(name, getattr(options, name), settings.get(name)):
            flag = "--" + name.replace("_", "-")
            raise CaptureError(f"{where} was made with {flag} {settings.get(name)!r}, this validation asks for {flag} "
                               f"{getattr(options, name)!r}; pass the bundle's value (or none) or capture again.")
    if options.prompts:
        prompts = read_prompts(options.prompts)[:1] if options.quick else read_prompts(options.prompts)
        if prompts != m["inputs"]["prompts"]:
            raise CaptureError(f"{where} was made with other prompts than --prompts {options.prompts}; give the same "
                               "prompts, or none to use the bundle's.")
    if options.images:
        given = [image_hash(img) for img in load_images([str(p) for p in options.images])]
        if given != [x["sha256"] for x in m["inputs"]["images"]]:
            raise CaptureError(f"{where} was made from other input pictures than --image "
                               f"{' '.join(str(p) for p in options.images)}; give the same pictures, or none.")
    return Captured(bundle, probe_type)


def check_prompt_set(captured: Captured, pset: Any) -> None:
    """The semantic images were drawn for the bundle's prompt set: the judge's must be the same set."""
    want = captured.manifest["inputs"].get("prompt_set")
    if prompt_set_digest(pset) != want:
        raise CaptureError(f"--capture {captured.bundle.folder}: the device drew its semantic pictures for another "
                           "prompt set than this validation's (--prompt-set); give the set the capture used.")


def capture_images(captured: Captured) -> tuple[list[str], list[Image.Image]]:
    """The bundle's input pictures (paths inside it, decoded)."""
    paths = [str(captured.bundle.path(x["file"])) for x in captured.manifest["inputs"]["images"]]
    return paths, load_images(paths) if paths else []


__all__ = ["CAPTURED", "bundle_digest", "CaptureError", "CaptureProbe", "Captured", "CapturedBackend", "CapturedPipe", "JudgeSide",
           "judge_options", "open_capture", "run_key"]
