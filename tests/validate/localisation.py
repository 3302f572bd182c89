"""Where a planted fault first changes the transformer: the *expected* answer of validate's localisation.

``difforge validate``'s step rung replays the first failing teacher-forced step with hooks on every
transformer block and names the first divergent one (report.json: ``rungs.step.data.localisation.
first_divergent``).  To score that answer (issue 10: "the first divergent layer is named correctly for
>= 70 % of the faults that sit in the transformer"), the right answer must be known without asking
validate.  It is measured here, from the fault's own firing count:

1. the tiny model is loaded in the device's dtype (bfloat16) on the CPU through
   :func:`difforge.engine.load_pipeline`, and run once *clean* with a step trace, with the same
   configuration validate's ``--quick`` run uses (so Qwen-Image-Edit's prepared prompt / image state is
   cached and a teacher-forced step runs the transformer alone);
2. with the fault's mode active, step ``i`` of that trace is replayed through the family probe's
   ``forward_step`` - the very call validate's step rung makes - with forward pre- and post-hooks on
   the transformer module and on every block of ``probe.transformer_blocks()``, each logging how many
   *effective* fires the fault has had (faulted calls whose result differs from the clean call's: a
   ``cat_swap`` of ``cat([x, x])``, as Qwen-Image-Edit's batched CFG makes, changes nothing);
3. the first hook that sees one says where the fault first changed a result: inside a block
   (between its pre- and post-hook), between two blocks or before the first one (the next block is
   then the first whose *output* differs), after the last block but still inside the transformer (a
   final norm / head not listed as a block: validate's "after the last block"), or outside the
   transformer (before it is entered or after it returned, e.g. URSA's scheduler).

A fault sits in the transformer when its first effective fire of that replay is inside the transformer
module; one that fires first outside it (text encoder, VAE, scheduler) or never during the replay is left out
of the localisation score.  :func:`expected_blocks` does every fault of one model on one load.

    python -m tests.validate.localisation --models tiny-ursa,tiny-qwen-edit --faults all
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from difforge import engine
from difforge.config import RunConfig
from difforge.devices import dtype_name, get_backend
from difforge.models.registry import family_of, probe_class, probe_for
from difforge.runtime.images import test_picture
from difforge.validate.steps import StepTrace

from . import faults

#: Where a fault first fired, relative to the transformer's blocks (see the module doc).
WHERE_NEVER, WHERE_OUTSIDE, WHERE_BLOCK, WHERE_BEFORE, WHERE_AFTER = (
    "never", "outside", "in block", "before block", "after the last block")
IN_TRANSFORMER = (WHERE_BLOCK, WHERE_BEFORE, WHERE_AFTER)
#: Validate's ``--quick`` steps and the sweep's size (scripts/fault_sweep.py MODEL_ARGS).
QUICK_STEPS = 4
SIZE = 64
#: validate's synthetic edit input side (difforge.validate.ladder.SYNTHETIC_SIZE).
SYNTHETIC_SIZE = 512


@dataclass
class Replay:
    """A loaded low-precision pipeline with one clean run's step trace, ready for teacher-forced replays."""

    model: str
    probe: Any
    cfg: RunConfig
    trace: StepTrace
    blocks: list[str]
    #: Keeps the synthetic edit input (named in ``cfg.images``) alive while the replay is used.
    tmp: Any = None


@dataclass
class FirstFire:
    """Where one fault first fired during a teacher-forced transformer forward."""

    fault: str
    model: str
    step: int
    #: Faulted calls during the whole replayed step; those that changed a result (effective); the
    #: effective ones inside the transformer module.
    fired: int = 0
    effective: int = 0
    fired_in_transformer: int = 0
    #: One of ``never``, ``outside``, ``in block``, ``before block``, ``after the last block``.
    where: str = WHERE_NEVER
    #: The block it fired in (``in block``) or right before (``before block``); None otherwise.
    block: str | None = None
    #: Effective fires per block, summed over the block's calls (e.g. both CFG passes).
    per_block: dict[str, int] = field(default_factory=dict)

    @property
    def sits_in_transformer(self) -> bool:
        return self.where in IN_TRANSFORMER

    @property
    def expected(self) -> str | None:
        """The block validate should name first divergent: the block the fault first fired in or right
        before; None when it first fired after the last block (validate: "after the last block") or does
        not sit in the transformer."""
        return self.block if self.where in (WHERE_BLOCK, WHERE_BEFORE) else None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "expected": self.expected, "sits_in_transformer": self.sits_in_transformer}


def run_config(model: str, seed: int = 0, height: int = SIZE, width: int = SIZE, steps: int = QUICK_STEPS,
               dtype: torch.dtype = torch.bfloat16, images: list[str] | None = None) -> RunConfig:
    """The configuration validate's device run uses (difforge.validate.ladder.Ladder.config)."""
    probe_type = probe_class(family_of(model))
    return RunConfig(model=model, prompt=probe_type.default_prompts[0], device="cpu", dtype=dtype_name(dtype),
                     height=height, width=width, steps=steps, seed=seed, images=list(images or []), quiet=True,
                     negative_prompt=probe_type.negative_prompt)


def prepare(model: str, seed: int = 0, height: int = SIZE, width: int = SIZE, steps: int = QUICK_STEPS,
            dtype: torch.dtype = torch.bfloat16) -> Replay:
    """Load ``model`` on the CPU in ``dtype`` and run it once clean, recording every step's inputs."""
    backend = get_backend("cpu")
    probe_type = probe_class(family_of(model))
    tmp: Any = None
    image_paths: list[str] = []
    images = None
    if probe_type.takes_images:  # validate's synthetic test picture, saved as validate saves it
        tmp = tempfile.TemporaryDirectory(prefix="difforge-loc-")
        path = Path(tmp.name) / "input_synthetic.png"
        picture = test_picture(SYNTHETIC_SIZE)
        picture.save(path, format="PNG")
        image_paths, images = [str(path)], [picture]
    cfg = run_config(model, seed, height, width, steps, dtype, image_paths)
    pipe = engine.load_pipeline(model, backend, dtype, cfg=cfg)
    trace = StepTrace()
    engine.run_pipeline(pipe, cfg, images=images, step_hook=trace.hook)
    probe = probe_for(pipe)
    return Replay(model, probe, cfg, trace, [name for name, _ in probe.transformer_blocks()], tmp)


def _clones(value: Any) -> Any:
    """``value`` with every tensor cloned (one level into lists / tuples / dicts), for a clean side call."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, list | tuple):
        return type(value)(v.clone() if isinstance(v, torch.Tensor) else v for v in value)
    if isinstance(value, dict):
        return {k: _clones(v) for k, v in value.items()}
    return value


def _differs(a: Any, b: Any) -> bool:
    """The faulted result ``a`` is not the clean ``b`` (anything but tensors / sequences of them: assume so)."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape != b.shape or not torch.equal(a, b)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) != len(b) or any(_differs(x, y) for x, y in zip(a, b, strict=True))
    return True


def effective(fault: faults.Fault) -> tuple[faults.Fault, list[int]]:
    """A copy of ``fault`` that also counts its *effective* fires: faulted calls whose result differs from
    the clean call's (run on arguments cloned before the faulted call, so in-place faults compare too).  A fire that
    changes nothing - ``cat_swap`` swapping ``cat([x, x])`` - is not where the fault enters."""
    count = [0]
    inject = fault.inject

    def counted(f: faults.Fault, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        spare_args, spare_kwargs = _clones(args), _clones(kwargs)  # before an in-place fault writes
        out = inject(f, func, args, kwargs)
        if out is not faults.SKIP and _differs(out, func(*spare_args, **spare_kwargs)):
            count[0] += 1
        return out

    copy = faults.Fault(fault.name, fault.what, tuple(fault.targets), counted, fault.family, tuple(fault.observe),
                        fault.follow, fault.dry)
    return copy, count


def first_fire(fault: faults.Fault, replay: Replay, step: int = 0) -> FirstFire:
    """Replay ``step`` of ``replay`` inside (a fresh counting copy of) ``fault`` and say where it first
    changed a result (its first *effective* fire, see :func:`effective`)."""
    probe = replay.probe
    transformer = probe.modules()["transformer"]
    mode, changed = effective(fault)
    events: list[tuple[str, str, int]] = []  # (pre/post, block name or "", effective fires so far)
    handles = []

    def watch(module: torch.nn.Module, name: str) -> None:
        def pre(_m: Any, _a: Any) -> None:
            events.append(("pre", name, changed[0]))

        def post(_m: Any, _a: Any, _o: Any) -> None:
            events.append(("post", name, changed[0]))

        handles.append(module.register_forward_pre_hook(pre))
        handles.append(module.register_forward_hook(post))

    watch(transformer, "")
    for name, module in probe.transformer_blocks():
        watch(module, name)
    try:
        with mode:
            probe.forward_step(replay.cfg, step, replay.trace.inputs[step])
    finally:
        for h in handles:
            h.remove()
    result = FirstFire(fault.name, replay.model, step, fired=mode.fired, effective=changed[0])
    entered: dict[str, int] = {}
    inside_from: int | None = None
    for kind, name, count in events:  # effective fires inside the transformer module, and per block
        if not name:
            if kind == "pre":
                inside_from = count
            elif inside_from is not None:
                result.fired_in_transformer += count - inside_from
                inside_from = None
        elif kind == "pre":
            entered[name] = count
        elif name in entered:
            result.per_block[name] = result.per_block.get(name, 0) + count - entered.pop(name)
    first = next(((kind, name) for kind, name, count in events if count > 0), None)
    if first is None:
        result.where = WHERE_OUTSIDE if changed[0] else WHERE_NEVER  # after the transformer returned
    else:
        kind, name = first
        if not name:  # the transformer's own hook saw it first: before it was entered, or after its last block
            result.where = WHERE_OUTSIDE if kind == "pre" else WHERE_AFTER
        else:
            result.where, result.block = (WHERE_BLOCK, name) if kind == "post" else (WHERE_BEFORE, name)
    return result


def expected_block(fault_name: str, replay: Replay, step: int = 0) -> FirstFire:
    """:func:`first_fire` of a fresh instance of the catalogued fault ``fault_name``."""
    fault = faults.get(fault_name)
    if fault is None:
        return FirstFire(fault_name, replay.model, step)
    return first_fire(fault, replay, step)


def expected_blocks(model: str, names: Iterable[str] | None = None, seed: int = 0, step: int = 0,
                    height: int = SIZE, width: int = SIZE, steps: int = QUICK_STEPS) -> dict[str, FirstFire]:
    """:func:`expected_block` of every fault in ``names`` (default: the catalogue) on one load of ``model``."""
    replay = prepare(model, seed, height, width, steps)
    return {name: expected_block(name, replay, step) for name in (names or list(faults.FAULTS))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Where each planted fault first fires in the transformer forward")
    ap.add_argument("--models", default="tiny-ursa,tiny-qwen-edit")
    ap.add_argument("--faults", default="all", help="comma-separated fault names, or 'all'")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--step", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    names = list(faults.FAULTS) if args.faults == "all" else [n.strip() for n in args.faults.split(",") if n.strip()]
    out: list[dict[str, Any]] = []
    for model in [m.strip() for m in args.models.split(",") if m.strip()]:
        for name, ff in expected_blocks(model, names, args.seed, args.step).items():
            out.append(ff.to_dict())
            print(f"{model:15s} {name:18s} {ff.where:22s} expected {ff.expected!s:22s} fired {ff.fired} "
                  f"({ff.effective} effective, {ff.fired_in_transformer} of them in the transformer)")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
