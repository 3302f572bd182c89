"""URSA denoising-step benchmark: difforge's real loop (transformer + CFG + scheduler sampling) per step.

Weights are random and built on the meta device, then materialised directly on the target device and
filled in place there, so a full-size 1.7B model is ready in seconds on an accelerator (no CPU init).
Every variant runs through ``URSAPipeline.generate_tokens`` - stages 3 and 4 (prepare tokens, denoise) of
the call ``difforge generate`` runs - so a step includes the CPU/device random draws, the CFG combine and
the scheduler step.

Variants, all measured in the same process:

* ``baseline``   - every exact optimisation off, eager (the unoptimised path), on the backend's random stream
* ``optimised``  - the exact optimisations on (the default), eager
* ``fused kernels off`` - where the backend offers fused kernels (CUDA's Triton kernels): optimised with
  ``DIFFORGE_TRITON_KERNELS=off``, the kernels' off state; its tokens against the baseline's (kernels on)
  are their off-identity check on the device
* ``compiled``   - optimised + ``cfg.compile`` (regional compile of the decoder layer, and of the Philox
  sampler block on the Philox stream), with ``--compile``; Inductor's default mode unless
  ``--compile-mode`` asks for another (``max-autotune-no-cudagraphs`` took 75 s at 512² on the H200)
* the other random stream - on accelerators (default Philox) the reference's host-drawn CPU stream
  (``--disable philox-rng``); on the CPU (default reference) the portable Philox stream (``--fast
  philox-rng``, eager and, with ``--compile``, compiled); with ``--fast`` or ``--draws`` on the CPU
* ``--gumbel``: the Philox stream once more with its other categorical sampler, Gumbel-max (one word
  per token and code), eager and, with ``--compile``, compiled - the comparison that chose inverse-CDF

``--draws`` adds one instrumented run per variant that times every random draw (URSA's functions marked
as the ``draws`` stage, synchronised around each call through the public hook
:mod:`difforge.runtime.stages`; on the Philox stream the inverse-CDF draw includes its float32 softmax),
the CFG combine (``URSAPipeline.guide``) and the whole scheduler step, and reports their share of the
run: the "time on random draws" figure of issue 12.

The reference, diffnext, is timed in the same process when it can be imported: from
``$DIFFORGE_DIFFNEXT_PATH`` or the ignored folder ``reference/`` at the repository root (a folder holding
the ``diffnext`` package; never committed), else from the environment.  It gets the same config, the
same random weights (difforge's state dict, copied where names and shapes match), the same prompt ids,
seed and steps, eager (and with ``--compile`` its decoder layers compiled by the same policy), and the
table prints difforge's ratios against it.  When it cannot be imported one line says why.  Under
transformers 5, :func:`rope_theta_shim` gives diffnext the ``Qwen3Config.rope_theta`` it reads (a shim
in the bench only, never in difforge's code).

Tokens of each variant are compared with the baseline's (``tokens_equal_baseline``): on the CPU in
float32 the exact variants must match bit for bit (another stream gives other tokens by design).
Nothing here asserts a speed.

    python -m benchmarks.bench_ursa --tiny --json out.json
    python -m benchmarks.bench_ursa --medium --threads 1 --draws --compile --gumbel   # draw shares, both streams
    python -m benchmarks.bench_ursa --medium --compile
    python -m benchmarks.bench_ursa --size full --res 1024 --device cuda --dtype float16 --compile
    python -m benchmarks.bench_ursa --size full --flops-only          # FLOPs/step, no weights built
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import math
import os
import resource
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

import torch

from benchmarks.common import BenchResult, make_result, print_table, sync, write_json
from difforge.config import RunConfig
from difforge.devices import DTYPES, Backend, get_backend
from difforge.models.ursa import (
    EXACT_OPTIMISATIONS,
    GUMBEL_MAX,
    INVERSE_CDF,
    PHILOX_RNG,
    DFMScheduler,
    SchedulerConfig,
    URSACheckpoint,
    URSAPipeline,
    URSATransformer,
    URSATransformerConfig,
    VQConfig,
    positions,
)
from difforge.ops import select_ops
from difforge.runtime.record import RunRecord
from difforge.runtime.stages import CFG, DRAWS, SAMPLER, stage_timing

#: The CUDA backend's switch for its Triton kernels (``difforge.devices.cuda``): read from the environment.
KERNELS_ENV = "DIFFORGE_TRITON_KERNELS"
TEXT_LEN = 320  # URSA's fixed prompt length (the tokenizer pads/truncates to it)
REPO = Path(__file__).resolve().parents[1]
#: Where the reference's source may sit (a folder holding the ``diffnext`` package), besides the environment.
DIFFNEXT_ENV = "DIFFORGE_DIFFNEXT_PATH"
REFERENCE_DIR = REPO / "reference"
#: Measured bf16 matmul ceiling of one H200 (issue 5); used for the "ms at 100% of ceiling" context.
H200_CEILING_TFLOPS = 806.0
#: The real URSA scheduler's metric path.
SCHEDULER = SchedulerConfig(alpha=0.9, c=3.0, shift=1.0, eps=1e-5)
CODEBOOK_DIM = 8


@dataclass(frozen=True)
class Size:
    """A benchmark shape: transformer config, codebook size and default image side."""

    name: str
    transformer: URSATransformerConfig
    res: int
    steps: int


def _small(hidden: int, inter: int, heads: int, kv: int, layers: int, codebook: int) -> URSATransformerConfig:
    lm_vocab = 1024
    return URSATransformerConfig(
        hidden_size=hidden, intermediate_size=inter, num_attention_heads=heads, num_key_value_heads=kv,
        num_hidden_layers=layers, max_window_layers=layers, vocab_size=lm_vocab + codebook, lm_vocab_size=lm_vocab,
        lm_head_size=codebook, bov_token_id=1000,
    )


SIZES = {
    # tiny-ursa's transformer shape: seconds on a CPU, the CI smoke test
    "tiny": Size("tiny", _small(64, 128, 2, 1, 2, 64), res=128, steps=4),
    # issue 3's medium: hidden 512, 8 layers, 256x256; IBQ's 16384-code book keeps CPU sampling affordable
    "medium": Size("medium", _small(512, 1536, 4, 2, 8, 16384), res=256, steps=4),
    # URSA-1.7B (the config defaults): 28 layers, hidden 2048, 64000 codes
    "full": Size("full", URSATransformerConfig(), res=512, steps=25),
}


# ------------------------------------------------------------------------------------------- building
def random_transformer(cfg: URSATransformerConfig, backend: Backend, dtype: torch.dtype, seed: int) -> URSATransformer:
    """Meta-device model materialised on the device and filled in place there (never a CPU init)."""
    with torch.device("meta"):
        model = URSATransformer(cfg).to(dtype)
    model.to_empty(device=backend.device)
    try:
        gen: torch.Generator | None = torch.Generator(device=backend.device).manual_seed(seed)
    except RuntimeError:  # a device without its own generator type: the default one, seeded
        torch.manual_seed(seed)
        gen = None
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:  # RMSNorm weights
                p.fill_(1.0)
            else:  # fan-in scaled normal; embeddings unit normal; lm_head x4 for peaky logits like tiny-ursa
                std = 1.0 if "embed" in name else (4.0 if name.startswith("lm_head") else 1.0) / math.sqrt(p.shape[1])
                p.normal_(0.0, std, generator=gen)
    model.requires_grad_(False).eval()
    model.set_ops(select_ops(backend))
    return model


def build_pipeline(size: Size, backend: Backend, dtype: torch.dtype, seed: int) -> URSAPipeline:
    """An URSAPipeline with random weights and no VAE/tokenizer (the benchmark feeds token ids directly)."""
    tcfg = size.transformer
    k = tcfg.lm_head_size
    codebook = torch.randn(k, CODEBOOK_DIM, generator=torch.Generator().manual_seed(seed)).to(torch.float16)
    ckpt = URSACheckpoint(
        folder=Path(f"<random {size.name}>"),
        classes={"transformer": "URSATransformer3DModel", "vae": "AutoencoderVQ", "scheduler": "KineticOptimalScheduler"},
        transformer_config=tcfg,
        vae_config=VQConfig(num_vq_embeddings=k),
        scheduler_config=SCHEDULER,
        codebook=codebook,
        tokenizer=cast(Any, None),
    )
    transformer = random_transformer(tcfg, backend, dtype, seed)
    scheduler = DFMScheduler(SCHEDULER, codebook).to(backend.device)
    return URSAPipeline(ckpt, transformer, cast(Any, None), scheduler, backend, dtype)


# ------------------------------------------------------------------------------------------- FLOPs
def forward_flops(tcfg: URSATransformerConfig, latent_shape: tuple[int, int, int], rows: int, sliced: bool) -> int:
    """FLOPs of one transformer forward over ``rows`` sequences, counted on the meta device."""
    from torch.utils.flop_counter import FlopCounterMode

    n_img = math.prod(latent_shape)
    length = TEXT_LEN + 1 + n_img
    with torch.device("meta"):
        model = URSATransformer(tcfg)
        ids = torch.zeros(rows, length, dtype=torch.int64)
    pos = positions(latent_shape, TEXT_LEN).to("meta")
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(ids, pos, logits_slice=slice(length - n_img - 1, length - 1) if sliced else None)
    return int(counter.get_total_flops())


def flops_report(size: Size, res: int, guidance: float, ceiling_tflops: float = H200_CEILING_TFLOPS) -> dict[str, Any]:
    latent = (1, res // 16, res // 16)
    rows = 2 if guidance > 1 else 1
    flops = forward_flops(size.transformer, latent, rows, sliced=True)
    params = sum(math.prod(s) for s in _param_shapes(size.transformer))
    return {
        "size": size.name, "res": res, "rows": rows, "image_tokens": math.prod(latent),
        "sequence_length": TEXT_LEN + 1 + math.prod(latent), "parameters": params,
        "flops_per_forward": flops, "ceiling_tflops": ceiling_tflops,
        "ms_at_ceiling": flops / (ceiling_tflops * 1e12) * 1000.0,
    }


def _param_shapes(tcfg: URSATransformerConfig) -> list[tuple[int, ...]]:
    with torch.device("meta"):
        return [tuple(p.shape) for p in URSATransformer(tcfg).parameters()]


# ------------------------------------------------------------------------------------------- draw timing
class DrawTimer:
    """Wall time inside URSA's random draws, the CFG combine and the scheduler step, synchronised around each
    call: the :class:`~difforge.runtime.stages.StageTimer` this benchmark installs with ``stage_timing``.

    URSA marks those functions as stages (``difforge.runtime.stages``), so no private function is swapped:
    draws are the reference stream's ``categorical`` (multinomial on the CPU, host exponentials + copy
    elsewhere), ``uniform``, ``skip_categorical`` and the initial ``random_codes``, and the Philox stream's
    ``categorical_logits`` / ``categorical_weights`` (inverse-CDF: the float32 softmax of the logits,
    uniforms, cumulative sums; Gumbel-max: noise, the log of the weights, argmax), ``uniform`` and
    ``codes``.  The reference's ``softmax`` before its x1 draw is the scheduler's, not a draw.  Sampler:
    ``DFMScheduler.step`` / ``skip_first_step`` (draws included).  CFG combine: ``URSAPipeline.guide``
    (``u + (c - u) * scale``, in place).
    """

    FIELDS = {DRAWS: "draws_s", SAMPLER: "sampler_s", CFG: "cfg_s"}

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.draws_s = self.sampler_s = self.cfg_s = 0.0

    @contextlib.contextmanager
    def measure(self, stage: str) -> Iterator[None]:
        sync(self.device)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            sync(self.device)
            field = self.FIELDS[stage]
            setattr(self, field, getattr(self, field) + time.perf_counter() - t0)

    def __enter__(self) -> DrawTimer:
        self._installed = stage_timing(self)
        self._installed.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._installed.__exit__(*exc)


# ------------------------------------------------------------------------------------------- running
@dataclass(frozen=True)
class Variant:
    name: str
    disable: tuple[str, ...] = ()
    fast: tuple[str, ...] = ()
    compile: bool = False
    exact: bool = True
    sampler: str = INVERSE_CDF  # the Philox stream's categorical sampler
    kernels: str | None = None  # DIFFORGE_TRITON_KERNELS for this variant (None: as the process has it)


def run_variant(
    pipe: URSAPipeline, variant: Variant, latent: tuple[int, int, int], args: argparse.Namespace
) -> tuple[BenchResult, torch.Tensor]:
    """Warm up, then time ``args.repeat`` runs of ``args.steps`` steps; returns the result and last tokens."""
    cfg = RunConfig(model="random", quiet=True, guidance=args.guidance, guidance_trunc=args.guidance_trunc,
                    disable=list(variant.disable), fast=list(variant.fast), compile=variant.compile)
    with fused_kernels(pipe, variant.kernels):
        return _run_variant(pipe, variant, latent, args, cfg)


@contextlib.contextmanager
def fused_kernels(pipe: URSAPipeline, value: str | None) -> Iterator[None]:
    """The backend's fused kernels as ``DIFFORGE_TRITON_KERNELS=value`` asks, for one variant; then as before.

    The transformer's ops are picked again through the public ``select_ops`` and the scheduler's rate kernels
    by moving it to its device again (``DFMScheduler.to`` binds them; the backend reads the variable on every
    question); the sampler's draw kernels follow the variable by themselves at each call.
    """
    if value is None:
        yield
        return
    saved = os.environ.get(KERNELS_ENV)

    def rebind() -> None:
        pipe.transformer.set_ops(select_ops(pipe.backend))
        pipe.scheduler.to(pipe.device)

    os.environ[KERNELS_ENV] = value
    rebind()
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(KERNELS_ENV, None)
        else:
            os.environ[KERNELS_ENV] = saved
        rebind()


def _run_variant(
    pipe: URSAPipeline, variant: Variant, latent: tuple[int, int, int], args: argparse.Namespace, cfg: RunConfig
) -> tuple[BenchResult, torch.Tensor]:
    flags = pipe.optimisations(cfg)
    pipe.philox_sampler = variant.sampler
    policy = pipe.set_compile(variant.compile)
    gen = torch.Generator().manual_seed(args.seed)
    cond = torch.randint(0, 1000, (1, TEXT_LEN), generator=gen)
    uncond = torch.randint(0, 1000, (1, TEXT_LEN), generator=gen)
    dev = pipe.device

    def once() -> tuple[float, torch.Tensor, RunRecord]:
        record = RunRecord("generate")
        sync(dev)
        t0 = time.perf_counter()
        x = pipe.generate_tokens(cond, uncond, latent, args.steps, args.guidance, args.guidance_trunc,
                                 torch.Generator().manual_seed(args.seed), flags, record=record)
        sync(dev)
        return (time.perf_counter() - t0) * 1000.0, x, record

    t_first = time.perf_counter()
    for _ in range(args.warmup):
        once()
    warm_s = time.perf_counter() - t_first
    pipe.backend.reset_peak_memory()
    runs = [once() for _ in range(args.repeat)]
    per_step = [wall / args.steps for wall, _, _ in runs]
    record = runs[-1][2]
    info = record.extra["ursa"]
    rows = info["forward_rows"]
    sliced = "lm-head-slice" not in variant.disable
    flops = forward_flops(pipe.transformer.config, latent, rows, sliced) * info["forwards_per_step"]
    result = make_result(
        variant.name, per_step, dev, forwards=1, tokens=rows * info["sequence_length"], flops=flops, dtype=pipe.dtype,
        peak_memory_bytes=pipe.backend.peak_memory_bytes(),
        notes="exact" if variant.exact else "approximate (opt-in)",
        extra={
            "forwards_per_step": info["forwards_per_step"],
            "step_ms_median": sorted(record.step_times_s)[len(record.step_times_s) // 2] * 1000.0,
            "step_ms": [s * 1000.0 for s in record.step_times_s],
            "warmup_s": warm_s,
            "compile": None if policy is None else {"label": policy.label, "available": policy.available,
                                                    "detail": policy.detail},
            "disable": list(variant.disable), "fast": list(variant.fast),
            "host_max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        },
    )
    result.forwards_per_step = info["forwards_per_step"]  # fractional with reuse-first-forward
    result.extra["random_stream"] = info["random_stream"]
    if args.draws:  # one more run, instrumented: the syncs around each draw are its only difference
        with DrawTimer(dev) as timer:
            wall_ms, _, _ = once()
        result.extra["draws"] = {
            "run_ms_per_step": wall_ms / args.steps, "draw_ms_per_step": timer.draws_s * 1000.0 / args.steps,
            "sampler_ms_per_step": timer.sampler_s * 1000.0 / args.steps,
            "cfg_ms_per_step": timer.cfg_s * 1000.0 / args.steps,
            "draw_share": timer.draws_s * 1000.0 / wall_ms, "sampler_share": timer.sampler_s * 1000.0 / wall_ms,
            "cfg_share": timer.cfg_s * 1000.0 / wall_ms,
        }
    result.extra["philox_sampler"] = variant.sampler if info["random_stream"] == "philox" else None
    pipe.set_compile(False)
    pipe.philox_sampler = INVERSE_CDF
    return result, runs[-1][1].cpu()


# ------------------------------------------------------------------------------------------- the reference
def import_diffnext() -> tuple[Any | None, str]:
    """``(diffnext's URSA pieces, where from)``, or ``(None, why not)``: never raises.

    Looks in ``$DIFFORGE_DIFFNEXT_PATH``, then ``reference/`` at the repository root (each a folder holding
    the ``diffnext`` package, or the package folder itself), then the environment.
    """
    where = "the environment"
    for folder in (os.environ.get(DIFFNEXT_ENV, ""), str(REFERENCE_DIR)):
        if not folder:
            continue
        root = Path(folder).expanduser()
        root = root.parent if root.name == "diffnext" and (root / "__init__.py").exists() else root
        if (root / "diffnext" / "__init__.py").exists():
            if str(root) not in sys.path:
                sys.path.insert(0, str(root))
            where = str(root)
            break
    if importlib.util.find_spec("diffnext") is None:
        return None, (f"diffnext is not importable (set {DIFFNEXT_ENV}, or put its source in reference/ at the "
                      "repository root, an ignored folder)")
    try:
        pipeline = importlib.import_module("diffnext.pipelines.ursa.pipeline_ursa")
        transformer = importlib.import_module("diffnext.models.transformers.transformer_ursa")
        scheduler = importlib.import_module("diffnext.schedulers.scheduling_dfm")
    except Exception as exc:  # noqa: BLE001 - a missing dependency of the reference is a reason, not a failure
        return None, f"diffnext from {where} does not import here ({type(exc).__name__}: {exc})"
    return (pipeline, transformer, scheduler), where


def _cpu_swiglu() -> None:
    """diffnext's SwiGLU is a CUDA jiterator kernel: route CPU tensors to its float32 formula (scripts/ helper)."""
    name = "ursa_reference_arrays"
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
        if spec is None or spec.loader is None:
            return
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # registered: torch.compile's tracing looks the patched function's module up
        spec.loader.exec_module(module)
    module.patch_swiglu()


def _rope_theta(config: Any) -> float:
    """``rope_parameters["rope_theta"]``; AttributeError while the config is still being built (its own
    ``getattr(self, "rope_theta", default)`` then takes the default, as without the shim)."""
    params = getattr(config, "rope_parameters", None) or {}
    if "rope_theta" not in params:
        raise AttributeError("rope_theta")
    return float(params["rope_theta"])


@contextlib.contextmanager
def rope_theta_shim() -> Iterator[bool]:
    """diffnext reads ``Qwen3Config.rope_theta``; transformers 5 keeps it in ``rope_parameters`` only.

    While diffnext builds its model (it reads the value then, for its rotary tables), a config without
    the attribute answers it from ``rope_parameters["rope_theta"]``; afterwards the class is as it was.
    Yields whether the shim was needed.  Nothing of difforge's own code is touched: this serves the
    reference only.
    """
    from transformers.models.qwen3.configuration_qwen3 import Qwen3Config

    if hasattr(Qwen3Config(), "rope_theta"):  # transformers 4.x: the attribute is set by __init__
        yield False
        return
    Qwen3Config.rope_theta = property(_rope_theta)  # type: ignore[attr-defined]
    try:
        yield True
    finally:
        del Qwen3Config.rope_theta  # type: ignore[attr-defined]


class _VaeStub:
    """What diffnext's pipeline reads of a VAE when it decodes nothing (``output_type="latent"``)."""

    config: dict[str, int] = {"temporal_stride": 4, "spatial_stride": 16}


def time_reference(pipe: URSAPipeline, latent: tuple[int, int, int], args: argparse.Namespace,
                   compiled: bool) -> dict[str, Any]:
    """diffnext's own loop on difforge's config and weights: ms/step of its call with ``output_type="latent"``."""
    mods, where = import_diffnext()
    if mods is None:
        return {"available": False, "why": where}
    pipeline_mod, transformer_mod, scheduler_mod = mods
    dev, tcfg = pipe.device, pipe.transformer.config
    try:
        if dev.type == "cpu":
            _cpu_swiglu()
        # built where it runs (not on meta: its non-persistent buffers need their init)
        with torch.device(dev), rope_theta_shim() as shimmed:
            model = transformer_mod.URSATransformer3DModel(**tcfg.to_dict())
        theirs = model.state_dict()
        ours = {k: v for k, v in pipe.transformer.state_dict().items() if k in theirs and theirs[k].shape == v.shape}
        model.load_state_dict(ours, strict=False)
        missing = sorted(set(theirs) - set(ours))
        model.to(pipe.dtype).requires_grad_(False).eval()
        with tempfile.TemporaryDirectory() as tmp:
            Path(tmp, "scheduler_config.json").write_text(json.dumps(
                {"_class_name": "KineticOptimalScheduler", "alpha": SCHEDULER.alpha, "c": SCHEDULER.c,
                 "shift": SCHEDULER.shift, "eps": SCHEDULER.eps}))
            torch.save({"path.emb": pipe.checkpoint.codebook}, Path(tmp, "scheduler_model.pth"))
            scheduler = scheduler_mod.KineticOptimalScheduler.from_pretrained(tmp).to(dev)
        ref = pipeline_mod.URSAPipeline(transformer=model, scheduler=scheduler, vae=_VaeStub(), tokenizer=None)
        ref.set_progress_bar_config(disable=True)
        if compiled:
            policy = pipe.backend.compile_policy()
            if not policy.available:
                return {"available": False, "why": f"no compile here: {policy.detail}"}
            for layer in model.model.layers:
                layer.compile(**policy.torch_compile_kwargs())
        gen = torch.Generator().manual_seed(args.seed)
        cond = torch.randint(0, 1000, (1, TEXT_LEN), generator=gen).to(dev)
        uncond = torch.randint(0, 1000, (1, TEXT_LEN), generator=gen).to(dev)

        def once() -> tuple[float, torch.Tensor]:
            sync(dev)
            t0 = time.perf_counter()
            out = ref(prompt=[""], prompt_ids=cond.clone(), negative_prompt_ids=uncond.clone(), latents_shape=list(latent),
                      num_inference_steps=args.steps, guidance_scale=args.guidance, guidance_trunc=args.guidance_trunc,
                      generator=torch.Generator(device=dev).manual_seed(args.seed), output_type="latent")
            sync(dev)
            return (time.perf_counter() - t0) * 1000.0 / args.steps, out.frames

        t0 = time.perf_counter()
        for _ in range(args.warmup):
            once()
        warm_s = time.perf_counter() - t0
        runs = [once() for _ in range(args.repeat)]
    except Exception as exc:  # noqa: BLE001 - the reference failing is reported, the bench goes on
        return {"available": False, "why": f"diffnext from {where} failed to run ({type(exc).__name__}: {exc})"}
    per_step = sorted(ms for ms, _ in runs)
    return {"available": True, "from": where, "compiled": compiled, "rope_theta_shim": shimmed, "ms_per_step": per_step[len(per_step) // 2],
            "runs_ms_per_step": [ms for ms, _ in runs], "warmup_s": warm_s, "weights_not_copied": missing,
            "tokens": runs[-1][1].reshape(-1).to(torch.int64).cpu()}


def compare_tokens(results: list[BenchResult], tokens: dict[str, torch.Tensor]) -> None:
    """Each variant's tokens against the baseline's (the first) and a compiled one's against its eager twin."""
    base = results[0]
    for r in results:
        r.extra["tokens_equal_baseline"] = bool(torch.equal(tokens[r.name], tokens[base.name]))
        eager = r.name.removesuffix(" + compile")  # a compiled variant against its eager twin (same stream)
        r.extra["tokens_equal_eager"] = (bool(torch.equal(tokens[r.name], tokens[eager]))
                                         if eager != r.name and eager in tokens else None)


def variants(args: argparse.Namespace, backend: Backend) -> list[Variant]:
    exact_off = tuple(n for n in EXACT_OPTIMISATIONS if n != PHILOX_RNG)  # the stream stays the backend's
    out = [Variant("baseline (exact opts off, eager)", disable=exact_off), Variant("optimised (exact)")]
    if backend.fused_kernel("swiglu") is not None:  # CUDA's Triton kernels: the same run with them off
        out.append(Variant("optimised, fused kernels off", kernels="off"))
    if args.compile:
        out.append(Variant("optimised + compile", compile=True, exact=False))
    if backend.random_stream == "philox" and not args.no_host_stream:  # an accelerator: the old host-drawn default
        out.append(Variant("optimised, reference stream", disable=(PHILOX_RNG,), compile=args.compile, exact=False))
    elif args.fast or args.draws or args.gumbel:
        out.append(Variant("optimised + philox-rng", fast=(PHILOX_RNG,), exact=False))
        if args.compile:
            out.append(Variant("optimised + philox-rng + compile", fast=(PHILOX_RNG,), compile=True, exact=False))
    if args.gumbel:  # the Philox stream's other sampler, on any backend (fast names the stream on the CPU)
        out.append(Variant("philox-rng, gumbel-max", fast=(PHILOX_RNG,), exact=False, sampler=GUMBEL_MAX))
        if args.compile:
            out.append(Variant("philox-rng, gumbel-max + compile", fast=(PHILOX_RNG,), compile=True, exact=False,
                               sampler=GUMBEL_MAX))
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", choices=sorted(SIZES), default=None)
    p.add_argument("--tiny", action="store_const", const="tiny", dest="size_flag")
    p.add_argument("--medium", action="store_const", const="medium", dest="size_flag")
    p.add_argument("--res", type=int, default=None, help="image side in pixels (multiple of 16)")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default=None, help="float32 / bfloat16 / float16 (default: float32 on cpu, else fp16)")
    p.add_argument("--compile", action="store_true", help="also time cfg.compile (regional compile)")
    p.add_argument("--compile-mode", default=None,
                   help="Inductor mode for --compile (DIFFORGE_COMPILE_MODE; default: Inductor's default mode)")
    p.add_argument("--fast", action="store_true", help="also time the portable Philox stream (philox-rng) on the CPU")
    p.add_argument("--draws", action="store_true",
                   help="time the random draws, CFG combine and scheduler step per variant (one instrumented run more)")
    p.add_argument("--gumbel", action="store_true",
                   help="also time the Philox stream with its Gumbel-max sampler (the inverse-CDF default's comparison)")
    p.add_argument("--no-reference", action="store_true", help="do not time diffnext even where it imports")
    p.add_argument("--no-host-stream", action="store_true",
                   help="on an accelerator, leave out the host-drawn reference stream's variant (seconds a step)")
    p.add_argument("--steps", type=int, default=None, help="denoising steps per timed run")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs before timing")
    p.add_argument("--repeat", type=int, default=1, help="timed runs (ms/step is their median)")
    p.add_argument("--guidance", type=float, default=7.0)
    p.add_argument("--guidance-trunc", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--flops-only", action="store_true", help="print FLOPs/step (counted on meta) and exit")
    p.add_argument("--json", default=None, help="write results here")
    args = p.parse_args(argv)
    args.size = args.size or args.size_flag or "tiny"
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    size = SIZES[args.size]
    res = args.res or size.res
    if res % 16:
        raise SystemExit(f"--res must be a multiple of 16, got {res}")
    args.steps = args.steps or size.steps
    if args.threads:
        torch.set_num_threads(args.threads)
    flops_info = flops_report(size, res, args.guidance)
    if args.flops_only:
        print(f"{size.name} {res}x{res}: {flops_info['parameters'] / 1e9:.3f} B params, "
              f"{flops_info['sequence_length']} tokens x {flops_info['rows']} rows, "
              f"{flops_info['flops_per_forward'] / 1e12:.2f} TFLOP/forward, "
              f"{flops_info['ms_at_ceiling']:.2f} ms at {flops_info['ceiling_tflops']:.0f} TFLOP/s")
        payload = {"flops": flops_info}
        write_json(args.json, payload)
        return payload

    if args.compile_mode:  # read when the backend first decides its compile policy
        os.environ["DIFFORGE_COMPILE_MODE"] = args.compile_mode
    backend = get_backend(args.device)
    dtype = DTYPES[args.dtype] if args.dtype else (torch.float32 if backend.device.type == "cpu" else torch.float16)
    t0 = time.perf_counter()
    pipe = build_pipeline(size, backend, dtype, args.seed)
    build_s = time.perf_counter() - t0
    latent = (1, res // 16, res // 16)

    results: list[BenchResult] = []
    tokens: dict[str, torch.Tensor] = {}
    head = {
        "benchmark": "ursa", "size": size.name, "res": res, "dtype": str(dtype).removeprefix("torch."),
        "device": str(backend.device), "device_name": backend.device_name(), "steps": args.steps,
        "guidance": args.guidance, "guidance_trunc": args.guidance_trunc, "warmup": args.warmup,
        "repeat": args.repeat, "torch": torch.__version__, "threads": torch.get_num_threads(),
        "build_s": build_s, "flops": flops_info,
    }
    for variant in variants(args, backend):
        result, toks = run_variant(pipe, variant, latent, args)
        results.append(result)
        tokens[variant.name] = toks
        compare_tokens(results, tokens)
        # each finished variant on disk at once: a run stopped at its time cap keeps what it measured
        write_json(args.json, {**head, "partial": True, "baseline": results[0].name, "reference": [],
                               "results": [replace(r) for r in results]})
    base = results[0]
    for r in results:
        r.notes = "exact" if r.notes == "exact" else (
            "another random stream (exact in distribution)" if r.extra["random_stream"] != base.extra["random_stream"]
            else r.notes)
        r.extra["speedup_vs_baseline"] = base.ms_per_step / r.ms_per_step

    title = (f"URSA {size.name} {res}x{res}, {dtype}, {backend.device} ({backend.device_name()}), "
             f"CFG {args.guidance:g}, {args.steps} steps, build {build_s:.1f} s")
    print_table(title, results, baseline=base.name)
    for r in results:
        stream = r.extra["random_stream"] + (f" ({r.extra['philox_sampler']})" if r.extra["philox_sampler"] else "")
        twin = "" if r.extra["tokens_equal_eager"] is None else f", to eager: {r.extra['tokens_equal_eager']}"
        print(f"  {r.name:<34} fwd/step {r.extra['forwards_per_step']:.3f}  stream {stream:<23}  "
              f"tokens equal to baseline: {r.extra['tokens_equal_baseline']}{twin}")
        if "draws" in r.extra:
            d = r.extra["draws"]
            print(f"  {'':<34} instrumented run {d['run_ms_per_step']:.1f} ms/step: random draws "
                  f"{d['draw_ms_per_step']:.1f} ms ({100 * d['draw_share']:.1f} %), CFG combine "
                  f"{d['cfg_ms_per_step']:.1f} ms ({100 * d['cfg_share']:.1f} %), scheduler step "
                  f"{d['sampler_ms_per_step']:.1f} ms ({100 * d['sampler_share']:.1f} %)")
    print("  baseline: difforge's own unoptimised path (exact switches off, eager)")
    references: list[dict[str, Any]] = []
    if args.no_reference:
        print("  reference (diffnext): not timed (--no-reference)")
    else:
        for compiled in (False, True) if args.compile else (False,):
            ref = time_reference(pipe, latent, args, compiled)
            label = "reference (diffnext" + (", decoder layers compiled)" if compiled else ", eager)")
            if not ref["available"]:
                print(f"  {label}: not timed - {ref['why']}")
                references.append(ref)
                break
            ref_tokens = ref.pop("tokens")
            ref["tokens_equal_baseline"] = bool(torch.equal(ref_tokens, tokens[base.name].reshape(-1)))
            ref["ratios"] = {r.name: ref["ms_per_step"] / r.ms_per_step for r in results}
            references.append(ref)
            write_json(args.json, {**head, "partial": True, "baseline": base.name, "reference": references,
                                   "results": [replace(r) for r in results]})
            print(f"  {label}: {ref['ms_per_step']:.1f} ms/step (from {ref['from']}; weights not copied: "
                  f"{len(ref['weights_not_copied'])}; tokens equal to the baseline's: {ref['tokens_equal_baseline']})")
            for r in results:
                print(f"    {r.name:<34} {ref['ratios'][r.name]:.2f}x the reference's speed")
    payload = {**head, "baseline": base.name, "reference": references, "results": [replace(r) for r in results]}
    write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main(sys.argv[1:])
