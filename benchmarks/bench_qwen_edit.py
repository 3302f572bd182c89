"""Qwen-Image-Edit denoising speed: difforge's loop against diffusers' behaviour, in one process.

The transformer is built at the requested size with random weights: on the meta device first,
then materialised straight on the target device (``to_empty`` + in-place normal init there), so a
60-block 20 B-parameter model takes seconds, not a CPU init.  Every variant runs the same inputs
through :func:`difforge.models.qwen_edit.loop.denoise` - the transformer call(s), the true-CFG
combine and the scheduler's Euler step - with the first ``--warmup`` steps untimed:

* ``diffusers reference``: diffusers' own processor (complex RoPE), two batch-1 calls per step,
  eager - what ``QwenImageEditPlusPipeline.__call__`` does per step;
* ``diffusers pipeline``: ``QwenImageEditPlusPipeline.__call__`` itself on the same transformer and
  texts (prompt embeddings given, one reference picture encoded by a random VAE before the loop, no
  decode), each step timed between step-end callbacks (``--no-pipeline`` leaves it out);
* ``difforge, two calls``: real RoPE only (isolates batched CFG);
* ``difforge default``: real RoPE + one batch-2 CFG call;
* ``difforge default + compile`` (``--compile``): plus regional ``torch.compile``.

One more instrumented pass of ``difforge default`` (synchronised around each call) gives the share
of a step spent on the true-CFG combine (``loop.combine_cfg``, the ``cfg`` stage of the public hook
:mod:`difforge.runtime.stages`) and on the scheduler's Euler step; random draws take none (the noise is
drawn once, before the loop).

``--fp8`` adds, after the bf16 rows, the default (compiled too with ``--compile``) with every block
Linear stored as float8_e4m3fn (``Fp8Linear``, dequantised per forward): bf16 and fp8 side by side from
one process; the reference stays bf16.  Fp8 storage halves the weights' memory, it does not compute
in fp8.  FLOPs are model FLOPs (two
unpadded batch-1 forwards) counted by FlopCounterMode on a meta-device copy; MFU uses
the sourced peak table of ``difforge.validate.bench``.  Nothing here asserts a speed.

    python benchmarks/bench_qwen_edit.py --tiny
    python benchmarks/bench_qwen_edit.py --medium --json medium.json
    python benchmarks/bench_qwen_edit.py --size full --variant plus --device cuda --dtype bf16 --compile --fp8
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import math
import resource
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

if __package__ in (None, ""):  # run as a script: make `benchmarks` and `difforge` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from benchmarks.common import BenchResult, make_result, print_table, write_json  # noqa: E402

#: The real transformer (spec §1.3): 60 blocks, 24 heads x 128, text dim 3584, 16 latent channels.
FULL_CONFIG: dict[str, Any] = {
    "patch_size": 2, "in_channels": 64, "out_channels": 16, "num_layers": 60, "attention_head_dim": 128,
    "num_attention_heads": 24, "joint_attention_dim": 3584, "axes_dims_rope": (16, 56, 56),
}
MEDIUM_CONFIG = {**FULL_CONFIG, "num_layers": 8, "num_attention_heads": 6}  # hidden 768
TINY_CONFIG = {
    "patch_size": 2, "in_channels": 16, "out_channels": 4, "num_layers": 2, "attention_head_dim": 16,
    "num_attention_heads": 3, "joint_attention_dim": 16, "axes_dims_rope": (8, 4, 4),
}


@dataclass(frozen=True)
class Size:
    name: str
    config: dict[str, Any]
    pixels: int  # output side; one reference of the same size
    vae_scale: int  # 8 for the real VAE
    text: dict[str, tuple[int, int]]  # variant -> (prompt tokens, negative-prompt tokens)


#: Text lengths: the issue's anchors (Edit 1400, Plus 200); the negative prompt " " carries the same
#: image tokens, so it is shorter by the prompt's own tokens (assumed 20 here).
SIZES = {
    "full": Size("full", FULL_CONFIG, 1024, 8, {"edit": (1400, 1380), "plus": (200, 180)}),
    "medium": Size("medium", MEDIUM_CONFIG, 256, 8, {"edit": (350, 345), "plus": (50, 45)}),
    "tiny": Size("tiny", TINY_CONFIG, 64, 8, {"edit": (24, 20), "plus": (12, 10)}),
}
REFERENCE = "diffusers reference (2 calls)"
PIPELINE = "diffusers pipeline (its own call)"
#: The VAE the diffusers pipeline row encodes its reference picture with (random weights): the real layout
#: (diffusers' defaults) at medium and full size, the tiny model's at tiny size (z_dim = in_channels / 4).
VAE_CONFIGS: dict[str, dict[str, Any]] = {
    "tiny": {"base_dim": 16, "z_dim": 4, "dim_mult": [1, 2, 4, 4], "num_res_blocks": 1,
             "temperal_downsample": [False, True, True], "latents_mean": [0.0] * 4, "latents_std": [1.0] * 4},
    "medium": {}, "full": {},
}
DEFAULT = "difforge default"


def _meta_transformer(config: dict[str, Any], zero_cond_t: bool) -> nn.Module:
    from accelerate import init_empty_weights
    from diffusers import QwenImageTransformer2DModel

    with init_empty_weights():  # parameters on meta; RoPE tables (plain tensors) still real, on the host
        return QwenImageTransformer2DModel(**config, zero_cond_t=zero_cond_t).eval().requires_grad_(False)


@torch.no_grad()
def build_transformer(config: dict[str, Any], device: torch.device, dtype: torch.dtype, seed: int = 0,
                      zero_cond_t: bool = False) -> nn.Module:
    """A random-weight transformer materialised directly on ``device`` (no host copy of the weights).

    Matrices get N(0, 0.5/sqrt(fan_in)) so activations stay finite through 60 blocks; norm scales
    are 1 and biases 0.  The init runs on the device with a device generator.
    """
    from diffusers.utils import logging as dlog

    level = dlog.get_verbosity()
    dlog.set_verbosity_error()  # `.to(dtype)` warns about keep-in-fp32 modules; this model has none
    try:
        model = _meta_transformer(config, zero_cond_t).to(dtype)
    finally:
        dlog.set_verbosity(level)
    model.to_empty(device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, p in model.named_parameters():
        if p.ndim >= 2:
            p.normal_(0.0, 0.5 / math.sqrt(p.shape[1]), generator=gen)
        elif "norm" in name:
            p.fill_(1.0)
        else:
            p.zero_()
    return model


def to_fp8_storage(model: nn.Module) -> int:
    """Replace every Linear's weight by float8_e4m3fn codes (``Fp8Linear``), on its device; returns the count."""
    from difforge.models.qwen_edit import Fp8Linear

    count = 0
    for name, module in list(model.named_modules()):
        if isinstance(module, nn.Linear):
            fp8 = Fp8Linear(module.weight.data.to(torch.float8_e4m3fn), module.bias, None)
            parent_name, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent_name) if parent_name else model, child, fp8)
            count += 1
    return count


def weight_bytes_on_meta(config: dict[str, Any]) -> dict[str, int]:
    """Transformer weight bytes in bf16, and with every Linear weight in fp8 (biases/norms bf16)."""
    model = _meta_transformer(config, False)
    total = sum(p.numel() for p in model.parameters())
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    return {"params": total, "bf16": 2 * total, "fp8_linear_weights": 2 * total - linear}


def make_inputs(size: Size, variant: str, device: torch.device, dtype: torch.dtype, seed: int = 0) -> Any:
    """A Prepared for one reference image: noise, reference latents, prompt and negative-prompt states."""
    from difforge.models.qwen_edit import Prepared

    cfg = size.config
    side = size.pixels // (size.vae_scale * cfg["patch_size"])
    shapes = [[(1, side, side), (1, side, side)]]
    n = side * side
    lc, lu = size.text[variant]
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(device, dtype)

    return Prepared(
        key=f"bench-{size.name}-{variant}", height=size.pixels, width=size.pixels,
        prompt_embeds=randn(1, lc, cfg["joint_attention_dim"]), prompt_mask=None,
        negative_embeds=randn(1, lu, cfg["joint_attention_dim"]), negative_mask=None,
        image_latents=randn(1, n, cfg["in_channels"]), img_shapes=shapes, noise=randn(1, n, cfg["in_channels"]),
    )


def _scheduler() -> Any:
    from diffusers import FlowMatchEulerDiscreteScheduler

    from difforge.models.qwen_edit import SCHEDULER_CONFIG

    return FlowMatchEulerDiscreteScheduler(**SCHEDULER_CONFIG)


def time_loop(transformer: nn.Module, p: Any, backend: Any, batched: bool, warmup: int, steps: int,
              true_cfg: float = 4.0) -> tuple[list[float], int | None]:
    """Per-step ms of difforge's loop (events on accelerators, no sync inside), after ``warmup`` steps."""
    from difforge.models.qwen_edit import Denoiser, denoise, schedule
    from difforge.runtime.steps import StepTimer

    scheduler = _scheduler()
    timesteps = schedule(scheduler, p.noise.shape[1], warmup + steps, backend.device)
    timer = StepTimer(backend)
    backend.synchronize()
    backend.reset_peak_memory()
    timer.start()
    with torch.inference_mode():
        denoise(Denoiser(transformer, batched_cfg=batched), scheduler, p, timesteps, true_cfg,
                on_step=lambda *_: timer.mark())
    backend.synchronize()
    times = [1000.0 * t for t in timer.durations()[warmup:]]
    return times, backend.peak_memory_bytes()


@torch.no_grad()
def time_diffusers_pipeline(transformer: nn.Module, size: Size, p: Any, backend: Any, warmup: int, steps: int,
                            seed: int = 0, true_cfg: float = 4.0) -> tuple[list[float], int | None]:
    """Per-step ms of ``QwenImageEditPlusPipeline.__call__`` itself on the same transformer and texts.

    The pipeline gets the prompt embeddings (no text encoder), one reference picture of the output's size
    (encoded once by a random-weight VAE before the loop) and ``output_type="latent"`` (no decode); each
    step is timed from one step-end callback to the next, synchronised, so the steps are the pipeline's
    own (its CFG, scheduler and bookkeeping included) and the encode is not.  The pipeline sizes its
    reference picture to 1024² of area (``VAE_IMAGE_SIZE``); the bench sets that to the output's area
    for the call, so smaller sizes stay comparable (full size: unchanged).
    """
    import PIL.Image
    from diffusers import AutoencoderKLQwenImage, QwenImageEditPlusPipeline
    from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit_plus as plus
    from diffusers.utils import logging as dlog

    saved, level = plus.VAE_IMAGE_SIZE, dlog.get_verbosity()
    # quiet: "prompt_embeds without a mask" (every token is valid, as in difforge's loop), keep-in-fp32 (none here)
    dlog.set_verbosity_error()
    torch.manual_seed(seed)
    vae = AutoencoderKLQwenImage(**VAE_CONFIGS[size.name]).to(backend.device, p.noise.dtype).eval()
    pipe = QwenImageEditPlusPipeline(scheduler=_scheduler(), vae=vae, text_encoder=None, tokenizer=None,
                                     processor=None, transformer=transformer)
    pipe.set_progress_bar_config(disable=True)
    stamps: list[float] = []

    def step_end(_pipe: Any, _i: int, _t: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
        backend.synchronize()
        stamps.append(time.perf_counter())
        return {}

    picture = PIL.Image.new("RGB", (size.pixels, size.pixels), (200, 120, 40))
    plus.VAE_IMAGE_SIZE = size.pixels * size.pixels
    backend.reset_peak_memory()
    try:
        pipe(image=[picture], prompt_embeds=p.prompt_embeds, negative_prompt_embeds=p.negative_embeds,
             true_cfg_scale=true_cfg, num_inference_steps=max(warmup, 1) + steps, height=size.pixels,
             width=size.pixels, output_type="latent", callback_on_step_end=step_end,
             generator=torch.Generator(backend.device).manual_seed(seed))
    finally:
        plus.VAE_IMAGE_SIZE = saved
        dlog.set_verbosity(level)
    times = [1000.0 * (b - a) for a, b in zip(stamps, stamps[1:], strict=False)]
    return times[max(warmup, 1) - 1:], backend.peak_memory_bytes()


def _eager(compiled: bool) -> contextlib.AbstractContextManager[Any]:
    """Compiled modules run eager inside (``torch.compiler.set_stance("force_eager")``, torch >= 2.6)."""
    if compiled and hasattr(torch.compiler, "set_stance"):
        return torch.compiler.set_stance("force_eager")
    return contextlib.nullcontext()


def time_compiled(model: nn.Module, p: Any, backend: Any, args: argparse.Namespace, result: Any, how: str,
                  note: str, name: str = f"{DEFAULT} + compile") -> BenchResult:
    """Time the compiled default: the first two steps (the compile) apart, then the timed steps."""
    t0 = time.perf_counter()
    time_loop(model, p, backend, True, 2, 0)  # the first step compiles (2: one step gives NaN sigmas)
    compile_s = time.perf_counter() - t0
    times, peak = time_loop(model, p, backend, True, args.warmup, args.steps)
    row = result(name, times, peak, 1, f"{how} (first steps {compile_s:.1f} s){note}; not bit for bit")
    row.extra["compile_s"] = compile_s
    return row


class ShareTimer:
    """The :class:`~difforge.runtime.stages.StageTimer` of :func:`time_shares`: seconds per stage, with the
    device synchronised before and after each timed call."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.spent: dict[str, float] = {}

    @contextlib.contextmanager
    def measure(self, stage: str) -> Iterator[None]:
        self.backend.synchronize()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.backend.synchronize()
            self.spent[stage] = self.spent.get(stage, 0.0) + time.perf_counter() - t0


def time_shares(transformer: nn.Module, p: Any, backend: Any, batched: bool, steps: int,
                true_cfg: float = 4.0) -> dict[str, float]:
    """ms per step of one loop with a sync around each true-CFG combine and scheduler step, and their shares.

    The combine is the loop's ``cfg`` stage; the scheduler is diffusers' object, this bench's own instance,
    whose ``step`` is marked as the ``sampler`` stage here.
    """
    from difforge.models.qwen_edit import Denoiser, denoise, schedule
    from difforge.runtime.stages import CFG, SAMPLER, stage_timing, timed_stage

    scheduler = _scheduler()
    timesteps = schedule(scheduler, p.noise.shape[1], steps, backend.device)
    scheduler.step = timed_stage(SAMPLER)(scheduler.step)
    timer = ShareTimer(backend)
    backend.synchronize()
    t0 = time.perf_counter()
    with torch.inference_mode(), stage_timing(timer):
        denoise(Denoiser(transformer, batched_cfg=batched), scheduler, p, timesteps, true_cfg)
    backend.synchronize()
    wall = time.perf_counter() - t0
    cfg_s, scheduler_s = timer.spent.get(CFG, 0.0), timer.spent.get(SAMPLER, 0.0)
    return {"run_ms_per_step": 1000.0 * wall / steps, "cfg_ms_per_step": 1000.0 * cfg_s / steps,
            "scheduler_ms_per_step": 1000.0 * scheduler_s / steps, "cfg_share": cfg_s / wall,
            "scheduler_share": scheduler_s / wall, "draw_share": 0.0}


def end_to_end_tiny(seed: int = 0) -> dict[str, Any]:
    """Load time and time to first image of the tiny Plus pipeline (CPU, fp32, 2 steps)."""
    from difforge.config import RunConfig
    from difforge.devices import CPUBackend
    from difforge.models.qwen_edit import QwenEditPipeline, build_tiny_qwen_edit
    from difforge.runtime.images import test_picture
    from difforge.runtime.record import RunRecord

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "tiny-qwen-edit-plus"
        t0 = time.perf_counter()
        build_tiny_qwen_edit(folder, plus=True)
        build_s = time.perf_counter() - t0
        cfg = RunConfig(model=str(folder), prompt="make the sky red", steps=2, seed=seed, height=64, width=64,
                        quiet=True)
        record = RunRecord("edit")
        t0 = time.perf_counter()
        qe = QwenEditPipeline.from_pretrained(folder, CPUBackend(), torch.float32, cfg, record)
        load_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        images = qe(cfg, record, [test_picture(96, 64)])
        first_s = time.perf_counter() - t0
    return {
        "model": "tiny-qwen-edit-plus", "device": "cpu", "dtype": "float32", "steps": 2,
        "build_s": build_s, "load_s": load_s, "first_image_s": first_s, "load_plus_first_image_s": load_s + first_s,
        "phases_s": {k: v.wall_s for k, v in record.phases.items()}, "image_size": list(images[0].size),
    }


def formula_flops(config: dict[str, Any], image_tokens: int, lengths: list[int]) -> float:
    """Spec §5.2: per forward, layers * (24 d^2 L + 4 d L^2) (projections + MLP, joint attention)."""
    d = config["num_attention_heads"] * config["attention_head_dim"]
    return float(sum(config["num_layers"] * (24 * d * d * (image_tokens + n) + 4 * d * (image_tokens + n) ** 2)
                     for n in lengths))


def run(args: argparse.Namespace) -> dict[str, Any]:
    from difforge.devices import dtype_name, get_backend
    from difforge.models.qwen_edit import (
        SpeedOptions,
        install_compile,
        install_processor,
        install_real_rope,
        module_weight_bytes,
    )
    from difforge.models.qwen_edit.probe import count_forward_flops
    from difforge.runtime.record import RunRecord

    size = SIZES[args.size]
    backend = get_backend(args.device)
    device = backend.device
    dtype = backend.resolve_dtype(args.dtype)
    torch.manual_seed(args.seed)
    cfg = dict(size.config)

    t0 = time.perf_counter()
    model = build_transformer(cfg, device, dtype, args.seed, args.zero_cond_t)
    backend.synchronize()
    build_s = time.perf_counter() - t0
    p = make_inputs(size, args.variant, device, dtype, args.seed)
    image_tokens = sum(math.prod(s) for s in p.img_shapes[0])
    lengths = [int(p.prompt_embeds.shape[1]), int(p.negative_embeds.shape[1])]
    flops = float(sum(count_forward_flops({**cfg, "zero_cond_t": args.zero_cond_t}, p.img_shapes, n) for n in lengths))
    tokens = image_tokens + lengths[0]
    weights = {f"{dtype_name(dtype)}_on_device": module_weight_bytes(model)}

    def result(name: str, times: list[float], peak: int | None, forwards: int, notes: str) -> BenchResult:
        return make_result(name, times, device, forwards, tokens, flops, dtype=dtype, peak_memory_bytes=peak,
                           notes=notes)

    results: list[BenchResult] = []
    head = {"benchmark": "qwen_edit_denoise", "device": str(device), "dtype": dtype_name(dtype), "size": size.name,
            "variant": args.variant, "output_pixels": size.pixels, "steps": args.steps, "warmup": args.warmup}

    def add(row: BenchResult) -> None:
        """Keep a finished row, and write the rows so far at once: a run stopped at its time cap keeps them."""
        results.append(row)
        write_json(args.json, {**head, "partial": True, "results": list(results)})

    times, peak = time_loop(model, p, backend, False, args.warmup, args.steps)
    add(result(REFERENCE, times, peak, 2, "diffusers processor, complex RoPE, eager"))
    if not args.no_pipeline:  # the same transformer inside diffusers' own pipeline call
        times, peak = time_diffusers_pipeline(model, size, p, backend, args.warmup, args.steps, args.seed)
        add(result(PIPELINE, times, peak, 2, "QwenImageEditPlusPipeline.__call__, eager; step-end to "
                                             "step-end (its VAE encode before the loop not counted)"))

    install_processor(model)
    install_real_rope(model)
    times, peak = time_loop(model, p, backend, False, args.warmup, args.steps)
    add(result("difforge, two calls", times, peak, 2, "real RoPE, eager"))
    times, peak = time_loop(model, p, backend, True, args.warmup, args.steps)
    add(result(DEFAULT, times, peak, 1, "batched CFG (batch 2), real RoPE, eager"))
    shares = time_shares(model, p, backend, True, max(args.steps, 2))
    if args.compile:
        # The same compile policy as `difforge edit --compile` (Inductor; torchair on NPU; eager if none).
        compile_record = RunRecord(kind="bench")
        install_compile(model, SpeedOptions(compile=True), backend, compile_record)
        add(time_compiled(model, p, backend, args, result, compile_record.adaptations[-1].choice, ""))
    if args.fp8:  # the same model's Linear weights stored as fp8, beside the bf16 rows (memory, not speed)
        weights["fp8_linears"] = to_fp8_storage(model)
        weights["fp8_on_device"] = module_weight_bytes(model)
        note = "fp8 e4m3fn weight storage, dequantised per forward (approximate)"
        with _eager(args.compile):  # the compiled blocks run eager here (torch.compiler.set_stance)
            times, peak = time_loop(model, p, backend, True, args.warmup, args.steps)
        add(result(f"{DEFAULT}, fp8", times, peak, 1, f"batched CFG, real RoPE, eager; {note}"))
        if args.compile:  # the compiled blocks see new modules: the first steps recompile
            add(time_compiled(model, p, backend, args, result, "recompiled for fp8 storage", f"; {note}",
                              name=f"{DEFAULT} + compile, fp8"))

    base = results[0].ms_per_step
    payload: dict[str, Any] = {
        "benchmark": "qwen_edit_denoise",
        "date": datetime.date.today().isoformat(),
        "command": " ".join(sys.argv),
        "device": str(device),
        "device_name": backend.device_name() if hasattr(backend, "device_name") else str(device),
        "dtype": dtype_name(dtype),
        "size": size.name,
        "variant": args.variant,
        "zero_cond_t": args.zero_cond_t,
        "config": cfg,
        "output_pixels": size.pixels,
        "image_tokens": image_tokens,
        "text_tokens": lengths[0],
        "negative_text_tokens": lengths[1],
        "tokens_per_forward": tokens,
        "flops_per_step": flops,
        "flops_method": "FlopCounterMode on a meta-device transformer, two unpadded batch-1 forwards (model FLOPs)",
        "flops_formula_spec_5_2": formula_flops(cfg, image_tokens, lengths),
        "steps": args.steps,
        "warmup": args.warmup,
        "build_s": build_s,
        "weight_bytes": {"this_size": weights, "meta_bf16_vs_fp8": {
            args.size: weight_bytes_on_meta(cfg), "full": weight_bytes_on_meta(FULL_CONFIG)}},
        "host_max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "results": results,
        "ratios_vs_reference": {r.name: base / r.ms_per_step for r in results},
        "step_shares": shares,
    }
    if args.size == "tiny" or args.end_to_end:
        payload["end_to_end"] = end_to_end_tiny(args.seed)
    return payload


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sz = ap.add_mutually_exclusive_group()
    sz.add_argument("--size", choices=sorted(SIZES), default="medium")
    sz.add_argument("--medium", dest="size", action="store_const", const="medium")
    sz.add_argument("--tiny", dest="size", action="store_const", const="tiny")
    ap.add_argument("--variant", choices=("edit", "plus"), default="plus",
                    help="text length: edit ~1400 tokens, plus ~200 (full size)")
    ap.add_argument("--zero-cond-t", action="store_true", help="Edit-2511's zero_cond_t modulation")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto", help="auto, bf16, fp16, fp32")
    ap.add_argument("--compile", action="store_true", help="also time compile_repeated_blocks")
    ap.add_argument("--fp8", action="store_true", help="fp8 e4m3fn weight storage for the difforge variants")
    ap.add_argument("--steps", type=int, default=None, help="timed steps (default: tiny 5, medium 3, full 5)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--end-to-end", action="store_true", help="also time the tiny pipeline end to end")
    ap.add_argument("--no-pipeline", action="store_true", help="do not time diffusers' own pipeline call")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)
    if args.steps is None:
        args.steps = {"tiny": 5, "medium": 3, "full": 5}[args.size]
    if args.steps < 1 or args.warmup < 0:
        ap.error("--steps must be >= 1 and --warmup >= 0")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    payload = run(args)
    gb = payload["weight_bytes"]["meta_bf16_vs_fp8"]["full"]
    print_table(
        f"Qwen-Image-Edit denoise step, size={payload['size']} variant={payload['variant']} "
        f"{payload['device']} {payload['dtype']}, {payload['tokens_per_forward']} tokens/forward, "
        f"{payload['flops_per_step'] / 1e12:.3f} TFLOP/step (FlopCounterMode, meta)",
        payload["results"], REFERENCE,
    )
    sh = payload["step_shares"]
    print(f"difforge default, instrumented run {sh['run_ms_per_step']:.1f} ms/step: random draws 0 (noise drawn once "
          f"before the loop), CFG combine {sh['cfg_ms_per_step']:.2f} ms ({100 * sh['cfg_share']:.1f} %), scheduler "
          f"step {sh['scheduler_ms_per_step']:.2f} ms ({100 * sh['scheduler_share']:.1f} %)")
    print(f"full-size transformer weights: bf16 {gb['bf16'] / 1e9:.2f} GB, fp8 Linear weights "
          f"{gb['fp8_linear_weights'] / 1e9:.2f} GB (counted on meta)")
    if "end_to_end" in payload:
        e2e = payload["end_to_end"]
        print(f"tiny pipeline end to end: load {e2e['load_s']:.2f} s, first image {e2e['first_image_s']:.2f} s")
    write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
