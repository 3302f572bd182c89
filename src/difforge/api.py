"""The Python API: ``load_pipeline``, ``generate``, ``edit``, ``validate``.

The CLI, the tests, the demo and users' own scripts all call these functions; the CLI only
parses arguments and prints.  This is where the user's ``--device``/``--dtype`` strings become a
backend and a dtype, once; the :mod:`~difforge.engine` below does the work with those objects.
Every user mistake surfaces as a :class:`~difforge.errors.DifforgeError`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from PIL import Image

from . import engine
from .config import RunConfig, check_transformer_file
from .devices import get_backend
from .engine import RunResult, run_pipeline, save_images
from .errors import InputError
from .runtime.environment import environment_fingerprint
from .runtime.images import load_images
from .runtime.outputs import check_output_file
from .runtime.progress import spinner
from .runtime.record import RunRecord


def load_pipeline(
    model: str,
    device: str = "auto",
    dtype: str = "auto",
    cfg: RunConfig | None = None,
    record: RunRecord | None = None,
    op_overrides: dict[str, Callable[..., Any]] | None = None,
    task: str | None = None,
) -> Any:
    """Load a model folder or built-in tiny model onto a device, diffusers-style.

    ``device``/``dtype`` are the CLI's spellings (``auto``, ``npu:1``, ``bf16`` ...), parsed here once.
    ``task`` ("generate"/"edit") makes a model of the wrong family a clear error.  The returned
    pipeline is reusable across calls to :func:`run_pipeline`.
    """
    cfg = cfg or RunConfig(model=model, device=device, dtype=dtype)
    backend = get_backend(device)
    return engine.load_pipeline(model, backend, backend.resolve_dtype(dtype), cfg=cfg, record=record,
                                op_overrides=op_overrides, task=task)


def _build_builtin(model: str | None) -> None:
    """Build a built-in tiny model before a ``--parallel`` run opens its process group.  Once
    torch.distributed is initialised, transformers writes a model's files on rank 0 only
    (``should_save_on_this_rank``), so a rank 1 that built the model inside the group would publish a
    folder with an empty text encoder for every later run to trip over."""
    from .models.tiny import TINY_MODELS, ensure_tiny

    if model in TINY_MODELS:
        ensure_tiny(model)


def _run(cfg: RunConfig, task: str, images: list[Image.Image] | None) -> RunResult:
    if cfg.parallel != "none":  # under torchrun, one rank of a --parallel run (docs/parallel.md)
        from .runtime import parallel

        return parallel.guarded(cfg.parallel, task, cfg.device, lambda group: _run_rank(cfg, task, images, group),
                                before=lambda: _build_builtin(cfg.model))
    _preflight(cfg)
    record = RunRecord(kind=task)
    with spinner(f"loading {cfg.model}", cfg.quiet):
        pipeline = load_pipeline(cfg.model, cfg.device, cfg.dtype, cfg=cfg, record=record, task=task)
    return _run_and_write(pipeline, cfg, images, record)


def _preflight(cfg: RunConfig) -> None:
    """Every output of one run checked before any work: they collide with no input or each other
    (``engine.check_outputs``), each may be replaced and can really be written (``runtime.outputs``)."""
    engine.check_outputs(cfg)
    if cfg.output:
        out = Path(cfg.output)
        per_frame = (cfg.num_frames > 1 and out.suffix.lower() in engine.IMAGE_SUFFIXES
                     and out.suffix.lower() not in engine.VIDEO_SUFFIXES)  # save_images' out_000.png ...
        for path in ([out.with_name(f"{out.stem}_{i:03d}{out.suffix}") for i in range(cfg.num_frames)] if per_frame
                     else [out]):
            check_output_file(path, "--output", overwrite=cfg.overwrite)
    for flag, path in (("--record", cfg.record), ("--perf-dump", cfg.perf_dump)):
        if path:
            check_output_file(path, flag, overwrite=cfg.overwrite, kind="json")


def _check_parallel_task(cfg: RunConfig, task: str, batched: bool) -> None:
    if cfg.parallel == "data" and not batched:
        raise InputError("--parallel data shards a --prompt-file over the ranks; give --prompt-file (or call api.batch).")
    if cfg.parallel.startswith("ulysses") and task not in ("generate", "edit"):
        raise InputError("--parallel ulysses=N is built for difforge generate (URSA) and edit (Qwen-Image-Edit).")


def _load_rank(cfg: RunConfig, task: str, record: RunRecord, group: Any) -> Any:
    """The pipeline on this rank's device (``group.backend``, from LOCAL_RANK)."""
    with spinner(f"loading {cfg.model}", cfg.quiet):
        return engine.load_pipeline(cfg.model, group.backend, group.backend.resolve_dtype(cfg.dtype), cfg=cfg,
                                    record=record, task=task)


def _rank_config(cfg: RunConfig, group: Any) -> RunConfig:
    """Rank 0 writes a ``cfg`` run's outputs; the other rank writes nothing."""
    return cfg if group.writes else dataclasses.replace(cfg, output=None, record=None, perf_dump=None)


def _run_rank(cfg: RunConfig, task: str, images: list[Image.Image] | None, group: Any) -> RunResult:
    """One ``--parallel`` run (``cfg`` mode: both ranks in step, rank 0 writes)."""
    _check_parallel_task(cfg, task, batched=False)
    _preflight(cfg)
    cfg = _rank_config(cfg, group)
    record = RunRecord(kind=task)
    return _run_and_write(_load_rank(cfg, task, record, group), cfg, images, record, group)


def _run_and_write(pipeline: Any, cfg: RunConfig, images: list[Image.Image] | None, record: RunRecord,
                   group: Any = None) -> RunResult:
    """One call on a loaded pipeline, then the outputs it asked for: images, RunRecord, perf dump."""
    result = run_pipeline(pipeline, cfg, images=images, record=record)
    if group is not None:  # a --parallel rank: the record says so; a failed run removes what it wrote
        from .runtime import parallel

        if group.mode != "data":  # cfg, ulysses: every rank ran this run in step; rank 0's record holds all
            parallel.gather_cfg_ranks(group, record)
        else:
            record.extra["parallel"] = group.describe()
        group.will_write(cfg.output, cfg.record, cfg.perf_dump)
    if cfg.output:
        result.paths = save_images(result.images, cfg.output, record)
    if cfg.record:
        record.save(cfg.record)
    if cfg.perf_dump:
        record.save_perf_dump(cfg.perf_dump)
    return result


def generate(prompt: str, model: str = "tiny-ursa", **options: Any) -> RunResult:
    """Text-to-image (URSA). ``options`` are :class:`RunConfig` fields (height, steps, seed, output ...)."""
    cfg = _config(model=model, prompt=prompt, **options)
    return _run(cfg, "generate", None)


def _numbered(path: str | None, p: int, k: int) -> str | None:
    """``out.png`` -> ``out_003_01.png`` for prompt 3, image 1 of a batch (None stays None)."""
    if not path:
        return path
    target = Path(path)
    return str(target.with_name(f"{target.stem}_{p:03d}_{k:02d}{target.suffix}"))


def batch(task: str, prompts: Sequence[str] | None, model: str, num_images_per_prompt: int = 1,
          images: Sequence[str] = (), prompt_file: str | Path | None = None, **options: Any) -> list[RunResult]:
    """Every prompt (``--prompt-file``) times ``num_images_per_prompt``, on one loaded pipeline.

    Image ``k`` of each prompt uses seed ``seed + k``, so any single image can be remade alone; output,
    record and perf-dump paths are numbered per prompt and image (``out_003_01.png``).  Every config and
    output path is checked before the model loads.  The runs are sequential calls, not one batched forward.
    ``prompt_file`` (one prompt a line) may replace ``prompts``.  Under torchrun, ``parallel="data"``
    gives rank ``r`` of ``N`` the prompts ``r, r + N, ...`` (same seeds and names as one process) and
    rank 0 writes one combined ``record`` of every rank's runs; ``parallel="cfg"`` runs every prompt
    with the two CFG branches on two ranks (docs/parallel.md).
    """
    mode = options.get("parallel") or "none"
    if mode != "none":
        from .runtime import parallel

        return parallel.guarded(mode, task, str(options.get("device", "auto")), lambda group: _batch(
            task, prompts, model, num_images_per_prompt, images, prompt_file, group, **options),
            before=lambda: _build_builtin(model))
    return _batch(task, prompts, model, num_images_per_prompt, images, prompt_file, None, **options)


def _batch(task: str, prompts: Sequence[str] | None, model: str, num_images_per_prompt: int,
           images: Sequence[str], prompt_file: str | Path | None, group: Any, **options: Any) -> list[RunResult]:
    if prompt_file is not None:
        from .validate.inputs import read_prompts

        prompts = read_prompts(Path(prompt_file), flag="--prompt-file")
    if task not in ("generate", "edit"):
        raise InputError(f"Unknown task '{task}'.")
    if not prompts:
        raise InputError("Give at least one prompt (--prompt or --prompt-file).")
    if not isinstance(num_images_per_prompt, int) or not 1 <= num_images_per_prompt <= 1000:
        raise InputError(f"--num-images-per-prompt must be a whole number from 1 to 1000, got {num_images_per_prompt!r}.")
    seed = int(options.pop("seed", 0))
    pictures = load_images(list(images)) if task == "edit" else None
    if task == "edit" and not pictures:
        raise InputError("difforge edit needs at least one --image.")
    cfgs = []
    for p, prompt in enumerate(prompts):
        for k in range(num_images_per_prompt):
            named = {key: _numbered(options.get(key), p, k) for key in ("output", "record", "perf_dump")}
            cfg = _config(model=model, prompt=prompt, seed=seed + k, images=list(images),
                          **{**options, **named})
            _preflight(cfg)
            cfgs.append(cfg)
    if group is not None and group.mode == "data" and options.get("record"):  # rank 0's combined record
        check_output_file(options["record"], "--record", overwrite=bool(options.get("overwrite")), kind="json")
    if group is not None:  # --parallel: this rank's share (data: prompt p on rank p % N), on its device
        from .runtime.parallel import combined_record, run_timings, shard

        _check_parallel_task(cfgs[0], task, batched=True)
        mine = [(i, _rank_config(cfg, group)) for i, cfg in enumerate(cfgs)
                if shard(i // num_images_per_prompt, group)]
    else:
        mine = list(enumerate(cfgs))
    record = RunRecord(kind=task)
    results: list[RunResult] = []
    first = mine[0][1] if mine else None  # None: more ranks than prompts, this rank only joins the gather
    if first is None:
        pipeline = None
    elif group is not None:
        pipeline = _load_rank(first, task, record, group)
    else:
        with spinner(f"loading {first.model}", first.quiet):
            pipeline = load_pipeline(first.model, first.device, first.dtype, cfg=first, record=record, task=task)
    runs = []
    for n, (i, cfg) in enumerate(mine):  # the load is timed once, in the first image's record
        rec = RunRecord(kind=task, backend=dict(record.backend), adaptations=list(record.adaptations),
                        phases={"load": record.phases["load"]} if n == 0 and "load" in record.phases else {})
        results.append(_run_and_write(pipeline, cfg, pictures, rec, group))
        if group is not None:
            runs.append({"index": i, "rank": group.rank, "prompt_index": i // num_images_per_prompt,
                         "image": i % num_images_per_prompt, "seed": cfg.seed, "outputs": list(rec.outputs),
                         **run_timings(rec)})
    if group is not None and group.mode == "data":
        combined = combined_record(group, task, runs, {
            "model": model, "prompts": len(prompts), "num_images_per_prompt": num_images_per_prompt, "seed": seed})
        if combined is not None and options.get("record"):
            if results:  # rank 0 always runs prompt 0: its backend and environment head the combined record
                combined.backend, combined.environment = dict(results[0].record.backend), results[0].record.environment
            group.will_write(options["record"])
            combined.save(options["record"])
    return results


def edit(
    image: str | Path | Image.Image | Sequence[str | Path | Image.Image],
    prompt: str,
    model: str = "tiny-qwen-edit",
    **options: Any,
) -> RunResult:
    """Image editing (Qwen-Image-Edit family). ``image`` may be one or several paths/PIL images."""
    items = [image] if isinstance(image, str | Path | Image.Image) else list(image)
    if not items:
        raise InputError("difforge edit needs at least one --image.")
    pil = [x.convert("RGB") if isinstance(x, Image.Image) else None for x in items]
    paths = [str(x) for x in items if not isinstance(x, Image.Image)]
    decoded = iter(load_images(paths))
    images = [p if p is not None else next(decoded) for p in pil]
    cfg = _config(model=model, prompt=prompt, images=paths, **options)
    return _run(cfg, "edit", images)


def validate(**options: Any) -> Any:
    """Run the acceptance ladder and write the port report (see :mod:`difforge.validate`)."""
    from .report import write_report
    from .validate import ValidateOptions, run_validation

    if options.get("capture"):  # the run settings not given are the capture's (difforge capture)
        from .validate.captured import judge_options

        options = judge_options(options)
    opts = ValidateOptions(**options)
    if opts.parallel != "none":  # under torchrun: the device under test split over 2 ranks (validate/split.py)
        from .runtime import parallel
        from .validate.runner import validate_rank
        from .validate.split import WAIT_S

        return parallel.guarded(opts.parallel, "validate", opts.device,
                                lambda group: validate_rank(opts, write_report, group), timeout_s=WAIT_S,
                                before=lambda: _build_builtin(opts.model))
    return run_validation(opts, write_report)


def golden(**options: Any) -> Any:
    """Compute a golden bundle (the reference and floor a later ``validate(golden=...)`` compares against).

    ``options`` are :class:`~difforge.validate.ValidateOptions` fields; ``out`` is the bundle folder.
    """
    import sys

    from rich.console import Console

    from .validate import ValidateOptions
    from .validate.golden import make_golden

    for_device = str(options.pop("for_device", None) or "cpu")
    opts = ValidateOptions(**{"device": _reference_device(options.get("reference")), **options})
    console = None if opts.quiet else Console(file=sys.stderr)
    return make_golden(opts, log=(lambda msg: console.print(msg, highlight=False)) if console else None,
                       for_device=for_device)


def capture(**options: Any) -> Any:
    """Run the device under test's half of a validation and keep it in a bundle (``out``), for a later
    ``validate(capture=out)`` on any machine.  ``options`` are :class:`~difforge.validate.ValidateOptions` fields."""
    import sys

    from rich.console import Console

    from .validate import ValidateOptions
    from .validate.budget import parse_bytes
    from .validate.capture import make_capture

    clean = bool(options.pop("clean", False))
    max_bytes = parse_bytes(options.pop("max_bytes", None))  # "1M", "1MiB" or bytes; None: validate's own caps
    opts = ValidateOptions(**options)
    console = None if opts.quiet else Console(file=sys.stderr)
    return make_capture(opts, log=(lambda msg: console.print(msg, highlight=False)) if console else None, clean=clean,
                        max_bytes=max_bytes)


def _reference_device(reference: str | None) -> str:
    """The device part of ``--reference`` (where golden reads the device-under-test's dtype plan)."""
    from .validate import parse_reference

    return parse_reference(reference)[0]


def compare(a: str | Path, b: str | Path, floor: str | Path | None = None, out: str | Path | None = None) -> Any:
    """Pair two folders (or files) of images by name and judge each pair (see :mod:`difforge.validate.compare`);
    with ``out``, also write report.md/report.json there."""
    from .report.compare import write_compare_report
    from .validate.compare import compare as _compare
    from .validate.options import check_out_dir

    if out is not None:
        check_out_dir(out)  # before any picture is read
    result = _compare(a, b, floor)
    if out is not None:
        result.report_paths = write_compare_report(result, out)
    return result


def _config(**fields: Any) -> RunConfig:
    known = {f.name for f in dataclasses.fields(RunConfig)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise InputError(f"Unknown option(s): {', '.join(unknown)}.")
    cfg = RunConfig(**fields)  # RunConfig.validate(): steps, seed, guidance, offload plan, prompts
    check_transformer_file(cfg.transformer_file)
    return cfg


__all__ = [
    "RunResult",
    "capture",
    "compare",
    "edit",
    "environment_fingerprint",
    "generate",
    "golden",
    "load_images",
    "load_pipeline",
    "run_pipeline",
    "save_images",
    "validate",
]
