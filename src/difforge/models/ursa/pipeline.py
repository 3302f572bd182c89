"""URSA text-to-image (and IBQ frame-by-frame video) pipeline: tokens in, discrete flow matching, VQ decode.

``__call__`` reads top to bottom in the reference's stages: check inputs, encode prompts, draw the
initial tokens, denoise, decode.  Both call styles - difforge's ``pipe(cfg, record)`` and the
reference's ``pipe(prompt=..., generator=g)`` - run the same stages; they differ only in what stage 1
makes of their arguments (:class:`URSACall`).  On the CPU in float32 the pipeline reproduces the
reference pipeline's token ids and pixels exactly for the same seed (same draws, same order, same
operation order); the exact speed-ups below are on by default and each can be switched off through
``cfg.disable``:

* ``lm-head-slice``       - lm_head only on the rows the sampler reads (bov .. second-to-last image token)
* ``reuse-first-forward`` - metric path: step 0 (t = 0) cannot move a token, so steps 0 and 1 share one
                            forward and step 0 only advances the random stream
* ``rope-cache``          - the rotary table is built once per call, not once per forward
* ``pinned-draws``        - accelerators: host random draws go to pinned memory, so their copy to the
                            device does not block the host (same numbers)

The random stream is the backend's choice unless the run names one (``philox-rng``, see
:mod:`.sampling`): every accelerator draws on the device from the portable Philox stream (inverse-CDF,
no host draw, no host sync - the same tokens for a seed on every device, not the reference's), the
CPU keeps the reference's own stream; ``--fast philox-rng`` / ``--disable philox-rng`` pick either on
any device (``--fast device-rng`` is the retired name of the first).
Opt-in approximations (``cfg.fast``): ``unguided-tail`` - steps with t >= guidance_trunc run the
conditional half only (u + (c - u) differs from c by an ulp, so a rare draw can flip).
``cfg.compile`` compiles the decoder layer (regional compile, see :mod:`difforge.devices.compile`),
and on the Philox stream the sampler block too; it is exact within floating-point noise, not bit
for bit.  Unasked, an accelerator compiles once the eager steps this process has run (and this call's)
would have paid for the compile (:func:`~difforge.devices.compile.auto_compile`; never on the CPU);
the record's ``compile`` line says which and why.  Compile caches live under ``DIFFORGE_HOME``.

What validation asks of the family (teacher-forced steps, components, FLOPs, operator capture) is
:class:`~.probe.URSAProbe`'s job; the pipeline only exposes the public pieces it is built from.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import PIL.Image
import torch
import torch.nn.functional as F

from ...config import RunConfig
from ...devices import Backend, CompilePolicy, dtype_name
from ...devices.compile import (
    AUTO_SAVED_SHARE,
    CompileCaches,
    CompileChoice,
    auto_compile,
    use_compile_caches,
)
from ...errors import InputError, SizeError
from ...ops import select_ops
from ...runtime.hashes import difforge_home
from ...runtime.philox import BlockFn
from ...runtime.progress import spinner, track
from ...runtime.record import RunRecord
from ...runtime.stages import CFG, timed_stage
from ...runtime.steps import StepTimer
from ..families import URSA
from ..load_defaults import load_inputs
from .call import (
    DEFAULT_STEPS,
    Optimisations,
    ReferenceArgs,
    StepHook,
    TokenState,
    URSACall,
    URSAPipelineOutput,
    check_optimisation_names,
    cpu_copy,
    random_stream,
)
from .config import decoder_torch_dtype
from .loader import URSACheckpoint
from .memory import check_call_memory
from .rope import positions
from .sampling import (
    DEVICE_CHUNK,
    HOST_CHUNK,
    INVERSE_CDF,
    PHILOX_SAMPLERS,
    Draws,
    PhiloxDraws,
    random_codes,
    sampler_block,
)
from .scheduler import DFMScheduler
from .tokenizer import PromptTokenizer, prompt_list
from .transformer import URSATransformer, run_layer
from .ulysses import SequenceShard, check_heads, stretches
from .vae import AutoencoderVQ, to_uint8
from .vae_fsq import FSQConfig


def _phase(record: RunRecord | None, name: str, backend: Backend) -> AbstractContextManager[None]:
    """``record.phase(name)``, or nothing for the reference's call (which records nothing)."""
    return record.phase(name, backend) if record is not None else nullcontext()


class URSAPipeline:
    family: ClassVar[str] = URSA

    def __init__(
        self,
        checkpoint: URSACheckpoint,
        transformer: URSATransformer,
        vae: AutoencoderVQ,
        scheduler: DFMScheduler,
        backend: Backend,
        dtype: torch.dtype,
    ) -> None:
        self.checkpoint = checkpoint
        self.transformer = transformer
        self.vae = vae
        self.scheduler = scheduler
        self.tokenizer: PromptTokenizer = checkpoint.tokenizer
        self.backend = backend
        self.dtype = dtype
        self.device = backend.device
        self._transformer_device = self.device
        self._vae_device = self.device
        self.last_tokens: torch.Tensor | None = None  # (B, T, h, w) int64 on the CPU, from the latest call
        self.last_frames: np.ndarray | None = None  # (B, T, H, W, 3) uint8, from the latest call
        self.compile_policy: CompilePolicy | None = None  # set while the decoder layer is compiled
        #: the Philox stream's categorical sampler (sampling.INVERSE_CDF; GUMBEL_MAX for comparison, not a run switch)
        self.philox_sampler = INVERSE_CDF
        self.sampler_fns: dict[str, BlockFn | None] = {}  # compiled sampler blocks by sampler, while compiled
        #: eager steps run by this pipeline per run shape (see :meth:`compile_key`): (median step s, steps)
        self.eager_steps: dict[str, tuple[float, int]] = {}

    # ------------------------------------------------------------------------------------ loading
    @classmethod
    def from_pretrained(
        cls,
        folder: str | Path,
        backend: Backend | None = None,
        dtype: torch.dtype | None = None,
        cfg: RunConfig | None = None,
        record: RunRecord | None = None,
        op_overrides: dict[str, Callable[..., Any]] | None = None,
    ) -> URSAPipeline:
        """Load a checkpoint folder.  diffusers-style ``URSAPipeline.from_pretrained(path)`` works too:
        the device defaults to ``auto`` and the dtype to float32 on the CPU (the backend's choice elsewhere)."""
        folder, backend, dtype, cfg, record = load = load_inputs(folder, "generate", backend, dtype, cfg, record)
        with load.phase():
            ckpt = URSACheckpoint.read_configs(folder)
            ops = select_ops(backend, op_overrides)
            transformer = ckpt.load_transformer(dtype, backend, record).to(device=backend.device, dtype=dtype)
            transformer.set_ops(ops)
            vae = ckpt.load_vae()
            vae.index_dtype = ops.index_dtype
            vae.encoder, vae.quant_conv = vae.encoder.to(dtype), vae.quant_conv.to(dtype)  # host-side, unused for t2i
            for part in (vae.quantizer, vae.post_quant_conv):
                part.to(device=backend.device, dtype=dtype)
            dec_dtype = decoder_torch_dtype(ckpt.vae_config.decoder_dtype, dtype)
            vae.decoder.to(device=backend.device, dtype=dec_dtype)
            scheduler = ckpt.scheduler().to(backend.device)
        pipe = cls(ckpt, transformer, vae, scheduler, backend, dtype)
        if cfg.offload in ("model", "sequential"):
            pipe.place_vae(torch.device("cpu"))
        ops.record_to(record)
        record.adapt("dtype", dtype_name(dtype), detail="transformer and VAE; scheduler codebook kept float16 like the reference")
        if dec_dtype != dtype:
            record.adapt("vae decoder dtype", dtype_name(dec_dtype), detail="vae/config.json decoder_dtype")
        record.adapt("weights", "safetensors, strict state-dict load", detail=f"classes {ckpt.classes}")
        record.adapt("scheduler_model.pth", "static pickle walk (never unpickled)")
        tcfg = ckpt.transformer_config
        if "head_dim" in tcfg.ignored_keys or "rms_norm_eps" in tcfg.ignored_keys:
            record.extra.setdefault("warnings", []).append(
                "transformer/config.json sets head_dim/rms_norm_eps; ignored like the reference (128, 1e-6)."
            )
        record.extra["ursa_model"] = {
            "transformer": tcfg.to_dict(),
            "scheduler_path": ckpt.scheduler_config.path,
            "codebook_size": scheduler.codebook_size,
            "spatial_stride": ckpt.vae_config.spatial_stride,
            "temporal_stride": ckpt.vae_config.temporal_stride,
            "parameters": sum(p.numel() for p in transformer.parameters()),
        }
        return pipe

    # ------------------------------------------------------------------------------------ placement
    @property
    def transformer_device(self) -> torch.device:
        """Where the transformer's weights are now (the CPU after a call that offloaded it)."""
        return self._transformer_device

    @property
    def vae_device(self) -> torch.device:
        """Where the VAE decoder's weights are now (the CPU between calls with offload "model"/"sequential")."""
        return self._vae_device

    def place_transformer(self, device: torch.device) -> None:
        if self._transformer_device != device:
            self.transformer.to(device)
            self._transformer_device = device

    def place_vae(self, device: torch.device) -> None:
        if self._vae_device != device:
            for part in (self.vae.quantizer, self.vae.post_quant_conv, self.vae.decoder):
                part.to(device)
            self._vae_device = device

    # ------------------------------------------------------------------------------------ inputs
    @property
    def spatial_stride(self) -> int:
        return self.checkpoint.vae_config.spatial_stride

    @property
    def temporal_stride(self) -> int:
        return self.checkpoint.vae_config.temporal_stride

    def latent_shape(self, cfg: RunConfig) -> tuple[int, int, int]:
        """(T, h, w) of the token grid; raises SizeError for sizes the VAE cannot produce exactly."""
        default_height, default_width = self.checkpoint.default_size
        height = default_height if cfg.height is None else int(cfg.height)
        width = default_width if cfg.width is None else int(cfg.width)
        s = self.spatial_stride
        if height <= 0 or width <= 0 or height % s or width % s:
            raise SizeError(f"Height and width must be positive multiples of {s} for this model, got {height}x{width}.")
        frames = int(cfg.num_frames)
        if frames > 1 and not isinstance(self.checkpoint.vae_config, FSQConfig):
            raise SizeError(f"--num-frames {frames}: this is an image checkpoint (its VAE decodes single pictures, "
                            "not video); use --num-frames 1, or a video checkpoint (FSQ VAE).")
        if frames < 1 or (frames - 1) % self.temporal_stride:
            raise SizeError(
                f"num_frames must be 1 plus a multiple of {self.temporal_stride} for this model, got {frames}."
            )
        return (frames - 1) // self.temporal_stride + 1, height // s, width // s

    @staticmethod
    def num_steps(cfg: RunConfig) -> int:
        """Denoising steps of a call (``RunConfig.validate`` has already refused fewer than 2)."""
        return DEFAULT_STEPS if cfg.steps is None else int(cfg.steps)

    def optimisations(self, cfg: RunConfig) -> Optimisations:
        """The switches ``cfg`` asks for on this device; raises InputError for an unknown name."""
        check_optimisation_names(cfg.disable, cfg.fast)
        return Optimisations(
            lm_head_slice="lm-head-slice" not in cfg.disable,
            reuse_first="reuse-first-forward" not in cfg.disable and self.scheduler.is_metric,
            rope_cache="rope-cache" not in cfg.disable,
            pinned_draws="pinned-draws" not in cfg.disable and self.backend.pinned_host_copies,
            unguided_tail="unguided-tail" in cfg.fast,
            random_stream=random_stream(self.backend.random_stream, cfg.disable, cfg.fast),
            stream_named=random_stream("", cfg.disable, cfg.fast) != "",
        )

    def check_inputs(
        self,
        cfg: RunConfig | ReferenceArgs,
        record: RunRecord | None = None,
        images: list[Any] | None = None,
        step_hook: StepHook | None = None,
    ) -> URSACall:
        """Stage 1 of either call: refuse what no run could do (sizes, names, memory) before allocating."""
        args: ReferenceArgs | None = None
        if isinstance(cfg, ReferenceArgs):  # the reference's call: no record, no hook, prompts beside the RunConfig
            args, cfg, record, step_hook = cfg, cfg.run_config(), None, None
            prompt, negative, per_prompt = args.prompt, args.negative_prompt, args.num_images_per_prompt
        else:
            if images:
                raise InputError("URSA here generates from text only; image conditioning is not supported.")
            prompt, negative, per_prompt = cfg.prompt, cfg.negative_prompt, 1
        latent_shape = self.latent_shape(cfg)
        steps = self.num_steps(cfg)
        flags = self.optimisations(cfg)
        check_call_memory(self, cfg, latent_shape, record, batch=len(prompt_list(prompt) or [""]) * per_prompt)
        if args is None:
            generator = self.backend.generator(cfg.seed)
        else:  # the caller's generator, or a fresh one like the reference's
            generator = args.generator if args.generator is not None else self.backend.generator(torch.seed())
        return URSACall(cfg=cfg, prompt=prompt, negative_prompt=negative, latent_shape=latent_shape, steps=steps,
                        flags=flags, generator=generator, per_prompt=per_prompt, record=record, step_hook=step_hook,
                        output_type=None if args is None else args.output_type)

    def encode_prompts(
        self, prompt: str | list[str], negative_prompt: str | list[str] | None, per_prompt: int = 1
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids ``[B, 320]`` of prompts and negatives (missing negative -> ""), repeated per prompt."""
        prompts = prompt_list(prompt) or [""]
        negatives = prompt_list(negative_prompt) or [""]
        if len(negatives) == 1 and len(prompts) > 1:
            negatives = negatives * len(prompts)
        if len(negatives) != len(prompts):
            raise InputError(f"Got {len(prompts)} prompts but {len(negatives)} negative prompts; give one or as many.")
        cond = self.tokenizer.encode(prompts).repeat_interleave(per_prompt, 0)
        uncond = self.tokenizer.encode(negatives).repeat_interleave(per_prompt, 0)
        return cond, uncond

    # ------------------------------------------------------------------------------------ compile
    def set_compile(self, enabled: bool) -> CompilePolicy | None:
        """Compile the decoder layer for this device (or go back to eager); returns the policy in force.

        The compiled function is kept while enabled, so repeated calls reuse its graphs.  A device
        without a usable compiler stays eager and the returned policy says why.
        """
        if not enabled:
            self.transformer.set_layer_fn(None)
            self.compile_policy, self.sampler_fns = None, {}
            return None
        if self.compile_policy is None:
            policy = self.backend.compile_policy()
            if policy.available:
                self.compile_caches()
            self.transformer.set_layer_fn(policy.compile(run_layer))
            # the Philox stream's sampler block (softmax, uniforms, cumulative sums); compiled at first call
            self.sampler_fns = {name: policy.compile(sampler_block(name)) for name in PHILOX_SAMPLERS}
            self.compile_policy = policy
        return self.compile_policy

    @staticmethod
    def compile_caches() -> CompileCaches:
        """Inductor's and Triton's caches under ``DIFFORGE_HOME`` (unless the user set them), before any compile."""
        return use_compile_caches(difforge_home())

    def compile_key(self, call: URSACall) -> str:
        """What a compiled graph is specialised to: model shape, dtype, device, image shape and batch rows."""
        tcfg = self.transformer.config
        rows = len(prompt_list(call.prompt) or [""]) * call.per_prompt * (2 if call.cfg.guidance > 1 else 1)
        return (f"ursa-h{tcfg.hidden_size}-l{tcfg.num_hidden_layers}-v{tcfg.vocab_size}-{dtype_name(self.dtype)}-"
                f"{self.device.type}-{'x'.join(map(str, call.latent_shape))}-r{rows}-torch{torch.__version__}")

    def choose_compile(self, call: URSACall) -> CompileChoice:
        """Whether this call compiles: ``--compile`` does; the reference's call never does; otherwise
        :func:`~difforge.devices.compile.auto_compile` on this pipeline's measured eager steps."""
        cfg = call.cfg
        if cfg.compile:
            return CompileChoice(True, "asked for (--compile)")
        if call.record is None or cfg.parallel not in ("none", "data"):
            return CompileChoice(False, "not asked")
        if self.device.type not in AUTO_SAVED_SHARE:  # never unasked here: no need to decide the policy
            return auto_compile(CompilePolicy(self.device.type, False), None, 0, call.steps, False)
        policy = self.backend.compile_policy()
        if not policy.available:
            return auto_compile(policy, None, 0, call.steps, False)
        if self.compile_policy is not None:  # compiled by an earlier call: its cost is paid
            return CompileChoice(True, "auto: compiled by an earlier call of this pipeline (cost already paid)")
        key = self.compile_key(call)
        step_s, done = self.eager_steps.get(key, (None, 0))
        return auto_compile(policy, step_s, done, call.steps, self.compile_caches().is_warm(key))

    def _after_call(self, call: URSACall, choice: CompileChoice) -> None:
        """Remember this call's eager steps (the auto rule's estimate), or mark its compiled model as cached."""
        record = call.record
        if record is None or not record.step_times_s:
            return
        key = self.compile_key(call)
        if self.compile_policy is not None and self.compile_policy.available:
            caches = self.compile_caches()
            if not caches.is_warm(key):
                caches.mark(key, record.step_times_s[0])  # the first compiled step includes the compile
            return
        times = sorted(record.step_times_s)
        _, done = self.eager_steps.get(key, (None, 0))
        self.eager_steps[key] = (times[len(times) // 2], done + len(times))

    def _record_compile(self, choice: CompileChoice, record: RunRecord) -> None:
        """The compile line of an unasked choice where the auto rule may compile (accelerators)."""
        if choice.reason.startswith("auto:") and self.device.type in AUTO_SAVED_SHARE:
            policy = self.compile_policy
            if policy is not None and policy.available:
                record.adapt("compile", f"{policy.label}: regional (decoder layer), chosen automatically",
                             exact=False, detail=f"{choice.reason}; {policy.detail}; not bit for bit")
            else:
                record.adapt("compile", "eager (auto)", detail=choice.reason)

    def _record_flags(self, flags: Optimisations, record: RunRecord) -> None:
        """Record each switch of the call, and the compile policy :meth:`set_compile` left in force.

        Only records: compiling (or not) is :meth:`set_compile`'s job, done before this is called.
        """
        record.adapt(
            "lm_head rows",
            "sampler rows only" if flags.lm_head_slice else "all positions (reference)",
            detail="disable with 'lm-head-slice'",
        )
        record.adapt(
            "first forward",
            "shared by steps 0 and 1" if flags.reuse_first else "one forward per step (reference)",
            detail="metric path only; disable with 'reuse-first-forward'",
        )
        record.adapt(
            "rope table",
            "built once per call" if flags.rope_cache else "built every forward (reference)",
            detail="disable with 'rope-cache'",
        )
        if self.backend.pinned_host_copies and not flags.philox:  # the Philox stream makes no host draw
            record.adapt(
                "host draws",
                "pinned memory, asynchronous copy" if flags.pinned_draws else "pageable memory (blocking copy)",
                detail="disable with 'pinned-draws'",
            )
        if flags.unguided_tail:
            record.adapt("unguided tail", "cond-only forward when t >= guidance_trunc", exact=False,
                         detail="u + (c - u) differs from c by an ulp")
        self._record_stream(flags, record)
        policy = self.compile_policy
        if policy is not None:
            if policy.available:
                record.adapt("compile", f"{policy.label}: regional (decoder layer)", exact=False,
                             detail=f"{policy.detail}; exact within floating-point noise, not bit for bit")
            else:
                record.adapt("compile", "eager (compile requested)", detail=policy.detail)

    def _record_stream(self, flags: Optimisations, record: RunRecord) -> None:
        """The random stream of the call (always recorded: it decides which tokens a seed gives)."""
        why = "named by the run" if flags.stream_named else f"the {self.backend.name} backend's default"
        if flags.philox:
            fused = " (sampler compiled)" if self.sampler_fns.get(self.philox_sampler) is not None else ""
            record.adapt("random stream", f"philox4x32-10 on {self.device.type}{fused}", detail=(
                f"{why}; the portable stream: {self.philox_sampler} sampling on the device keyed by (seed, step, "
                "position), no host draw or sync, the same tokens on every device up to near-boundary draws - not "
                "the reference's CPU stream ('--disable philox-rng' for that)"))
        else:
            record.adapt("random stream", "reference: CPU torch.Generator, host draws", detail=(
                f"{why}; the reference's own stream, its tokens bit for bit on the CPU in float32"
                + ("" if self.backend.is_host else "; every draw is made on the host and copied, with one host "
                   "sync per step ('--fast philox-rng' draws on the device)")))

    # ------------------------------------------------------------------------------------ denoising
    def forward_logits(
        self, ids: torch.Tensor, pos: torch.Tensor, n_img: int, sliced: bool, rope: object | None = None,
        shard: SequenceShard | None = None,
    ) -> torch.Tensor:
        """Raw logits of the sampler's rows: positions bov .. second-to-last image token (``shard``: ``--parallel
        ulysses=N``, this rank's stretch of positions, the same logits on every rank)."""
        length = ids.shape[1]
        rows = slice(length - n_img - 1, length - 1)
        with torch.no_grad():
            if sliced:
                return self.transformer(ids, pos, logits_slice=rows, rope=rope, shard=shard)
            return self.transformer(ids, pos, rope=rope, shard=shard)[:, rows]

    def image_ids(self, cond_ids: torch.Tensor, uncond_ids: torch.Tensor, codes: torch.Tensor,
                  guided: bool) -> torch.Tensor:
        """The transformer input ``[text | bov | codes]`` where ``codes`` ``[B, N]`` are, the unconditional
        half stacked below when guided."""
        tcfg = self.transformer.config
        img = F.pad(codes + tcfg.lm_vocab_size, (1, 0), value=tcfg.bov_token_id)
        ids = torch.cat([cond_ids.to(codes.device), img], 1)
        if guided:
            ids = torch.cat([ids, torch.cat([uncond_ids.to(codes.device), img], 1)])
        return ids

    @staticmethod
    @timed_stage(CFG)
    def guide(raw: torch.Tensor, scale: float) -> torch.Tensor:
        """``u + (c - u) * scale`` of stacked [cond; uncond] logits, in place in the reference's operation order."""
        cond, uncond = raw.chunk(2)
        return uncond.add_(cond.sub_(uncond).mul_(scale))

    @torch.no_grad()
    def prepare_tokens(
        self,
        cond_ids: torch.Tensor,
        uncond_ids: torch.Tensor,
        latent_shape: tuple[int, int, int],
        generator: torch.Generator,
        flags: Optimisations,
        guided: bool,
    ) -> TokenState:
        """Stage 3: uniformly random initial codes (the reference's first draw), the random stream of the
        steps, positions and the rotary table."""
        dev = self.device
        batch, text_len = cond_ids.shape
        if flags.philox:  # keyed by the generator's seed: cfg.seed for difforge's call
            fn = self.sampler_fns.get(self.philox_sampler)
            chunk = DEVICE_CHUNK if fn is not None or not self.backend.is_host else HOST_CHUNK
            # the host draws only the jumping rows (no device to sync with); compiled blocks keep static shapes
            ph = PhiloxDraws(generator.initial_seed(), dev, chunk, fn, sparse=self.backend.is_host and fn is None,
                             sampler=self.philox_sampler)
            x = ph.codes((batch, math.prod(latent_shape)), self.scheduler.codebook_size)
            draws = Draws(philox=ph)
        else:
            x = random_codes((batch, *latent_shape), self.scheduler.codebook_size, dev, generator).flatten(1)
            draws = Draws(generator, pin=flags.pinned_draws)
        pos = positions(latent_shape, text_len).to(dev)
        rope = self.transformer.rope(pos) if flags.rope_cache else None
        return TokenState(x, self.image_ids(cond_ids, uncond_ids, x, guided), pos, rope, draws, latent_shape, guided)

    @torch.no_grad()
    def denoise(
        self,
        state: TokenState,
        steps: int,
        guidance: float,
        guidance_trunc: float,
        flags: Optimisations,
        record: RunRecord | None = None,
        step_hook: StepHook | None = None,
        quiet: bool = True,
        split: Any = None,
        shard: SequenceShard | None = None,
    ) -> torch.Tensor:
        """Stage 4: the sampler's steps from ``state``; returns ``[B, T*h*w]`` int64 codes on the device.

        ``split`` (``--parallel cfg``): the group (``.rank``, ``.all_gather``) whose rank 0 runs the
        conditional half of the CFG batch and rank 1 the unconditional half; one all-gather of the
        logits per guided step rebuilds the stacked ``[cond; uncond]`` logits on both ranks, which then
        combine and sample alike (the same seed, the same draws), so their codes stay identical.
        ``shard`` (``--parallel ulysses=N``): every forward runs on this rank's stretch of positions
        (:mod:`.ulysses`) and gives every rank the same logits.
        """
        x, ids, batch, n_img = state.x, state.ids, state.batch, state.n_img
        k = self.scheduler.codebook_size
        offset = self.transformer.config.lm_vocab_size
        use_cfg = state.guided
        timer = StepTimer(self.backend)
        timer.start()
        forwards, saved = 0.0, None
        for i in track(range(steps), total=steps, description="denoise", quiet=quiet):
            t = self.scheduler.t(i, steps)
            scale = guidance if t < guidance_trunc else 1
            before = cpu_copy(x) if step_hook is not None else None
            tail = use_cfg and scale == 1 and flags.unguided_tail
            if flags.reuse_first and i == 1 and saved is not None:
                raw, saved, tail = saved, None, False
            else:
                raw = self._logits(ids[:batch] if tail else ids, state, flags, split if use_cfg and not tail else None,
                                   shard)
                forwards += 0.5 if tail else 1.0
            skip = flags.reuse_first and i == 0
            if skip:
                saved = raw
            if use_cfg and not tail:
                if skip:  # raw is reused by step 1: combine out of place, and only for the hook
                    cond, uncond = raw.chunk(2)
                    z = uncond + (cond - uncond) * scale if step_hook is not None else None
                else:
                    z = self.guide(raw, scale)
            else:
                z = raw.clone() if skip and step_hook is not None else raw
            z_out = cpu_copy(z, torch.float32) if step_hook is not None and z is not None else None
            if skip:
                self.scheduler.skip_first_step((batch, n_img, k), raw.dtype, state.draws)
            else:
                x = self.scheduler.step(z, i, steps, x, state.draws)
            if step_hook is not None:
                step_hook(i, {"tokens": before}, {"logits": z_out, "tokens": cpu_copy(x)})
            ids.view(-1, batch, ids.shape[1])[..., -n_img:] = x + offset  # both CFG halves
            timer.mark()
        if record is not None:
            text_len = ids.shape[1] - 1 - n_img
            record.step_times_s = timer.durations()
            record.extra["ursa"] = {
                "batch": batch,
                "forward_rows": batch * (2 if use_cfg and split is None else 1),
                "text_tokens": text_len,
                "image_tokens": n_img,
                "sequence_length": text_len + 1 + n_img,
                "latent_shape": list(state.latent_shape),
                "steps": steps,
                "forwards": forwards,
                "forwards_per_step": forwards / steps,
                "scheduler_path": "metric" if self.scheduler.is_metric else "mixture",
                "random_stream": "philox" if state.draws.philox is not None else "reference",
                "guided_steps": sum(self.scheduler.t(i, steps) < guidance_trunc for i in range(steps)) if use_cfg else 0,
            }
            if split is not None:
                record.extra["ursa"]["cfg_parallel"] = {"rank": split.rank, "half": "cond" if split.rank == 0 else "uncond"}
            if shard is not None:
                record.extra["ursa"]["ulysses"] = {"ranks": shard.world, "positions": list(shard.sizes),
                                                   "rank": shard.group.rank}
        return x

    def _logits(self, ids: torch.Tensor, state: TokenState, flags: Optimisations, split: Any,
                shard: SequenceShard | None = None) -> torch.Tensor:
        """The step's logits of ``ids``; with ``split``, this rank's half of the CFG batch (one batch-B forward,
        rank 0 the conditional rows) and the other half from the all-gather: the stacked ``[cond; uncond]``."""
        if split is None:
            return self.forward_logits(ids, state.pos, state.n_img, flags.lm_head_slice, state.rope, shard)
        half = ids.shape[0] // 2
        mine = ids[:half] if split.rank == 0 else ids[half:]
        cond, uncond = split.all_gather(self.forward_logits(mine, state.pos, state.n_img, flags.lm_head_slice, state.rope))
        return torch.cat([cond, uncond])

    def generate_tokens(
        self,
        cond_ids: torch.Tensor,
        uncond_ids: torch.Tensor,
        latent_shape: tuple[int, int, int],
        steps: int,
        guidance: float,
        guidance_trunc: float,
        generator: torch.Generator,
        flags: Optimisations,
        record: RunRecord | None = None,
        step_hook: StepHook | None = None,
        quiet: bool = True,
    ) -> torch.Tensor:
        """Stages 3 and 4 on given prompt ids (what the benchmark times): ``[B, T*h*w]`` codes on the device."""
        state = self.prepare_tokens(cond_ids, uncond_ids, latent_shape, generator, flags, guidance > 1)
        return self.denoise(state, steps, guidance, guidance_trunc, flags, record, step_hook, quiet)

    # ------------------------------------------------------------------------------------ decoding
    def decode_tokens(self, tokens: torch.Tensor) -> np.ndarray:
        """``[B, T, h, w]`` codes -> ``[B, T, H, W, 3]`` uint8, one sample per VAE call like the reference."""
        frames = []
        with torch.no_grad():
            for b in range(tokens.shape[0]):
                x = self.vae.decode(tokens[b : b + 1].to(self._vae_device))
                x = x if x.dim() == 5 else x.unsqueeze(2)
                frames.append(to_uint8(x).cpu())
        return torch.cat(frames).numpy()

    def decode(self, call: URSACall, tokens: torch.Tensor) -> np.ndarray:
        """Stage 5: the offload plan's moves around the VAE decode (the reference's call decodes where the VAE is)."""
        cfg, record = call.cfg, call.record
        if record is None:
            return self.decode_tokens(tokens)
        if cfg.offload != "none":
            self.place_transformer(torch.device("cpu"))
            self.backend.empty_cache()
            record.adapt("offload", f"{cfg.offload}: transformer moved to cpu before decode",
                         detail="VAE kept on cpu between calls" if cfg.offload in ("model", "sequential") else "")
        with record.phase("decode", self.backend), spinner("decoding", cfg.quiet):
            self.place_vae(self.device)
            frames = self.decode_tokens(tokens)
            if cfg.offload in ("model", "sequential"):
                self.place_vae(torch.device("cpu"))
        return frames

    # ------------------------------------------------------------------------------------ the call
    def _seq_group(self, cfg: RunConfig, record: RunRecord | None) -> Any:
        """``--parallel ulysses=N``: the group the sequence is split over (None otherwise)."""
        if not cfg.parallel.startswith("ulysses"):
            return None
        from ...runtime.parallel import seq_split

        group = seq_split()
        tcfg = self.transformer.config
        check_heads(tcfg.num_attention_heads, tcfg.num_key_value_heads, group.world_size)
        if cfg.compile:
            raise InputError("--parallel ulysses=N runs its all-to-alls inside each decoder layer, which the "
                             "regional compile cannot trace; drop --compile.")
        return group

    def _shard(self, group: Any, state: TokenState, flags: Optimisations, record: RunRecord | None) -> SequenceShard:
        """This call's split of the sequence over ``group`` (its stretch's rotary table built once with rope-cache)."""
        tcfg = self.transformer.config
        shard = SequenceShard(group, stretches(state.ids.shape[1], group.world_size), tcfg.num_attention_heads,
                              tcfg.num_key_value_heads)
        if flags.rope_cache:
            lo, hi = shard.bounds
            shard.rope = self.transformer.rope(state.pos[lo:hi])
        if record is not None:
            record.adapt("attention", f"ulysses: sequence split over {shard.world} ranks "
                         f"({'+'.join(map(str, shard.sizes))} positions), heads by all-to-all per layer "
                         f"({group.dist_backend})")
        return shard

    @staticmethod
    def _cfg_split(cfg: RunConfig, record: RunRecord | None) -> Any:
        """``--parallel cfg``: the group the CFG batch's two halves are split over (None otherwise)."""
        if cfg.parallel != "cfg":
            return None
        from ...runtime.parallel import cfg_split

        if not cfg.guidance > 1:
            raise InputError("--parallel cfg splits the CFG batch's two halves over two ranks; this run has no CFG "
                             "(--guidance must be above 1).")
        split = cfg_split()
        if record is not None:
            record.adapt("CFG", f"cfg-parallel: conditional half on rank 0, unconditional on rank 1 "
                         f"({split.dist_backend}, one all-gather of the logits per guided step)")
        return split

    def __call__(
        self,
        cfg: RunConfig | str | list[str] | None = None,
        record: RunRecord | None = None,
        images: list[Any] | None = None,
        step_hook: StepHook | None = None,
        **kwargs: Any,
    ) -> Any:
        """difforge's contract: ``pipe(cfg, record)`` -> PIL images (one per frame), filling the RunRecord.

        The reference's call is accepted too: ``pipe(prompt="...", generator=g, output_type="np")`` (or
        the prompt as first argument) takes the keywords of :class:`ReferenceArgs` and returns
        :class:`URSAPipelineOutput`.  It records nothing, never compiles and has no offload plan (the
        VAE decodes where it is); with the same checkpoint, arguments and ``torch.Generator().manual_seed(s)``
        on the CPU in float32 it gives the reference's token ids and uint8 frames.
        """
        # 1. check inputs
        if isinstance(cfg, RunConfig):
            call = self.check_inputs(cfg, record if record is not None else RunRecord(kind="generate"), images, step_hook)
        else:
            if cfg is not None:
                kwargs["prompt"] = cfg
            call = self.check_inputs(ReferenceArgs(**kwargs))
        cfg, record = call.cfg, call.record
        choice = self.choose_compile(call)
        self.set_compile(choice.compile)  # the one place compile is switched (the reference's call never asks)
        if record is not None:
            self._record_flags(call.flags, record)
            self._record_compile(choice, record)
        split = self._cfg_split(cfg, record)
        seq_group = self._seq_group(cfg, record)
        self.place_transformer(self.device)

        # 2. encode prompts
        with _phase(record, "encode", self.backend):
            cond, uncond = self.encode_prompts(call.prompt, call.negative_prompt, per_prompt=call.per_prompt)

        with _phase(record, "denoise", self.backend):
            # 3. prepare tokens
            state = self.prepare_tokens(cond, uncond, call.latent_shape, call.generator, call.flags, cfg.guidance > 1)
            shard = self._shard(seq_group, state, call.flags, record) if seq_group is not None else None
            # 4. denoise
            x = self.denoise(state, call.steps, cfg.guidance, cfg.guidance_trunc, call.flags, record, call.step_hook,
                             quiet=cfg.quiet, split=split, shard=shard)
        tokens = x.view(-1, *call.latent_shape).cpu()
        self.last_tokens = tokens
        self._after_call(call, choice)
        if call.output_type == "latent":
            return URSAPipelineOutput(frames=tokens)

        # 5. decode
        frames = self.decode(call, tokens)
        self.last_frames = frames
        if call.output_type is None:
            return [PIL.Image.fromarray(f) for f in frames.reshape(-1, *frames.shape[2:])]
        if call.latent_shape[0] == 1 and frames.shape[1] == 1:
            frames = frames[:, 0]
            if call.output_type == "pil":
                return URSAPipelineOutput(frames=[PIL.Image.fromarray(f) for f in frames])
        return URSAPipelineOutput(frames=frames)  # video is always returned as an array, like the reference

    def generate(self, prompt: str | list[str] = "", **kwargs: Any) -> URSAPipelineOutput:
        """The reference pipeline's call, argument for argument: the keywords of :class:`ReferenceArgs`."""
        result: URSAPipelineOutput = self(prompt, **kwargs)
        return result
