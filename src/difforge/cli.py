"""``difforge`` command line: thin wrappers over :mod:`difforge.api`.

Each command parses, calls the API and prints.  A :class:`DifforgeError` becomes one line on
stderr and exit code 2; any other exception becomes one line too (``DIFFORGE_DEBUG=1`` shows the
traceback), so users never face a traceback wall.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from typer.core import TyperGroup

from .errors import DifforgeError
from .runtime.progress import spinner

try:  # typer 0.2x carries its own copy of click; older releases raise click's own exceptions
    from typer._click import exceptions as click_errors
except ImportError:  # pragma: no cover - typer < 0.2x
    from click import exceptions as click_errors  # type: ignore[no-redef]


class OneLineUsageErrors(TyperGroup):
    """The command group whose usage errors (a bad value, an unknown option, a missing one) are one line.

    Typer draws click's usage errors as a usage line, a hint and a boxed panel: five lines for one bad
    ``--steps``.  Every other difforge error is one ``difforge: error:`` line and exit 2, so a usage error
    is too: the group runs click in non-standalone mode and prints the message itself.  Help (``--help``,
    no arguments) and everything else keep click's own behaviour.
    """

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click_errors.UsageError as exc:
            if type(exc).__name__ == "NoArgsIsHelpError":  # no arguments: click printed the help already
                sys.exit(exc.exit_code)
            message = " ".join(exc.format_message().split())
            if exc.ctx is not None or not message.endswith("lists the options)"):
                command = exc.ctx.command_path if exc.ctx is not None else "difforge"
                message += f" ('{command} --help' lists the options)"
            typer.echo(f"difforge: error: {message}", err=True)
            sys.exit(2)
        except click_errors.ClickException as exc:
            exc.show()
            sys.exit(exc.exit_code)
        except typer.Abort:
            typer.echo("difforge: error: aborted.", err=True)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        """The subcommand, after refusing a single-valued option given twice: click keeps the last value, so
        ``--steps 2 --num-inference-steps 3`` ran 3 steps without a word."""
        name, command, rest = super().resolve_command(ctx, args)
        if command is not None:
            try:
                repeated_option(command, rest)
            except click_errors.UsageError as exc:
                raise click_errors.UsageError(f"{exc.message} ('{ctx.command_path} {name} --help' lists the "
                                              "options)", None) from None
        return name, command, rest


def repeated_option(command: Any, args: list[str]) -> None:
    """Raise a usage error naming the spellings when one single-valued option appears twice in ``args``.

    Every spelling of an option (``--steps``, ``--num-inference-steps`` ...; ``--x``/``--no-x``) counts as that
    option; repeatable options (``--fast``, ``--image`` ...) may repeat.  Values are skipped as click would
    read them, and ``--`` ends the options."""
    by_name: dict[str, Any] = {}
    for param in command.params:
        if getattr(param, "param_type_name", "") == "option":
            for opt in (*param.opts, *param.secondary_opts):
                by_name[opt] = param
    seen: dict[str, list[str]] = {}
    i = 0
    while i < len(args):
        token = args[i]
        i += 1
        if token == "--":
            break
        spelling = token.split("=", 1)[0] if token.startswith("--") else token
        param = by_name.get(spelling)
        if param is None:
            continue
        if not param.is_flag and not param.count and "=" not in token:
            i += 1  # its value
        if param.multiple or param.count:
            continue
        seen.setdefault(param.name or spelling, []).append(spelling)
    for spellings in seen.values():
        if len(spellings) > 1:
            names = list(dict.fromkeys(spellings))
            said = (f"{names[0]} is given {len(spellings)} times" if len(names) == 1 else
                    f"{' and '.join(names)} name one option, given {len(spellings)} times")
            raise click_errors.UsageError(f"{said}; give it once.", None)


app = typer.Typer(
    cls=OneLineUsageErrors,
    add_completion=False,
    no_args_is_help=True,
    help="difforge: run diffusion image models on any accelerator (Ascend NPU first) and prove the port works.",
)
F = TypeVar("F", bound=Callable[..., Any])


def _fail(message: str, code: int) -> None:
    typer.echo(f"difforge: error: {message}", err=True)
    raise typer.Exit(code)


def friendly_errors(fn: F) -> F:
    """Map exceptions to one stderr line and an exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort):
            raise
        except DifforgeError as exc:
            if getattr(exc, "silent", False):  # --parallel: another rank failed and reports it
                raise typer.Exit(exc.exit_code) from None
            _fail(str(exc), exc.exit_code)
        except KeyboardInterrupt as exc:  # Ctrl-C: 130; SIGTERM/SIGHUP (runtime.signals.Terminated): 143/129
            _fail("interrupted.", getattr(exc, "exit_code", 130))
        except Exception as exc:
            if os.environ.get("DIFFORGE_DEBUG"):
                raise
            msg = " ".join(str(exc).split())[:300]
            _fail(f"unexpected {exc.__class__.__name__}: {msg} (set DIFFORGE_DEBUG=1 for the traceback)", 1)

    return wrapper  # type: ignore[return-value]


def _version(value: bool) -> None:
    if value:
        from .version import __version__

        typer.echo(f"difforge {__version__}")
        raise typer.Exit(0)


@app.callback()
def _main(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print difforge's version and exit.")] = False,
) -> None:
    """difforge: run diffusion image models on any accelerator (Ascend NPU first) and prove the port works."""


# ---- shared options -----------------------------------------------------------------------------
#: The spellings users bring from diffusers / the seed scripts are accepted beside difforge's own.
MODEL_NAMES = ("--model", "-m", "--model-path", "--model_path")
STEP_NAMES = ("--steps", "--num-inference-steps", "--num_inference_steps", "--num-steps", "--num_steps")
NEGATIVE_NAMES = ("--negative-prompt", "--negative_prompt")
TRUE_CFG_NAMES = ("--true-cfg", "--true-cfg-scale", "--true_cfg_scale")
#: generate/edit's batch of prompts and validate's gallery prompts are one kind of file: both spellings, everywhere.
PROMPT_FILE_NAMES = ("--prompt-file", "--prompts")
#: ``--fast`` / ``--disable`` names per family, for --help (tests/test_cli.py checks they are the families').
URSA_EXACT = "lm-head-slice, reuse-first-forward, rope-cache, pinned-draws, philox-rng"
URSA_FAST = "unguided-tail, philox-rng"
QWEN_EXACT = "batched-cfg, real-rope, npu-attention, vae-2d"
QWEN_FAST = "first-block-cache[=threshold], taylorseer[=interval]"
Model = Annotated[str, typer.Option(*MODEL_NAMES, help="Model folder or built-in name (tiny-ursa, tiny-qwen-edit ...).")]
EditModel = Annotated[str, typer.Option(
    *MODEL_NAMES, help="Qwen-Image-Edit model folder or built-in name (tiny-qwen-edit).")]
Device = Annotated[str, typer.Option(help="auto, cpu, cuda[:i], npu[:i], mps, xpu.")]
Dtype = Annotated[str, typer.Option(help="auto, float32, bfloat16, float16.")]
Seed = Annotated[int, typer.Option(help="Seed of the CPU generator all noise comes from.")]
Offload = Annotated[str, typer.Option(help="Memory plan: none, before-decode, model, sequential.")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars.")]
Preset = Annotated[list[str] | None, typer.Option(
    "--preset", help="Apply an opt-in environment preset of the device, NAME or NAME=VALUE (repeatable), e.g. "
                     "ACL_PRECISION_MODE on the NPU; 'difforge doctor' lists them.")]
RecordOpt = Annotated[Path | None, typer.Option("--record", help="Write the RunRecord JSON here.")]
OverwriteOpt = Annotated[bool, typer.Option(
    "--overwrite", help="Replace a file at --output/--record/--perf-dump that difforge did not write (a previous "
                        "difforge output is replaced without it; a link, FIFO or device never is).")]
PerfDump = Annotated[Path | None, typer.Option(
    "--perf-dump", "--perf-dump-path",
    help="Write per-stage and per-step milliseconds here, in SGLang-Diffusion's perf-dump JSON shape.")]
PromptFile = Annotated[Path | None, typer.Option(
    *PROMPT_FILE_NAMES, help="A text file, one prompt a line: one run per prompt on one loaded model.")]
PerPrompt = Annotated[int, typer.Option(
    "--num-images-per-prompt", "--num_images_per_prompt",
    help="Images per prompt (image k uses seed + k; outputs are numbered out_PPP_KK.png).")]
AsJson = Annotated[bool, typer.Option("--json", help="Print a machine-readable summary on stdout (nothing else).")]
ParallelOpt = Annotated[str, typer.Option(
    "--parallel", help="Under torchrun: none, data (--prompt-file sharded over the ranks), cfg (the two CFG "
                       "branches on 2 ranks: URSA's CFG batch, Qwen-Edit's true CFG) or ulysses=N (the sequence over "
                       "N ranks: URSA's, Qwen-Edit's through diffusers' context parallelism); see docs/parallel.md.")]


GoldenDigest = Annotated[str | None, typer.Option(
    "--golden-digest", help="The digest 'difforge golden' printed: --golden must be that very bundle (exit 2 "
                            "otherwise); without it the report says the bundle's identity was not checked.")]
CaptureDigest = Annotated[str | None, typer.Option(
    "--capture-digest", help="The digest 'difforge capture' printed: --capture must be that very bundle (exit 2 "
                             "otherwise); without it the report says the capture's identity was not checked.")]


def _print_digest(folder: Any, flag: str) -> None:
    """The bundle's identity, to keep outside it and pass back as ``flag`` (issue 26 S3: SHA256SUMS alone is
    self-certified)."""
    from .validate.bundle import bundle_digest

    typer.echo(f"digest: {bundle_digest(folder)} (keep it apart from the bundle; check it with {flag})")


#: Most bytes of a ``--config`` file: a few dozen options fit in a few KB; more is not a config file.
MAX_CONFIG_BYTES = 1 << 20


def _config_file(ctx: typer.Context, value: Path | None) -> Path | None:
    """``--config FILE`` (YAML or JSON): its keys become the command's defaults; flags on the command line win.

    Keys are option names with or without the leading dashes, with '-' or '_' (``num_inference_steps``,
    ``--true-cfg-scale``, ``model_path`` ...); an unknown key, or a file that is not a mapping, is one
    line and exit 2.  The file is read by the one reading rule (a regular file, at most
    :data:`MAX_CONFIG_BYTES`: ``/dev/zero`` or a FIFO is refused, not read forever) and YAML aliases are
    refused (a 400-byte alias bomb expands to gigabytes).  This runs while click parses, outside
    :func:`friendly_errors`, so every failure here, running out of memory included, is turned into one line here.
    """
    if value is None:
        return None
    try:
        data = _read_config(Path(value))
    except DifforgeError as exc:
        _fail(str(exc), exc.exit_code)
    except (MemoryError, RecursionError) as exc:
        _fail(f"--config {value} is too large or too deeply nested to read ({type(exc).__name__}).", 2)
    if not isinstance(data, dict):
        _fail(f"--config {value} must hold a mapping of option names to values.", 2)
    names: dict[str, str] = {}
    for param in ctx.command.params:
        for opt in (*param.opts, param.name or ""):
            names[opt.lstrip("-").replace("-", "_")] = param.name or ""
    defaults: dict[str, Any] = {}
    for key, val in data.items():
        target = names.get(str(key).lstrip("-").replace("-", "_"))
        if not target or target == "config":
            _fail(f"--config {value}: '{key}' is not an option of 'difforge {ctx.info_name}'.", 2)
        defaults[target] = [str(v) for v in val] if isinstance(val, list) else val
    ctx.default_map = {**(ctx.default_map or {}), **defaults}
    return value


def _read_config(path: Path) -> Any:
    """The parsed ``--config`` file (JSON by its suffix, else YAML without aliases); InputError otherwise."""
    from .errors import InputError
    from .runtime.reading import read_text

    text = read_text(path, limit=MAX_CONFIG_BYTES, what=f"--config {path}", error=InputError)
    as_json = path.suffix.lower() == ".json"
    try:
        if as_json:
            return json.loads(text)
        import yaml

        return yaml.load(text, Loader=_yaml_loader())  # noqa: S506 - a SafeLoader that also refuses aliases
    except (MemoryError, RecursionError):
        raise
    except _AliasRefused as exc:
        raise InputError(f"--config {path} uses a YAML alias (*name) on line {exc.line}; write each value out (an "
                         "alias can expand a few hundred bytes into gigabytes).") from None
    except Exception as exc:
        raise InputError(f"--config {path} is not valid {'JSON' if as_json else 'YAML'} "
                         f"({' '.join(str(exc).split())[:160]}).") from None


class _AliasRefused(Exception):
    """A YAML alias in ``--config`` (at ``line``)."""

    def __init__(self, line: int) -> None:
        super().__init__(line)
        self.line = line


def _yaml_loader() -> Any:
    """YAML's safe loader that refuses aliases (``*name``): options are plain values, and aliases are how a few
    hundred bytes expand into gigabytes (the "billion laughs")."""
    import yaml

    class NoAliasLoader(yaml.SafeLoader):
        def fetch_alias(self) -> None:
            raise _AliasRefused(self.get_mark().line + 1)

    return NoAliasLoader


ConfigOpt = Annotated[Path | None, typer.Option(
    "--config", callback=_config_file, is_eager=True,
    help="YAML or JSON file of options (keys as the flags' names); flags given on the command line win.")]


def _run_task(api: Any, task: str, prompt: str | None, prompt_file: Path | None, per_prompt: int, images: list[str],
              as_json: bool, record_path: Path | None, perf_path: Path | None, quiet_flag: bool,
              **options: Any) -> None:
    """One run (``--prompt``), or a batch (``--prompt-file`` / ``--num-images-per-prompt``) on one loaded model."""
    if (prompt is None) == (prompt_file is None):
        _fail("give the prompt with --prompt or a file of prompts with --prompt-file (one of them).", 2)
    if prompt_file is None and per_prompt == 1:
        result = api.generate(prompt, **options) if task == "generate" else api.edit(images, prompt, **options)
        if options.get("parallel", "none") != "none" and not result.paths:  # --parallel cfg: rank 1 writes nothing
            record_path = perf_path = None
        _report(result, record_path, quiet_flag or as_json, as_json, perf_path)
        return
    from .validate.inputs import read_prompts

    if options.get("parallel", "none") != "none" and prompt_file is not None:  # read on every rank, in the guard
        prompts = None
    else:
        prompts = [prompt] if prompt is not None else read_prompts(prompt_file, flag="--prompt-file")
    results = api.batch(task, prompts, num_images_per_prompt=per_prompt, images=images,
                        **({"prompt_file": prompt_file} if prompts is None else {}), **options)
    if as_json:
        typer.echo(json.dumps([_summary(r, r.record.config.get("record"), r.record.config.get("perf_dump"))
                               for r in results]))
        return
    for r in results:
        _report(r, None, True)
    if not quiet_flag:
        given = f"{len(prompts)} prompt(s)" if prompts is not None else f"this rank's share of {prompt_file}"
        typer.echo(f"{len(results)} runs ({given} x {per_prompt})", err=True)


def _summary(result: Any, record_path: Any, perf_path: Any) -> dict[str, Any]:
    rec = result.record
    return {
        "prompt": rec.config.get("prompt"), "seed": rec.config.get("seed"),
        "outputs": [str(p) for p in result.paths], "record": str(record_path) if record_path else None,
        "perf_dump": str(perf_path) if perf_path else None, "device": rec.backend.get("device"),
        "dtype": rec.backend.get("dtype"), "phases_s": {k: round(v.wall_s, 4) for k, v in rec.phases.items()},
        "steps": len(rec.step_times_s), "step_s": [round(t, 5) for t in rec.step_times_s],
        "adaptations": [{"what": a.what, "choice": a.choice, "exact": a.exact} for a in rec.adaptations],
    }


def _report(result: Any, record_path: Path | None, quiet: bool, as_json: bool = False,
            perf_path: Path | None = None) -> None:
    if as_json:
        typer.echo(json.dumps(_summary(result, record_path, perf_path)))
        return
    rec = result.record
    if perf_path:
        typer.echo(f"perf dump: {perf_path}")
    for p in result.paths:
        typer.echo(f"output: {p}")
    if record_path:
        typer.echo(f"record: {record_path}")
    if not quiet:
        phases = ", ".join(f"{k} {v.wall_s:.2f}s" for k, v in rec.phases.items())
        typer.echo(f"{rec.backend.get('device')} {rec.backend.get('dtype')}: {phases}", err=True)


@app.command()
@friendly_errors
def generate(
    prompt: Annotated[str | None, typer.Option("--prompt", "-p", help="Text prompt.")] = None,
    model: Annotated[str | None, typer.Option(*MODEL_NAMES, help="URSA model folder or built-in name (default "
                                              "tiny-ursa: random weights, its picture is noise).")] = None,
    negative_prompt: Annotated[str | None, typer.Option(*NEGATIVE_NAMES,
                                                        help="Negative prompt.")] = None,
    height: Annotated[int | None, typer.Option(help="Image height (multiple of the VAE stride).")] = None,
    width: Annotated[int | None, typer.Option(help="Image width (multiple of the VAE stride).")] = None,
    steps: Annotated[int, typer.Option(*STEP_NAMES, help="Denoising steps (>= 2).")] = 25,
    guidance: Annotated[float, typer.Option("--guidance", "--guidance-scale", "--guidance_scale",
                                            help="Classifier-free guidance scale.")] = 7.0,
    guidance_trunc: Annotated[float, typer.Option(help="Guidance off once t >= this.")] = 0.9,
    num_frames: Annotated[int, typer.Option("--num-frames", "--num_frames",
                                            help="Frames (video checkpoints only; image checkpoints take 1).")] = 1,
    seed: Seed = 0,
    device: Device = "auto",
    dtype: Dtype = "auto",
    offload: Offload = "none",
    use_compile: Annotated[bool, typer.Option("--compile", help="torch.compile the repeated blocks (torchair on NPU).")] = False,
    fast: Annotated[list[str] | None, typer.Option(
        help=f"Opt-in approximate optimisation (repeatable): {URSA_FAST}. philox-rng is the random stream "
             "switch, exact in distribution: the portable Philox stream (default on accelerators); "
             "--disable philox-rng: the reference's CPU stream (default on the CPU).")] = None,
    disable: Annotated[list[str] | None, typer.Option(
        help=f"Switch off an exact optimisation (repeatable): {URSA_EXACT}.")] = None,
    output: Annotated[Path, typer.Option("--output", "-o", help="out.png, or out.gif/.webp/.mp4 for video.")] = Path(
        "out.png"
    ),
    preset: Preset = None,
    record: RecordOpt = None,
    overwrite: OverwriteOpt = False,
    perf_dump: PerfDump = None,
    prompt_file: PromptFile = None,
    num_images_per_prompt: PerPrompt = 1,
    as_json: AsJson = False,
    parallel: ParallelOpt = "none",
    config: ConfigOpt = None,
    quiet: Quiet = False,
) -> None:
    """Text-to-image with URSA (native, any device)."""
    defaulted = model is None
    model = model or "tiny-ursa"
    with spinner("importing torch", quiet):
        from . import api

    _run_task(
        api, "generate", prompt, prompt_file, num_images_per_prompt, [], as_json, record, perf_dump, quiet,
        model=model,
        negative_prompt=negative_prompt,
        height=height,
        width=width,
        steps=steps,
        guidance=guidance,
        guidance_trunc=guidance_trunc,
        num_frames=num_frames,
        seed=seed,
        device=device,
        dtype=dtype,
        offload=offload,
        compile=use_compile,
        fast=fast or [],
        disable=disable or [],
        presets=preset or [],
        output=str(output),
        record=str(record) if record else None,
        overwrite=overwrite,
        perf_dump=str(perf_dump) if perf_dump else None,
        quiet=quiet or as_json,
        parallel=parallel,
    )
    if defaulted:  # after the picture is saved: a refused run stays one line, a made one must not pass noise off
        typer.echo("difforge: warning: no --model given: tiny-ursa has random weights and its picture is noise; "
                   "--model shapes-ursa draws shapes captions, or give a model folder.", err=True)


@app.command()
@friendly_errors
def edit(
    image: Annotated[list[Path], typer.Option("--image", "-i", help="Reference image (repeat for Plus models).")],
    prompt: Annotated[str | None, typer.Option("--prompt", "-p", help="Edit instruction.")] = None,
    model: EditModel = "tiny-qwen-edit",
    negative_prompt: Annotated[str | None, typer.Option(*NEGATIVE_NAMES,
                                                        help="Negative prompt (true CFG needs one).")] = " ",
    steps: Annotated[int, typer.Option(*STEP_NAMES, help="Denoising steps (>= 2).")] = 50,
    true_cfg: Annotated[float, typer.Option(*TRUE_CFG_NAMES,
                                            help="True classifier-free guidance scale.")] = 4.0,
    seed: Seed = 0,
    height: Annotated[int | None, typer.Option(help="Output height (multiple of 16).")] = None,
    width: Annotated[int | None, typer.Option(help="Output width (multiple of 16).")] = None,
    device: Device = "auto",
    dtype: Dtype = "auto",
    offload: Offload = "none",
    vae_tiling: Annotated[bool, typer.Option(help="Tile the VAE for large images.")] = False,
    transformer: Annotated[
        Path | None, typer.Option(help="Transformer-only safetensors (e.g. an FP8 re-pack) replacing the folder's.")
    ] = None,
    use_compile: Annotated[bool, typer.Option("--compile", help="torch.compile the repeated blocks (torchair on NPU).")] = False,
    fast: Annotated[list[str] | None, typer.Option(
        help=f"Opt-in approximate optimisation (repeatable): {QWEN_FAST}.")] = None,
    disable: Annotated[list[str] | None, typer.Option(
        help=f"Switch off an exact optimisation (repeatable): {QWEN_EXACT}.")] = None,
    output: Annotated[Path, typer.Option("--output", "-o", help="Where to write the edited image.")] = Path("out.png"),
    preset: Preset = None,
    record: RecordOpt = None,
    overwrite: OverwriteOpt = False,
    perf_dump: PerfDump = None,
    prompt_file: PromptFile = None,
    num_images_per_prompt: PerPrompt = 1,
    as_json: AsJson = False,
    parallel: ParallelOpt = "none",
    config: ConfigOpt = None,
    quiet: Quiet = False,
) -> None:
    """Edit images with Qwen-Image-Edit / 2509 / 2511 (and FP8 re-packs)."""
    with spinner("importing torch", quiet):
        from . import api

    _run_task(
        api, "edit", prompt, prompt_file, num_images_per_prompt, [str(p) for p in image], as_json, record, perf_dump,
        quiet,
        model=model,
        negative_prompt=negative_prompt,
        steps=steps,
        true_cfg=true_cfg,
        seed=seed,
        height=height,
        width=width,
        device=device,
        dtype=dtype,
        offload=offload,
        vae_tiling=vae_tiling,
        transformer_file=str(transformer) if transformer else None,
        compile=use_compile,
        fast=fast or [],
        disable=disable or [],
        presets=preset or [],
        output=str(output),
        record=str(record) if record else None,
        overwrite=overwrite,
        perf_dump=str(perf_dump) if perf_dump else None,
        quiet=quiet or as_json,
        parallel=parallel,
    )


@app.command()
@friendly_errors
def validate(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option("--out", help="Report folder.")],
    model: Model = "tiny-ursa",
    device: Device = "auto",
    dtype: Dtype = "auto",
    reference: Annotated[str, typer.Option(help="Reference as device:dtype.")] = "cpu:float32",
    image: Annotated[list[Path] | None, typer.Option("--image", "-i", help="Reference image(s) for edit models.")] = None,
    prompts: Annotated[Path | None, typer.Option(*PROMPT_FILE_NAMES, help="File with one prompt per line for the gallery.")] = None,
    prompt_set: Annotated[Path | None, typer.Option(
        "--prompt-set", help="A prompt set with expected attributes (difforge-prompt-set/1 JSON, docs/shapes.md) for "
                             "the semantic rung; the shapes models bring their own.")] = None,
    scan_source: Annotated[str | None, typer.Option(
        "--scan-source", help="The model's Python source (folder, file or module name): the report lists what "
                              "'difforge scan' finds there for the device.")] = None,
    steps: Annotated[int | None, typer.Option(*STEP_NAMES, help="Denoising steps.")] = None,
    height: Annotated[int | None, typer.Option()] = None,
    width: Annotated[int | None, typer.Option()] = None,
    rounds: Annotated[int, typer.Option(help="Timed benchmark rounds.")] = 3,
    warmup: Annotated[int, typer.Option(help="Untimed warm-up rounds.")] = 1,
    seed: Seed = 0,
    quick: Annotated[bool, typer.Option(help="Fewer steps/rounds: a fast sanity pass.")] = False,
    speed_table: Annotated[bool, typer.Option(
        help="Also time the performance table's baseline (every exact optimisation off) and each approximate "
             "optimisation (warm-up + rounds more runs each); --no-speed-table times only the options validated."
    )] = True,
    lang: Annotated[str, typer.Option(help="Report prose language: en or zh.")] = "en",
    floor: Annotated[str | None, typer.Option(
        help="A second real device as the noise floor, device[:dtype] (default: an emulated floor on the "
             "reference's float32 kernels).")] = None,
    allow_self_compare: Annotated[bool, typer.Option(
        "--allow-self-compare", help="Allow device == reference (same dtype); the report says it is not a port test.")
    ] = False,
    fail_on: Annotated[str, typer.Option(help="Exit 1 on 'fail' (default) or also on 'warn'.")] = "fail",
    accept_warn: Annotated[list[str] | None, typer.Option(
        "--accept-warn", help="RUNG=REASON (repeatable): accept a WARN of that rung's floor ratio (between 2x and "
                              "3x the floor) for REASON, printed in the report; otherwise it fails the sign-off.")
    ] = None,
    transformer: Annotated[
        Path | None, typer.Option(help="Transformer-only safetensors (e.g. an FP8 re-pack) replacing the folder's.")
    ] = None,
    use_compile: Annotated[bool, typer.Option("--compile", help="torch.compile the repeated blocks (torchair on NPU).")] = False,
    fast: Annotated[list[str] | None, typer.Option(help="Opt-in approximate optimisation (repeatable).")] = None,
    disable: Annotated[list[str] | None, typer.Option(help="Switch off an exact optimisation (repeatable).")] = None,
    offload: Offload = "none",
    vae_tiling: Annotated[bool, typer.Option(help="Tile the VAE for large images.")] = False,
    num_frames: Annotated[int | None, typer.Option(help="Frames (video models).")] = None,
    guidance: Annotated[float | None, typer.Option(help="Classifier-free guidance scale.")] = None,
    guidance_trunc: Annotated[float | None, typer.Option(help="Guidance off once t >= this.")] = None,
    true_cfg: Annotated[float | None, typer.Option(*TRUE_CFG_NAMES, help="True classifier-free guidance scale.")] = None,
    negative_prompt: Annotated[str | None, typer.Option(*NEGATIVE_NAMES, help="Negative prompt.")] = None,
    golden: Annotated[Path | None, typer.Option(
        help="A golden bundle (difforge golden --out): read the reference and floor from it instead of computing "
             "them here.")] = None,
    golden_digest: GoldenDigest = None,
    capture_digest: CaptureDigest = None,
    msprobe: Annotated[bool, typer.Option(
        "--msprobe", help="Also write msprobe dumps of the device's and the floor's step 0 and msprobe compare's "
                          "table (pip install 'difforge\\[msprobe]').")] = False,
    capture: Annotated[Path | None, typer.Option(
        help="A capture bundle (difforge capture --out): judge the device's half made there; the model, inputs and "
             "settings not given are the bundle's.")] = None,
    parallel: Annotated[str, typer.Option(
        "--parallel", help="Under torchrun: cfg splits the device under test's CFG branches over 2 ranks (the "
                           "reference runs on rank 0, which writes the report); see docs/parallel.md.")] = "none",
    quiet: Quiet = False,
) -> None:
    """Run the acceptance ladder against a reference and write the port report.

    --transformer, guidance, --negative-prompt and --num-frames apply to every side (the reference loads
    the same weights); --compile, --fast, --disable, --offload and --vae-tiling to the device under test only.
    """
    from . import api

    options = dict(
        model=model,
        device=device,
        dtype=dtype,
        reference=reference,
        images=[str(p) for p in image or []],
        prompts=str(prompts) if prompts else None,
        prompt_set=str(prompt_set) if prompt_set else None,
        scan_source=scan_source,
        steps=steps,
        height=height,
        width=width,
        rounds=rounds,
        warmup=warmup,
        seed=seed,
        quick=quick,
        speed_table=speed_table,
        lang=lang,
        out=str(out),
        floor=floor,
        allow_self_compare=allow_self_compare,
        fail_on=fail_on,
        accept_warn=accept_warn or [],
        transformer=str(transformer) if transformer else None,
        compile=use_compile,
        fast=fast or [],
        disable=disable or [],
        offload=offload,
        vae_tiling=vae_tiling,
        num_frames=num_frames,
        guidance=guidance,
        guidance_trunc=guidance_trunc,
        true_cfg=true_cfg,
        negative_prompt=negative_prompt,
        golden=str(golden) if golden else None,
        golden_digest=golden_digest,
        capture_digest=capture_digest,
        msprobe=msprobe,
        parallel=parallel,
        quiet=quiet,
    )
    if capture is not None:  # only what was given: the rest is the capture's
        options = {k: v for k, v in options.items() if k in ("out", "lang", "quiet") or _given(ctx, k)}
        options["capture"] = str(capture)
    result = api.validate(**options)
    for name, path in result.report_paths.items():
        typer.echo(f"{name}: {path}")
    typer.echo(f"verdict: {result.verdict}")
    raise typer.Exit(result.exit_code)


#: validate's option names whose CLI parameter is spelled otherwise.
_PARAMS = {"images": "image", "compile": "use_compile"}


def _given(ctx: typer.Context, option: str) -> bool:
    """The user typed ``option`` (not its default): a judge passes only those over a capture's settings."""
    source = ctx.get_parameter_source(_PARAMS.get(option, option))  # typer's click: compared by name
    return getattr(source, "name", None) in ("COMMANDLINE", "ENVIRONMENT", "PROMPT")


@app.command(name="capture")
@friendly_errors
def capture_command(
    out: Annotated[Path, typer.Option("--out", help="Bundle folder (new, empty, or a previous capture).")],
    model: Model = "tiny-ursa",
    device: Device = "auto",
    dtype: Dtype = "auto",
    image: Annotated[list[Path] | None, typer.Option("--image", "-i", help="Input image(s) for edit models.")] = None,
    prompts: Annotated[Path | None, typer.Option(*PROMPT_FILE_NAMES, help="File with one prompt per line for the gallery.")] = None,
    prompt_set: Annotated[Path | None, typer.Option(
        "--prompt-set", help="A prompt set with expected attributes for the semantic rung (the shapes models bring "
                             "their own).")] = None,
    steps: Annotated[int | None, typer.Option(*STEP_NAMES, help="Denoising steps.")] = None,
    height: Annotated[int | None, typer.Option()] = None,
    width: Annotated[int | None, typer.Option()] = None,
    rounds: Annotated[int, typer.Option(help="Timed benchmark rounds.")] = 3,
    warmup: Annotated[int, typer.Option(help="Untimed warm-up rounds.")] = 1,
    seed: Seed = 0,
    quick: Annotated[bool, typer.Option(help="The settings of validate --quick.")] = False,
    speed_table: Annotated[bool, typer.Option(
        help="Also run the performance table's other rows (--no-speed-table: only the options captured).")] = True,
    transformer: Annotated[
        Path | None, typer.Option(help="Transformer-only safetensors (e.g. an FP8 re-pack) replacing the folder's.")
    ] = None,
    use_compile: Annotated[bool, typer.Option("--compile", help="torch.compile the repeated blocks (torchair on NPU).")] = False,
    fast: Annotated[list[str] | None, typer.Option(help="Opt-in approximate optimisation (repeatable).")] = None,
    disable: Annotated[list[str] | None, typer.Option(help="Switch off an exact optimisation (repeatable).")] = None,
    offload: Offload = "none",
    vae_tiling: Annotated[bool, typer.Option(help="Tile the VAE for large images.")] = False,
    num_frames: Annotated[int | None, typer.Option(help="Frames (video models).")] = None,
    guidance: Annotated[float | None, typer.Option(help="Classifier-free guidance scale.")] = None,
    guidance_trunc: Annotated[float | None, typer.Option(help="Guidance off once t >= this.")] = None,
    true_cfg: Annotated[float | None, typer.Option(*TRUE_CFG_NAMES, help="True classifier-free guidance scale.")] = None,
    negative_prompt: Annotated[str | None, typer.Option(*NEGATIVE_NAMES, help="Negative prompt.")] = None,
    golden: Annotated[Path | None, typer.Option(
        help="A golden bundle (difforge golden --out): teacher-force the device on its reference states; then judge "
             "with validate --capture OUT --golden G.")] = None,
    golden_digest: GoldenDigest = None,
    clean: Annotated[bool, typer.Option(
        "--clean", help="State that this is an unmodified port (a device kit's run): tests/fixtures/captures/ then "
                        "requires its judgement to PASS.")] = False,
    max_bytes: Annotated[str | None, typer.Option(
        "--max-bytes", help="Fit the whole bundle in this size (e.g. 1M = 10^6 bytes, 1MiB): fewer operator calls, "
                            "smaller sub-calls and samples, in a fixed order the manifest records; exit 2 naming the "
                            "size needed if even the tightest caps do not fit.  Default: validate's own caps.")] = None,
    quiet: Quiet = False,
) -> None:
    """Run the device under test's half of a validation here and keep it (for validate --capture elsewhere).

    Everything the judge needs from the device goes into a hashed bundle: every run validate makes on it, its
    teacher-forced outputs at its own states, component outputs, the traced operator calls, timings and the
    environment.  Then, on any machine with the same model folder: difforge validate --capture OUT --out REPORT.
    """
    from . import api

    result = api.capture(
        model=model, device=device, dtype=dtype, images=[str(p) for p in image or []],
        prompts=str(prompts) if prompts else None, prompt_set=str(prompt_set) if prompt_set else None, steps=steps,
        height=height, width=width, rounds=rounds, warmup=warmup, seed=seed, quick=quick, speed_table=speed_table,
        transformer=str(transformer) if transformer else None, compile=use_compile, fast=fast or [],
        disable=disable or [], offload=offload, vae_tiling=vae_tiling, num_frames=num_frames, guidance=guidance,
        guidance_trunc=guidance_trunc, true_cfg=true_cfg, negative_prompt=negative_prompt, out=str(out), quiet=quiet,
        golden=str(golden) if golden else None, golden_digest=golden_digest, clean=clean, max_bytes=max_bytes,
    )
    size = sum(p.stat().st_size for p in Path(result.out).rglob("*") if p.is_file()) / (1 << 20)
    typer.echo(f"capture: {result.out} ({size:.1f} MiB, {result.seconds:.0f} s)")
    _print_digest(result.out, "validate --capture-digest")


@app.command()
@friendly_errors
def golden(
    out: Annotated[Path, typer.Option("--out", help="Bundle folder (new, empty, or a previous bundle).")],
    model: Model = "tiny-ursa",
    dtype: Annotated[str, typer.Option(help="The dtype the device under test will run: bfloat16, float16 ...")] = (
        "bfloat16"),
    for_device: Annotated[str, typer.Option(
        help="The kind of device the bundle is for (cpu, npu, cuda, xpu, mps): the reference draws from its "
             "default random stream.")] = "cpu",
    reference: Annotated[str, typer.Option(help="Reference as device:dtype.")] = "cpu:float32",
    floor: Annotated[str | None, typer.Option(
        help="A second real device as the noise floor, device[:dtype] (default: emulated on the reference).")] = None,
    image: Annotated[list[Path] | None, typer.Option("--image", "-i", help="Input image(s) for edit models.")] = None,
    prompts: Annotated[Path | None, typer.Option(*PROMPT_FILE_NAMES, help="File with one prompt per line for the gallery.")] = None,
    steps: Annotated[int | None, typer.Option(*STEP_NAMES, help="Denoising steps.")] = None,
    height: Annotated[int | None, typer.Option()] = None,
    width: Annotated[int | None, typer.Option()] = None,
    seed: Seed = 0,
    quick: Annotated[bool, typer.Option(help="The settings of validate --quick.")] = False,
    transformer: Annotated[
        Path | None, typer.Option(help="Transformer-only safetensors (e.g. an FP8 re-pack) replacing the folder's.")
    ] = None,
    num_frames: Annotated[int | None, typer.Option(help="Frames (video models).")] = None,
    guidance: Annotated[float | None, typer.Option(help="Classifier-free guidance scale.")] = None,
    guidance_trunc: Annotated[float | None, typer.Option(help="Guidance off once t >= this.")] = None,
    true_cfg: Annotated[float | None, typer.Option(*TRUE_CFG_NAMES, help="True classifier-free guidance scale.")] = None,
    negative_prompt: Annotated[str | None, typer.Option(*NEGATIVE_NAMES, help="Negative prompt.")] = None,
    msprobe: Annotated[bool, typer.Option(
        "--msprobe", help="Also store the floor's msprobe dump of step 0 (for validate --golden --msprobe; pip "
                          "install 'difforge\\[msprobe]').")] = False,
    quiet: Quiet = False,
) -> None:
    """Compute the reference and floor once (any machine) into a bundle that validate --golden compares against.

    Give the same settings to 'difforge validate --golden OUT' (steps, size, seed, --quick, guidance ...);
    validate refuses a bundle made from other weights, inputs or settings.
    """
    from . import api

    result = api.golden(
        model=model, dtype=dtype, for_device=for_device, reference=reference, floor=floor, images=[str(p) for p in image or []],
        prompts=str(prompts) if prompts else None, steps=steps, height=height, width=width, seed=seed, quick=quick,
        transformer=str(transformer) if transformer else None, num_frames=num_frames, guidance=guidance,
        guidance_trunc=guidance_trunc, true_cfg=true_cfg, negative_prompt=negative_prompt, out=str(out), quiet=quiet,
        msprobe=msprobe,
    )
    size = result.manifest.get("bytes", 0) / (1 << 20)
    typer.echo(f"golden: {result.out} ({size:.1f} MiB, {result.seconds:.0f} s)")
    _print_digest(result.out, "validate --golden-digest")


@app.command()
@friendly_errors
def compare(
    a: Annotated[Path, typer.Argument(help="The device's images: a folder (or one image file).")],
    b: Annotated[Path, typer.Argument(help="The reference's images, named like A's.")],
    floor: Annotated[Path | None, typer.Option(
        help="Images of a trusted run at the device's precision, named like B's: pairs are judged against it.")] = None,
    out: Annotated[Path | None, typer.Option(
        "--out", help="Write report.html (with the pictures), report.md and report.json here.")] = None,
    as_json: AsJson = False,
) -> None:
    """Compare images made elsewhere (another engine, another device) with a reference, pair by pair.

    Without --floor no pair can PASS or FAIL on precision (the output says why). Exit 0 PASS/WARN, 1 FAIL
    (a pair beyond its bound), 2 bad usage (a floor that is A itself included).
    """
    from . import api

    result = api.compare(a, b, floor=floor, out=out)
    if as_json:
        typer.echo(json.dumps(result.to_dict(), default=str))
    else:
        for p in result.pairs:
            typer.echo(f"{p.verdict}  {p.name}: {p.why}")
        for path in getattr(result, "report_paths", {}).values():
            typer.echo(f"report: {path}")
        if result.no_floor:
            typer.echo(f"note: {result.no_floor}.")
        typer.echo(f"verdict: {result.verdict}" + (" (no floor: precision not judged)" if result.no_floor else ""))
    raise typer.Exit(result.exit_code)


@app.command("scan")
@friendly_errors
def scan_command(
    target: Annotated[str, typer.Argument(
        help="A .py file, a folder, or an installed module name (diffusers.pipelines.qwenimage); read, never imported.")],
    device: Annotated[str, typer.Option("--target", help="The device to port to: npu, mps, xpu, cpu.")] = "npu",
    fail_on: Annotated[str | None, typer.Option(
        "--fail-on", help="Exit 1 when a finding is this severe or worse: error, warning (or info).")] = None,
    as_json: AsJson = False,
) -> None:
    """List what in a model's Python source breaks or is slow on the target device (static: nothing is run).

    Exit 0 with or without findings, 1 with --fail-on and a finding that severe, 2 bad usage. Silence one
    line with '# difforge: ignore[DF105]' (docs/scan.md lists the rules).
    """
    from .scan import check_fail_on, check_target, fail_on_exit_code, print_table, scan, to_json

    check_target(device)
    check_fail_on(fail_on)  # a bad level is exit 2 before any work
    result = scan(target, device)
    if as_json:
        typer.echo(to_json(result))
    else:
        print_table(result)
    raise typer.Exit(fail_on_exit_code(result, fail_on))


@app.command()
@friendly_errors
def doctor(as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False) -> None:
    """What is installed and usable here: devices, versions, presets, attention/compile backends."""
    from .doctor import collect_doctor, render_doctor

    info = collect_doctor()
    typer.echo(json.dumps(info, indent=2, default=str) if as_json else render_doctor(info))


def main() -> None:
    """Entry point; SIGTERM/SIGHUP raise like Ctrl-C, so every command's clean-up runs before exit."""
    from .runtime.signals import signals_raise

    with signals_raise():
        app(prog_name="difforge")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
