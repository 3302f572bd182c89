"""Golden bundles: compute the reference and the floor once, anywhere; validate on the device later.

msprobe's dump-then-compare workflow, for the seed reports' problem: a 20B model takes more than
30 s per step on a CPU, and NPU hosts have weak CPUs.  ``difforge golden`` (:func:`make_golden`)
runs, on the machine that has the reference device, every reference and floor computation a
validation compares against - the free-running runs per seed (images, per-step latents/tokens and
the teacher-forcing inputs), each step's replayed outputs with every transformer block's output,
the component inputs and outputs, the gallery's reference images - and stores them in a bundle
(:mod:`.bundle`).  ``difforge validate --golden G`` then loads only the device under test and reads
the reference side from the bundle through :class:`GoldenProbe` (the probe interface the rungs
already speak), so the rungs are the same code with or without a bundle.

A bundle is refused (exit 2, one line) when it was made from other weights (sha256 of every model
file and of ``--transformer``), other inputs (prompts, input pictures), other settings (dtype,
steps, size, seeds, guidance …), for a device holding its modules in other dtypes than the floor
emulated, by an incompatible difforge, or when any of its files changed since it was written.

What is *not* in a bundle: the operator rung's cases.  They are the device's own captured calls,
replayed on the host's float32 kernels (single operators, bounded by :mod:`.tracing`'s caps), so
they cannot be computed before the device has run; the report says so.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from ..config import RunConfig
from ..devices import BACKENDS, dtype_name
from ..errors import InputError
from ..models.registry import resolve_model
from ..runtime.images import load_images
from ..version import __version__
from .bundle import (
    FORMAT,
    FORMAT_VERSION,
    Bundle,
    BundleWriter,
    GoldenError,
    Reducer,
    check_shape,
    first_difference,
    image_hash,
    open_bundle,
    parse_digest,
    weight_hashes,
)
from .floor import module_dtypes
from .ladder import Ladder
from .options import ValidateOptions
from .steps import StepTrace, capture_blocks, primary_key
from .trajectory import LATENT_KEYS, TrajectoryRun

#: ValidateOptions fields that decide what the reference computes; a bundle holds them and validate
#: must run with the same values (the device-only ones - device, compile, offload ... - may differ).
SETTINGS = ("steps", "height", "width", "seed", "extra_seeds", "quick", "guidance", "guidance_trunc",
            "true_cfg", "negative_prompt", "num_frames")


def settings_of(options: ValidateOptions, lad: Ladder) -> dict[str, Any]:
    """The reference-defining settings of a validation (resolved: the dtype by its name)."""
    out = {name: getattr(options, name, None) for name in SETTINGS}
    out["dtype"] = dtype_name(lad.dut_dtype)
    out["family"] = lad.family
    disable, fast = lad.stream_names()  # which random stream the reference drew from (URSA: philox or not)
    out["stream"] = {"disable": disable, "fast": fast}
    return out


def _step_outputs(out: dict[str, torch.Tensor], reduce: Any) -> dict[str, torch.Tensor]:
    """What a step's replay contributes to the comparison: its primary output (reduced) and tokens."""
    key = primary_key(out)
    kept = {key: reduce(out[key])}
    if "tokens" in out:
        kept["tokens"] = out["tokens"]
    return kept


def _trace_data(trace: StepTrace) -> dict[str, Any]:
    """A run's step trace as the bundle keeps it: every step's inputs whole (the device replays them) and
    the latent/token outputs the trajectory rung compares step by step."""
    return {"inputs": [dict(x) for x in trace.inputs],
            "outputs": [{k: v for k, v in o.items() if k in LATENT_KEYS} for o in trace.outputs]}


@dataclass
class GoldenResult:
    out: Path
    manifest: dict[str, Any]
    seconds: float


def make_golden(options: ValidateOptions, log: Any = None, for_device: str = "cpu") -> GoldenResult:
    """Compute everything validate compares against and write it to ``options.out`` (a bundle).

    ``options.device``/``dtype`` name where the device-under-test's dtype plan is read (the host, by
    default) and the dtype under test; the reference is ``options.reference``; the floor is emulated
    unless ``options.floor`` names a second device.  ``for_device`` (``cpu``, ``npu``, ``cuda`` ...) is the
    kind of device the bundle is for: the reference draws from that backend's default random stream.
    """
    say = log or (lambda _msg: None)
    t_start = time.perf_counter()
    options.check()
    lad = Ladder(options, making_golden=True)
    kind = str(for_device).split(":")[0].strip().lower()
    if kind not in BACKENDS:
        raise InputError(f"--for-device {for_device}: use one of {', '.join(BACKENDS)}.")
    lad.stream_default = BACKENDS[kind].random_stream
    folder, _family = resolve_model(options.model)
    transformer = getattr(options, "transformer", None)
    lad.prepare_inputs()
    say(f"load {options.model}: the dtype plan at {dtype_name(lad.dut_dtype)} on {lad.dut_backend.device}, the "
        f"reference {lad.ref_label}")
    plan_pipe, _ = lad.load(lad.dut_backend, lad.dut_dtype, dut=True)
    lad.check_size(plan_pipe)
    ref_pipe, _ = lad.load(lad.ref_backend, lad.ref_dtype)
    lad.ref = ref_pipe
    lad.make_out_dir()
    try:
        writer = BundleWriter(lad.work, Reducer())
        inputs = [writer.image(img, f"inputs/input_{k}.png") for k, img in enumerate(lad.images)]
        lad.image_paths = [str(lad.work / name) for name in inputs]
        floor_pipe = lad.load_floor(plan_pipe)
        plan = {name: module_dtypes(m, lad.probe(plan_pipe).dtype) for name, m in lad.probe(plan_pipe).modules().items()}
        dtype_plan = {name: {sub: dtype_name(d) for sub, d in subs.items()} for name, subs in plan.items()}
        lad._probes.pop(id(plan_pipe), None)
        del plan_pipe  # only its dtype plan was needed
        say(f"floor: {lad.floor_label}")
        data = _record(lad, writer, ref_pipe, floor_pipe, say)
        msprobe = None
        if options.msprobe:
            emulated = lad.emulation is not None
            if emulated:  # the float32 floor (and its rounding hooks) is done with: free it before the dtype copy
                lad._probes.pop(id(floor_pipe), None)
                lad.floor_pipe = lad.emulation = floor_pipe = None
            msprobe = _msprobe_dump(lad, writer, data, ref_pipe, floor_pipe, plan, emulated, say)
        manifest = {
            "format": FORMAT, "format_version": FORMAT_VERSION, "difforge": __version__,
            "torch": torch.__version__, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "model": options.model, "settings": settings_of(options, lad),
            "weights": weight_hashes(folder, transformer),
            "inputs": {"prompts": list(lad.prompts), "images": [
                {"file": name, "sha256": image_hash(img)} for name, img in zip(inputs, lad.images, strict=True)],
                "synthetic": lad.synthetic},
            "reference": {"label": lad.ref_label, "device": str(lad.ref_backend.device),
                          "dtype": dtype_name(lad.ref_dtype)},
            "floor": {"label": lad.floor_label, "kind": data.pop("floor_kind"), "dtype_plan": dtype_plan},
            "notes": list(lad.notes),
        }
        if msprobe is not None:
            manifest["msprobe"] = msprobe
        manifest = writer.finish(manifest, data)
        lad.publish()
    except BaseException:
        lad.discard_output()
        raise
    return GoldenResult(Path(options.out), manifest, time.perf_counter() - t_start)


def _record(lad: Ladder, writer: BundleWriter, ref_pipe: Any, floor_pipe: Any, say: Any) -> dict[str, Any]:
    """Run the reference (and floor) through every computation validate compares against."""
    o = lad.o
    seeds = [o.seed, *[s for s in o.extra_seeds if s != o.seed]]
    ref = lad.probe(ref_pipe)
    floor = lad.probe(floor_pipe) if floor_pipe is not None else None
    floor_kind = "reference" if floor_pipe is ref_pipe else ("none" if floor_pipe is None else "floor")
    reduce_out, reduce_block = writer.reducer.output, writer.reducer.block
    data: dict[str, Any] = {"seeds": seeds, "runs": {}, "floor_kind": floor_kind}
    for seed in seeds:
        cfg = lad.dut_cfg(seed=seed)
        say(f"seed {seed}: reference run")
        rtr = StepTrace()
        rimgs, _ = lad.run(ref_pipe, lad.ref_cfg(cfg), trace=rtr)
        entry: dict[str, Any] = {
            "ref": {"images": [writer.image(im, f"images/reference_seed{seed}_{k}.png") for k, im in enumerate(rimgs)],
                    "trace": writer.put(_trace_data(rtr), f"seed{seed}/ref/trace")},
            "floor": None, "steps": []}
        if floor_kind == "floor":
            say(f"seed {seed}: floor run")
            ftr = StepTrace()
            fimgs, _ = lad.run(floor_pipe, lad.floor_cfg(cfg), trace=ftr)
            entry["floor"] = {"images": [writer.image(im, f"images/floor_seed{seed}_{k}.png")
                                         for k, im in enumerate(fimgs)],
                              "trace": writer.put(_trace_data(ftr), f"seed{seed}/floor/trace")}
        say(f"seed {seed}: {len(rtr.inputs)} teacher-forced steps with every transformer block")
        for i, step_inputs in enumerate(rtr.inputs):
            with capture_blocks(ref, reduce=reduce_block) as (_n, rblocks):
                rout = ref.forward_step(cfg, i, step_inputs)
            step: dict[str, Any] = {
                "ref": writer.put(_step_outputs(rout, reduce_out), f"seed{seed}/step{i}/ref"),
                "ref_blocks": writer.put(rblocks, f"seed{seed}/step{i}/ref_blocks"), "floor": None,
                "floor_blocks": None}
            if floor_kind == "floor":
                with capture_blocks(floor, reduce=reduce_block) as (_n, fblocks):
                    fout = floor.forward_step(cfg, i, step_inputs)
                step["floor"] = writer.put(_step_outputs(fout, reduce_out), f"seed{seed}/step{i}/floor")
                step["floor_blocks"] = writer.put(fblocks, f"seed{seed}/step{i}/floor_blocks")
            entry["steps"].append(step)
        data["runs"][str(seed)] = entry
    cfg0 = lad.dut_cfg()
    say("components")
    try:
        comp_inputs = ref.component_inputs(cfg0)
    except NotImplementedError:
        comp_inputs = {}
    comps: dict[str, Any] = {"inputs": writer.put(comp_inputs, "components/inputs"), "ref": {}, "floor": None}
    if floor_kind == "floor":
        comps["floor"] = {}
    for name, kwargs in comp_inputs.items():
        comps["ref"][name] = writer.put(reduce_out(ref.run_component(name, kwargs)), f"components/ref/{name}")
        if floor_kind == "floor":
            comps["floor"][name] = writer.put(reduce_out(floor.run_component(name, kwargs)),
                                              f"components/floor/{name}")
    data["components"] = comps
    gallery = []
    for k, prompt in enumerate(lad.prompts[1:], start=1):
        say(f"gallery prompt {k + 1}/{len(lad.prompts)}")
        img = lad.run(ref_pipe, lad.ref_cfg(lad.dut_cfg(prompt=prompt)))[0][0]
        gallery.append({"prompt": prompt, "image": writer.image(img, f"images/gallery_{k}_reference.png")})
    data["gallery"] = gallery
    return data


def _msprobe_dump(lad: Ladder, writer: BundleWriter, data: dict[str, Any], ref_pipe: Any, floor_pipe: Any,
                  plan: dict[str, dict[str, torch.dtype]], emulated: bool, say: Any) -> dict[str, Any]:
    """``--msprobe``: the msprobe view's golden side (:mod:`.msprobe_view`), step 0 of the first seed on the
    reference run's recorded inputs, dumped into the bundle (listed in its SHA256SUMS like every file)."""
    import gc

    from .bundle import unpack
    from .msprobe_view import golden_dump

    say("msprobe: the floor's dump of step 0")
    gc.collect()
    seed = lad.o.seed
    inputs = unpack(data["runs"][str(seed)]["ref"]["trace"], writer.tensors)["inputs"][0]
    entry, paths = golden_dump(lad, lad.work, lad.dut_cfg(seed=seed), inputs, emulated, floor_pipe, ref_pipe, plan)
    writer.files.extend(paths)
    writer.bytes += sum(p.stat().st_size for p in paths)
    return entry


# ---- validate's side --------------------------------------------------------------------------
class GoldenProbe:
    """The reference (``side="ref"``) or the floor (``"floor"``) of a bundle, as the probe the rungs call.

    Only what the bundle stored can be asked: a step of a seed it ran, a component it ran, the blocks
    of a step.  The floor side of a bundle whose floor is the reference itself is the reference's.
    """

    def __init__(self, bundle: Bundle, side: str) -> None:
        self.bundle = bundle
        self.side = side if bundle.manifest["floor"]["kind"] != "reference" else "ref"

    def _run(self, cfg: RunConfig) -> dict[str, Any]:
        try:
            return self.bundle.data["runs"][str(cfg.seed)]
        except KeyError:
            raise GoldenError(f"the golden bundle has no run for seed {cfg.seed}") from None

    def _step(self, cfg: RunConfig, i: int) -> dict[str, Any]:
        steps = self._run(cfg)["steps"]
        if not 0 <= i < len(steps):
            raise GoldenError(f"the golden bundle has no step {i} for seed {cfg.seed}")
        return steps[i]

    def forward_step(self, cfg: RunConfig, i: int, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return dict(self._step(cfg, i)[self.side])

    def recorded_blocks(self, cfg: RunConfig, step: int) -> dict[str, list[torch.Tensor]]:
        return self._step(cfg, step)[f"{self.side}_blocks"]

    def component_inputs(self, cfg: RunConfig) -> dict[str, dict[str, torch.Tensor]]:
        return self.bundle.data["components"]["inputs"]

    def run_component(self, name: str, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.bundle.data["components"][self.side][name]

    def trajectory(self, cfg: RunConfig) -> TrajectoryRun:
        """The stored free-running run of ``cfg.seed`` (images and per-step latents/inputs)."""
        run = self._run(cfg)[self.side]
        trace = StepTrace(inputs=list(run["trace"]["inputs"]), outputs=list(run["trace"]["outputs"]))
        return TrajectoryRun(self.bundle.images(run["images"]), trace)


class Reduced:
    """The device-under-test probe with its outputs reduced by the bundle's sampling plan, so each
    comparison sees the same elements on both sides (see :class:`~.bundle.Reducer`)."""

    def __init__(self, probe: Any, reducer: Reducer) -> None:
        self._probe = probe
        self._reducer = reducer
        self.reduce_block = reducer.block

    def __getattr__(self, name: str) -> Any:
        return getattr(self._probe, name)

    def forward_step(self, cfg: RunConfig, i: int, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return _step_outputs(self._probe.forward_step(cfg, i, inputs), self._reducer.output)

    def run_component(self, name: str, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self._reducer.output(self._probe.run_component(name, inputs))


@dataclass
class Golden:
    """An opened bundle checked against one validation's options."""

    bundle: Bundle

    @property
    def ref(self) -> GoldenProbe:
        return GoldenProbe(self.bundle, "ref")

    @property
    def floor(self) -> GoldenProbe | None:
        return None if self.bundle.manifest["floor"]["kind"] == "none" else GoldenProbe(self.bundle, "floor")

    @property
    def reference(self) -> tuple[str, str]:
        """(device, dtype) the bundle's reference ran on."""
        ref = self.bundle.manifest["reference"]
        return str(ref["device"]), str(ref["dtype"])

    @property
    def reference_label(self) -> str:
        return str(self.bundle.manifest["reference"]["label"])

    @property
    def floor_label(self) -> str:
        return str(self.bundle.manifest["floor"]["label"])

    def gallery_image(self, k: int) -> Image.Image | None:
        """The reference image of prompt ``k`` (0: the first seed's run)."""
        if k == 0:
            run = self.bundle.data["runs"][str(self.bundle.data["seeds"][0])]["ref"]
            return self.bundle.image(run["images"][0])
        entries = self.bundle.data["gallery"]
        return self.bundle.image(entries[k - 1]["image"]) if k - 1 < len(entries) else None


def open_golden(options: ValidateOptions) -> Golden:
    """Open ``options.golden`` and check what can be checked before anything loads: the bundle's own
    files, the weights, the inputs and the settings.  Fills the prompts and pictures from the bundle
    when the user gave none.  Raises GoldenError (exit 2)."""
    bundle = open_bundle(str(options.golden), digest=parse_digest(getattr(options, "golden_digest", None),
                                                                  "--golden-digest"))
    check_shape(bundle)
    m = bundle.manifest
    where = f"--golden {options.golden}"
    folder, _family = resolve_model(options.model)
    diff = first_difference(m["weights"], weight_hashes(folder, getattr(options, "transformer", None)))
    if diff is not None:
        raise GoldenError(f"{where} was made from other weights than --model {options.model} ({diff}); make a "
                          "bundle from these weights.")
    if options.prompts:
        from .inputs import read_prompts

        prompts = read_prompts(options.prompts)
        if options.quick:
            prompts = prompts[:1]
        if prompts != m["inputs"]["prompts"]:
            raise GoldenError(f"{where} was made with other prompts than --prompts {options.prompts}; give the same "
                              "prompts file, or none to use the bundle's.")
    if options.images:
        given = [image_hash(img) for img in load_images([str(p) for p in options.images])]
        if given != [x["sha256"] for x in m["inputs"]["images"]]:
            raise GoldenError(f"{where} was made from other input pictures than --image "
                              f"{' '.join(str(p) for p in options.images)}; give the same pictures, or none to use "
                              "the bundle's.")
    return Golden(bundle)


def check_settings(golden: Golden, options: ValidateOptions, lad: Ladder) -> None:
    """The run settings (dtype, steps, size, seeds, guidance …) must be the bundle's."""
    want = golden.bundle.manifest["settings"]
    have = settings_of(options, lad)
    for name in sorted(set(want) | set(have)):
        if want.get(name) != have.get(name) and name == "stream":
            raise GoldenError(f"--golden {options.golden}: its reference drew from another random stream than "
                              f"{lad.dut_backend.device} does; make the bundle with --for-device "
                              f"{lad.dut_backend.device.type} (or name the stream here: --disable/--fast philox-rng).")
        if want.get(name) != have.get(name):
            flag = "--" + name.replace("_", "-")
            raise GoldenError(f"--golden {options.golden} was made with {flag} {want.get(name)!r}, this validation "
                              f"runs {flag} {have.get(name)!r}; pass the bundle's value or make a new bundle.")


def check_dtype_plan(golden: Golden, probe: Any) -> None:
    """The device must hold each module in the dtype the bundle's floor rounded it to."""
    plan = golden.bundle.manifest["floor"].get("dtype_plan") or {}
    modules = probe.modules()
    for name, subs in plan.items():
        if name not in modules:
            raise GoldenError(f"--golden: the bundle's floor emulated a {name} the device pipeline does not have; "
                              "make the bundle for this configuration.")
        have = {sub: dtype_name(d) for sub, d in module_dtypes(modules[name], probe.dtype).items()}
        for sub, dtype in subs.items():
            if have.get(sub) != dtype:
                raise GoldenError(
                    f"--golden: the bundle's floor rounds {name}.{sub or '(root)'} to {dtype}, but the device holds it "
                    f"in {have.get(sub, 'no such module')}; make the bundle with the same --dtype and options.")


def golden_images(golden: Golden, names: list[str]) -> tuple[list[str], list[Image.Image]]:
    """The bundle's input pictures (paths inside the bundle, decoded)."""
    paths = [str(golden.bundle.path(n)) for n in names]
    return paths, load_images(paths) if paths else []


def refuse_reference_flags(options: ValidateOptions) -> None:
    """With ``--golden`` the reference and floor are the bundle's: naming others is a usage error."""
    if options.reference not in (None, "cpu:float32", "cpu"):
        raise InputError("--reference cannot be combined with --golden: the bundle holds the reference; make a "
                         "bundle with 'difforge golden --reference ...'.")
    if options.floor is not None:
        raise InputError("--floor cannot be combined with --golden: the bundle holds the floor; make a bundle "
                         "with 'difforge golden --floor ...'.")


__all__ = ["Golden", "GoldenProbe", "GoldenResult", "Reduced", "make_golden", "open_golden"]
