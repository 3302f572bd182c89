"""URSA text-to-image (and IBQ frame-by-frame video) pipeline: tokens in, discrete flow matching, VQ decode.

``__call__`` reads top to bottom in the reference's stages: check inputs, encode prompts, draw the
initial tokens, denoise, decode.  On the CPU in float32 it reproduces the reference pipeline's token
ids and pixels exactly for the same seed (same draws, same order, same operation order); the exact
speed-ups below are on by default and each can be switched off through ``cfg.disable``:

* ``lm-head-slice``       - lm_head only on the rows the sampler reads (bov .. second-to-last image token)
* ``reuse-first-forward`` - metric path: step 0 (t = 0) cannot move a token, so steps 0 and 1 share one
                            forward and step 0 only advances the random stream
* ``rope-cache``          - the rotary table is built once per call, not once per forward
* ``pinned-draws``        - accelerators: host random draws go to pinned memory, so their copy to the
                            device does not block the host (same numbers)
Opt-in approximations (``cfg.fast``): ``unguided-tail`` - steps with t >= guidance_trunc run the
conditional half only (u + (c - u) differs from c by an ulp, so a rare draw can flip);
``device-rng`` - random draws from a generator on the run device and a sync-free jump step (same
distributions, another random stream; on accelerators this removes the per-step host sampling that
otherwise dominates the step).  ``cfg.compile`` compiles the decoder layer (regional compile, see
:mod:`difforge.devices.compile`); it is exact within floating-point noise, not bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import PIL.Image
import torch
import torch.nn.functional as F

from ...config import RunConfig
from ...devices import Backend, CompilePolicy, dtype_name
from ...errors import InputError, SizeError, StepsError
from ...ops import select_ops
from ...runtime.progress import track
from ...runtime.record import RunRecord
from ...runtime.steps import StepTimer
from ..load_defaults import load_defaults
from .loader import URSACheckpoint
from .rope import positions
from .sampling import Draws, device_generator, random_codes
from .scheduler import DFMScheduler
from .tokenizer import PromptTokenizer
from .transformer import URSATransformer, run_layer
from .vae import AutoencoderVQ, to_uint8

DEFAULT_HEIGHT, DEFAULT_WIDTH, DEFAULT_STEPS = 320, 512, 25
EXACT_OPTIMISATIONS = ("lm-head-slice", "reuse-first-forward", "rope-cache", "pinned-draws")
FAST_OPTIMISATIONS = ("unguided-tail", "device-rng")

StepHook = Callable[[int, dict[str, torch.Tensor], dict[str, torch.Tensor]], None]


def _as_list(text: str | list[str] | tuple[str, ...] | None) -> list[str] | None:
    if text is None:
        return None
    return [text] if isinstance(text, str | bytes) else list(text)  # bytes: one (bad) prompt, not a list of ints


def _cpu_copy(x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A CPU tensor that owns its memory (``.cpu()`` on a CPU tensor would alias it)."""
    return x.detach().to("cpu", dtype or x.dtype, copy=True)


def step_seed(seed: int, i: int) -> int:
    """Seed of the generator used by :meth:`URSAPipeline.forward_step` at step ``i``."""
    return (int(seed) * 1_000_003 + int(i)) % (2**63 - 1)


@dataclass
class URSAPipelineOutput:
    """What the diffusers-style call returns: ``frames`` as PIL images, a uint8 array or token ids."""

    frames: Any


class URSAPipeline:
    family: ClassVar[str] = "ursa"

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
        folder = Path(folder)
        backend, dtype, cfg, record = load_defaults(folder, "generate", backend, dtype, cfg, record)
        with record.phase("load", backend):
            ckpt = URSACheckpoint.read_configs(folder)
            ops = select_ops(backend, op_overrides)
            transformer = ckpt.load_transformer(dtype, backend, record).to(device=backend.device, dtype=dtype)
            transformer.set_ops(ops)
            vae = ckpt.load_vae()
            vae.index_dtype = ops.index_dtype
            vae.encoder, vae.quant_conv = vae.encoder.to(dtype), vae.quant_conv.to(dtype)  # host-side, unused for t2i
            for part in (vae.quantizer, vae.post_quant_conv):
                part.to(device=backend.device, dtype=dtype)
            dec_dtype = getattr(torch, ckpt.vae_config.decoder_dtype) if ckpt.vae_config.decoder_dtype else dtype
            vae.decoder.to(device=backend.device, dtype=dec_dtype)
            scheduler = ckpt.scheduler().to(backend.device)
        pipe = cls(ckpt, transformer, vae, scheduler, backend, dtype)
        if cfg.offload in ("model", "sequential"):
            pipe._move_vae(torch.device("cpu"))
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
    def _move_transformer(self, device: torch.device) -> None:
        if self._transformer_device != device:
            self.transformer.to(device)
            self._transformer_device = device

    def _move_vae(self, device: torch.device) -> None:
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
        height = DEFAULT_HEIGHT if cfg.height is None else int(cfg.height)
        width = DEFAULT_WIDTH if cfg.width is None else int(cfg.width)
        s = self.spatial_stride
        if height <= 0 or width <= 0 or height % s or width % s:
            raise SizeError(f"Height and width must be positive multiples of {s} for this model, got {height}x{width}.")
        frames = int(cfg.num_frames)
        if frames < 1 or (frames - 1) % self.temporal_stride:
            raise SizeError(
                f"num_frames must be 1 plus a multiple of {self.temporal_stride} for this model, got {frames}."
            )
        return (frames - 1) // self.temporal_stride + 1, height // s, width // s

    @staticmethod
    def num_steps(cfg: RunConfig) -> int:
        steps = DEFAULT_STEPS if cfg.steps is None else int(cfg.steps)
        if steps < 2:
            raise StepsError(f"URSA needs at least 2 denoising steps, got {steps}.")
        return steps

    def encode_prompts(
        self, prompt: str | list[str], negative_prompt: str | list[str] | None, per_prompt: int = 1
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids ``[B, 320]`` of prompts and negatives (missing negative -> ""), repeated per prompt."""
        prompts = _as_list(prompt) or [""]
        negatives = _as_list(negative_prompt) or [""]
        if len(negatives) == 1 and len(prompts) > 1:
            negatives = negatives * len(prompts)
        if len(negatives) != len(prompts):
            raise InputError(f"Got {len(prompts)} prompts but {len(negatives)} negative prompts; give one or as many.")
        cond = self.tokenizer.encode(prompts).repeat_interleave(per_prompt, 0)
        uncond = self.tokenizer.encode(negatives).repeat_interleave(per_prompt, 0)
        return cond, uncond

    def _flags(self, cfg: RunConfig) -> dict[str, bool]:
        unknown = sorted(set(cfg.disable) - set(EXACT_OPTIMISATIONS)) + sorted(set(cfg.fast) - set(FAST_OPTIMISATIONS))
        if unknown:
            known = ", ".join(EXACT_OPTIMISATIONS + FAST_OPTIMISATIONS)
            raise InputError(f"Unknown URSA optimisation name '{unknown[0]}'; known names are {known}.")
        return {
            "lm_head_slice": "lm-head-slice" not in cfg.disable,
            "reuse_first": "reuse-first-forward" not in cfg.disable and self.scheduler.is_metric,
            "rope_cache": "rope-cache" not in cfg.disable,
            "pinned_draws": "pinned-draws" not in cfg.disable and self.backend.pinned_host_copies,
            "unguided_tail": "unguided-tail" in cfg.fast,
            "device_rng": "device-rng" in cfg.fast,
        }

    # ------------------------------------------------------------------------------------ compile
    def set_compile(self, enabled: bool) -> CompilePolicy | None:
        """Compile the decoder layer for this device (or go back to eager); returns the policy in force.

        The compiled function is kept while enabled, so repeated calls reuse its graphs.  A device
        without a usable compiler stays eager and the returned policy says why.
        """
        if not enabled:
            self.transformer.set_layer_fn(None)
            self.compile_policy = None
            return None
        if self.compile_policy is None:
            policy = self.backend.compile_policy()
            self.transformer.set_layer_fn(policy.compile(run_layer))
            self.compile_policy = policy
        return self.compile_policy

    # ------------------------------------------------------------------------------------ denoising
    def _forward(
        self, ids: torch.Tensor, pos: torch.Tensor, n_img: int, sliced: bool, rope: object | None = None
    ) -> torch.Tensor:
        """Raw logits of the sampler's rows: positions bov .. second-to-last image token."""
        length = ids.shape[1]
        rows = slice(length - n_img - 1, length - 1)
        with torch.no_grad():
            if sliced:
                return self.transformer(ids, pos, logits_slice=rows, rope=rope)
            return self.transformer(ids, pos, rope=rope)[:, rows]

    @torch.no_grad()
    def generate_tokens(
        self,
        cond_ids: torch.Tensor,
        uncond_ids: torch.Tensor,
        latent_shape: tuple[int, int, int],
        steps: int,
        guidance: float,
        guidance_trunc: float,
        generator: torch.Generator,
        cfg: RunConfig,
        record: RunRecord | None = None,
        step_hook: StepHook | None = None,
        quiet: bool = True,
    ) -> torch.Tensor:
        """Denoise from uniformly random codes; returns ``[B, T*h*w]`` int64 codes on the device."""
        flags = self._flags(cfg)
        dev, tcfg = self.device, self.transformer.config
        batch, text_len = cond_ids.shape
        n_img = math.prod(latent_shape)
        k = self.scheduler.codebook_size
        x = random_codes((batch, *latent_shape), k, dev, generator).flatten(1)
        if flags["device_rng"]:
            draws = Draws(device_generator(dev, generator), on_device=True)
        else:
            draws = Draws(generator, pin=flags["pinned_draws"])
        pos = positions(latent_shape, text_len).to(dev)
        rope = self.transformer.rope(pos) if flags["rope_cache"] else None
        use_cfg = guidance > 1
        img = F.pad(x + tcfg.lm_vocab_size, (1, 0), value=tcfg.bov_token_id)
        ids = torch.cat([cond_ids.to(dev), img], 1)
        if use_cfg:
            ids = torch.cat([ids, torch.cat([uncond_ids.to(dev), img], 1)])
        timer = StepTimer(self.backend)
        timer.start()
        forwards, saved = 0.0, None
        for i in track(range(steps), total=steps, description="denoise", quiet=quiet):
            t = self.scheduler.t(i, steps)
            scale = guidance if t < guidance_trunc else 1
            before = _cpu_copy(x) if step_hook is not None else None
            tail = use_cfg and scale == 1 and flags["unguided_tail"]
            if flags["reuse_first"] and i == 1 and saved is not None:
                raw, saved, tail = saved, None, False
            else:
                raw = self._forward(ids[:batch] if tail else ids, pos, n_img, flags["lm_head_slice"], rope)
                forwards += 0.5 if tail else 1.0
            skip = flags["reuse_first"] and i == 0
            if skip:
                saved = raw
            if use_cfg and not tail:
                cond, uncond = raw.chunk(2)
                if skip:
                    z = uncond + (cond - uncond) * scale if step_hook is not None else None
                else:
                    z = uncond.add_(cond.sub_(uncond).mul_(scale))
            else:
                z = raw.clone() if skip and step_hook is not None else raw
            z_out = _cpu_copy(z, torch.float32) if step_hook is not None and z is not None else None
            if skip:
                self.scheduler.skip_first_step((batch, n_img, k), raw.dtype, draws)
            else:
                x = self.scheduler.step(z, i, steps, x, draws)
            if step_hook is not None:
                step_hook(i, {"tokens": before}, {"logits": z_out, "tokens": _cpu_copy(x)})
            ids.view(-1, batch, ids.shape[1])[..., -n_img:] = x + tcfg.lm_vocab_size  # both CFG halves
            timer.mark()
        if record is not None:
            record.step_times_s = timer.durations()
            record.extra["ursa"] = {
                "batch": batch,
                "forward_rows": batch * (2 if use_cfg else 1),
                "text_tokens": text_len,
                "image_tokens": n_img,
                "sequence_length": text_len + 1 + n_img,
                "latent_shape": list(latent_shape),
                "steps": steps,
                "forwards": forwards,
                "forwards_per_step": forwards / steps,
                "scheduler_path": "metric" if self.scheduler.is_metric else "mixture",
                "guided_steps": sum(self.scheduler.t(i, steps) < guidance_trunc for i in range(steps)) if use_cfg else 0,
            }
        return x

    def _record_flags(self, cfg: RunConfig, record: RunRecord) -> None:
        flags = self._flags(cfg)
        record.adapt(
            "lm_head rows",
            "sampler rows only" if flags["lm_head_slice"] else "all positions (reference)",
            detail="disable with 'lm-head-slice'",
        )
        record.adapt(
            "first forward",
            "shared by steps 0 and 1" if flags["reuse_first"] else "one forward per step (reference)",
            detail="metric path only; disable with 'reuse-first-forward'",
        )
        record.adapt(
            "rope table",
            "built once per call" if flags["rope_cache"] else "built every forward (reference)",
            detail="disable with 'rope-cache'",
        )
        if self.backend.pinned_host_copies:
            record.adapt(
                "host draws",
                "pinned memory, asynchronous copy" if flags["pinned_draws"] else "pageable memory (blocking copy)",
                detail="disable with 'pinned-draws'",
            )
        if flags["unguided_tail"]:
            record.adapt("unguided tail", "cond-only forward when t >= guidance_trunc", exact=False,
                         detail="u + (c - u) differs from c by an ulp")
        if flags["device_rng"]:
            record.adapt("random stream", f"generator on {self.device.type}, sync-free jump step", exact=False,
                         detail="same distributions, not the reference's CPU stream; opt in with fast 'device-rng'")
        policy = self.set_compile(cfg.compile)
        if policy is not None:
            if policy.available:
                record.adapt("compile", f"{policy.label}: regional (decoder layer)", exact=False,
                             detail=f"{policy.detail}; exact within floating-point noise, not bit for bit")
            else:
                record.adapt("compile", "eager (compile requested)", detail=policy.detail)

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

    # ------------------------------------------------------------------------------------ the call
    def __call__(
        self,
        cfg: RunConfig | str | list[str] | None = None,
        record: RunRecord | None = None,
        images: list[Any] | None = None,
        step_hook: StepHook | None = None,
        **kwargs: Any,
    ) -> Any:
        """difforge's contract: ``pipe(cfg, record)`` -> PIL images, filling the RunRecord.

        diffusers / reference style is accepted too: ``pipe(prompt="...", generator=g, output_type="np")``
        (or the prompt as first argument) returns :class:`URSAPipelineOutput` - see :meth:`generate`.
        """
        if not isinstance(cfg, RunConfig):
            if cfg is not None:
                kwargs["prompt"] = cfg
            return self.generate(**kwargs)
        return self._run(cfg, record if record is not None else RunRecord(kind="generate"), images, step_hook)

    def generate(
        self,
        prompt: str | list[str] = "",
        negative_prompt: str | list[str] | None = None,
        height: int = DEFAULT_HEIGHT,
        width: int = DEFAULT_WIDTH,
        num_frames: int = 1,
        num_inference_steps: int = DEFAULT_STEPS,
        guidance_scale: float = 7.0,
        guidance_trunc: float = 0.9,
        num_images_per_prompt: int = 1,
        generator: torch.Generator | None = None,
        output_type: str = "pil",
        disable: tuple[str, ...] = (),
        fast: tuple[str, ...] = (),
    ) -> URSAPipelineOutput:
        """The reference pipeline's call, argument for argument.

        With the same checkpoint, arguments and ``torch.Generator().manual_seed(s)`` on the CPU in
        float32 this gives the reference's token ids and uint8 frames.  ``output_type``: "pil" (one
        image per frame), "np" (uint8 ``[B, H, W, 3]``, or ``[B, T, H, W, 3]`` for video) or
        "latent" (token ids ``[B, T, h, w]``).
        """
        if output_type not in ("pil", "np", "latent"):
            raise InputError(f"output_type must be 'pil', 'np' or 'latent', got {output_type!r}.")
        cfg = RunConfig(model="", height=height, width=width, num_frames=num_frames, steps=num_inference_steps,
                        guidance=guidance_scale, guidance_trunc=guidance_trunc, disable=list(disable),
                        fast=list(fast), quiet=True)
        latent_shape = self.latent_shape(cfg)
        steps = self.num_steps(cfg)
        self._flags(cfg)
        from .memory import check_call_memory  # the same refusal as pipe(cfg): before anything is allocated

        check_call_memory(self, cfg, latent_shape, None, batch=len(_as_list(prompt) or [""]) * num_images_per_prompt)
        self.set_compile(False)  # this call promises the reference's exact arithmetic
        generator = generator if generator is not None else torch.Generator().manual_seed(torch.seed())
        self._move_transformer(self.device)
        cond, uncond = self.encode_prompts(prompt, negative_prompt, per_prompt=num_images_per_prompt)
        x = self.generate_tokens(cond, uncond, latent_shape, steps, guidance_scale, guidance_trunc, generator, cfg)
        tokens = x.view(-1, *latent_shape).cpu()
        self.last_tokens = tokens
        if output_type == "latent":
            return URSAPipelineOutput(frames=tokens)
        frames = self.decode_tokens(tokens)
        self.last_frames = frames
        if latent_shape[0] == 1 and frames.shape[1] == 1:
            frames = frames[:, 0]
            if output_type == "pil":
                return URSAPipelineOutput(frames=[PIL.Image.fromarray(f) for f in frames])
        return URSAPipelineOutput(frames=frames)  # video is always returned as an array, like the reference

    def _run(
        self,
        cfg: RunConfig,
        record: RunRecord,
        images: list[Any] | None = None,
        step_hook: StepHook | None = None,
    ) -> list[PIL.Image.Image]:
        # 1. Check inputs
        if images:
            raise InputError("URSA here generates from text only; image conditioning is not supported.")
        latent_shape = self.latent_shape(cfg)
        steps = self.num_steps(cfg)
        self._flags(cfg)
        from .memory import check_call_memory  # refuse a size that cannot fit, before allocating

        check_call_memory(self, cfg, latent_shape, record)
        self._record_flags(cfg, record)
        generator = self.backend.generator(cfg.seed)
        self._move_transformer(self.device)

        # 2. Encode prompts
        with record.phase("encode", self.backend):
            cond, uncond = self.encode_prompts(cfg.prompt, cfg.negative_prompt)

        # 3-4. Initial tokens and denoising
        with record.phase("denoise", self.backend):
            x = self.generate_tokens(
                cond, uncond, latent_shape, steps, cfg.guidance, cfg.guidance_trunc, generator, cfg,
                record=record, step_hook=step_hook, quiet=cfg.quiet,
            )
        tokens = x.view(-1, *latent_shape).cpu()
        self.last_tokens = tokens

        # 5. Decode
        if cfg.offload != "none":
            self._move_transformer(torch.device("cpu"))
            self.backend.empty_cache()
            record.adapt("offload", f"{cfg.offload}: transformer moved to cpu before decode",
                         detail="VAE kept on cpu between calls" if cfg.offload in ("model", "sequential") else "")
        with record.phase("decode", self.backend):
            self._move_vae(self.device)
            frames = self.decode_tokens(tokens)
            if cfg.offload in ("model", "sequential"):
                self._move_vae(torch.device("cpu"))
        self.last_frames = frames
        return [PIL.Image.fromarray(f) for f in frames.reshape(-1, *frames.shape[2:])]

    # ------------------------------------------------------------------------------------ validation hooks
    @torch.no_grad()
    def forward_step(self, cfg: RunConfig, i: int, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Teacher-forced step ``i``: guided logits and sampled tokens for the given current tokens.

        The sampling generator is seeded with :func:`step_seed` (cfg.seed, i) so both sides of a
        comparison draw the same numbers.
        """
        latent_shape = self.latent_shape(cfg)
        steps = self.num_steps(cfg)
        self._move_transformer(self.device)
        x = inputs["tokens"].to(self.device, torch.int64)
        n_img = math.prod(latent_shape)
        if x.shape[-1] != n_img:
            raise InputError(f"forward_step got {x.shape[-1]} tokens per row; this size needs {n_img}.")
        cond, uncond = self.encode_prompts(cfg.prompt, cfg.negative_prompt)
        if cond.shape[0] != x.shape[0]:
            cond, uncond = cond.expand(x.shape[0], -1), uncond.expand(x.shape[0], -1)
        tcfg = self.transformer.config
        img = F.pad(x + tcfg.lm_vocab_size, (1, 0), value=tcfg.bov_token_id)
        ids = torch.cat([cond.to(self.device), img], 1)
        use_cfg = cfg.guidance > 1
        if use_cfg:
            ids = torch.cat([ids, torch.cat([uncond.to(self.device), img], 1)])
        pos = positions(latent_shape, cond.shape[1]).to(self.device)
        raw = self._forward(ids, pos, n_img, "lm-head-slice" not in cfg.disable)
        t = self.scheduler.t(i, steps)
        if use_cfg:
            c, u = raw.chunk(2)
            z = u.add_(c.sub_(u).mul_(cfg.guidance if t < cfg.guidance_trunc else 1))
        else:
            z = raw
        logits = _cpu_copy(z, torch.float32)  # the scheduler overwrites z
        gen = torch.Generator("cpu").manual_seed(step_seed(cfg.seed, i))
        new = self.scheduler.step(z, i, steps, x, gen)
        return {"logits": logits, "tokens": new.cpu()}

    def transformer_blocks(self) -> list[tuple[str, torch.nn.Module]]:
        blocks: list[tuple[str, torch.nn.Module]] = [("model.embed_tokens", self.transformer.model.embed_tokens)]
        blocks += [(f"model.layers.{i}", layer) for i, layer in enumerate(self.transformer.model.layers)]
        blocks += [("model.norm", self.transformer.model.norm), ("lm_head", self.transformer.lm_head)]
        return blocks

    def component_inputs(self, cfg: RunConfig) -> dict[str, dict[str, torch.Tensor]]:
        """Deterministic CPU inputs (seeded by cfg.seed) for :meth:`run_component`."""
        latent_shape = self.latent_shape(cfg)
        gen = torch.Generator("cpu").manual_seed(int(cfg.seed))
        codes = torch.randint(0, self.scheduler.codebook_size, (1, *latent_shape), generator=gen)
        cond, _ = self.encode_prompts(cfg.prompt, None)
        tcfg = self.transformer.config
        img = F.pad(codes.flatten(1) + tcfg.lm_vocab_size, (1, 0), value=tcfg.bov_token_id)
        return {
            "transformer": {"ids": torch.cat([cond, img], 1), "positions": positions(latent_shape, cond.shape[1])},
            "vae_decode": {"codes": codes},
        }

    def run_component(self, name: str, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """``transformer``: logits of the sampler's rows ``[B, N, K]``; ``vae_decode``: pixels in [-1, 1]."""
        with torch.no_grad():
            if name == "transformer":
                self._move_transformer(self.device)
                ids, pos = inputs["ids"].to(self.device), inputs["positions"].to(self.device)
                n_img = ids.shape[1] - self.tokenizer.max_length - 1
                return self._forward(ids, pos, n_img, True).float().cpu()
            if name == "vae_decode":
                self._move_vae(self.device)
                return self.vae.decode(inputs["codes"].to(self.device)).float().cpu()
        raise InputError(f"Unknown URSA component '{name}'; use 'transformer' or 'vae_decode'.")

    def flops_per_step(self, cfg: RunConfig) -> dict[str, Any]:
        """FLOPs of one denoising forward, counted once on the meta device."""
        from torch.utils.flop_counter import FlopCounterMode

        latent_shape = self.latent_shape(cfg)
        n_img = math.prod(latent_shape)
        text_len = self.tokenizer.max_length
        length = text_len + 1 + n_img
        rows = 2 if cfg.guidance > 1 else 1
        with torch.device("meta"):
            model = URSATransformer(self.transformer.config, self.transformer.ops)
            ids = torch.zeros(rows, length, dtype=torch.int64)
        pos = positions(latent_shape, text_len).to("meta")
        counter = FlopCounterMode(display=False)
        with counter, torch.no_grad():
            model(ids, pos, logits_slice=slice(length - n_img - 1, length - 1))
        return {"forwards_per_step": 1, "tokens_per_forward": rows * length, "flops_per_step": int(counter.get_total_flops())}
