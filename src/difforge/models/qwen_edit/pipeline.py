"""The Qwen-Image-Edit family pipeline: diffusers' components, difforge's loop.

The call reads top to bottom in numbered stages (:meth:`QwenEditPipeline._run`), those of diffusers'
``QwenImageEditPipeline.__call__`` / ``QwenImageEditPlusPipeline.__call__`` (check inputs, encode
prompt and references, prepare noise and timesteps, denoise with true CFG, decode) plus difforge's
own (bring the modules to the call's settings, check the memory it needs), run here one by one so
each is a timed RunRecord phase, each step is timed and
observable (``step_hook``), the prepared state of a run can be had again for teacher-forced
validation (``prepared_for``; the steps themselves are recomputed by :mod:`.probe`), and the
weights can leave the device before the VAE decode.  For the same inputs the result equals
diffusers' ``__call__`` (tested on the tiny models): bit for bit with every exact speed-up switched
off (``cfg.disable``), within float rounding with them on (see :mod:`.loop`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import Any

import numpy as np
import PIL.Image
import torch
from torch import Tensor

from ...config import RunConfig
from ...devices import Backend
from ...errors import InputError, SizeError
from ...runtime.images import load_images
from ...runtime.progress import spinner, track
from ...runtime.record import RunRecord
from ...runtime.steps import StepTimer
from ..checkpoint import library_panics
from ..families import QWEN_EDIT_PLUS
from ..load_defaults import load_inputs
from .call import EditCall, RunSettings, StepHook
from .loader import choose_attention, load_pipeline, place, record_offload, set_vae_tiling
from .loop import Denoiser, Prepared, SpeedOptions, denoise, schedule
from .memory import check_call_memory
from .overrides import install_overrides
from .references import References, check_fit, check_images, fit_area, prepare_references
from .settings import EditSettings
from .speed import RUN_SWITCHABLE, forget, install_compile, install_exact, install_fast, install_vae_convs

DEFAULT_STEPS = 50
#: diffusers' Qwen prompt template keeps the hidden states after the system prompt's 64 tokens.
DROPPED_PROMPT_TOKENS = 64
#: When CFG is on and no negative prompt is given, use the published recipe's " " (diffusers would
#: otherwise switch CFG off without telling anyone).
DEFAULT_NEGATIVE_PROMPT = " "


def _cpu(t: Tensor) -> Tensor:
    return t.detach().to("cpu", torch.float32).clone()


@dataclass
class EditOutput:
    """What the diffusers-style call returns (diffusers' ``QwenImagePipelineOutput`` shape)."""

    images: Any


class QwenEditPipeline:
    """Qwen-Image-Edit (one reference) or Edit-Plus 2509/2511 (several references) on one backend."""

    def __init__(
        self,
        pipe: Any,
        family: str,
        backend: Backend,
        dtype: torch.dtype,
        settings: EditSettings,
        offload: str,
        folder: Path,
        options: SpeedOptions | None = None,
        vae_tiling: bool = False,
        processor_locked: bool = False,
        in_force: RunRecord | None = None,
    ) -> None:
        self.pipe = pipe
        self.family = family
        self.backend = backend
        self.dtype = dtype
        self.settings = settings
        self.folder = folder
        #: The speed and memory settings the modules are set up for; a call brings them to its own (:meth:`configure`).
        self.installed = RunSettings.loaded(options or SpeedOptions(), offload, vae_tiling)
        self._processor_locked = processor_locked  # an attention override owns the processors
        #: The adaptations in force, copied into every run's record.
        self._in_force = in_force if in_force is not None else RunRecord(kind="edit")
        self._released = False  # before-decode moved the transformer and text encoder to the host
        self._prepared: Prepared | None = None
        self._ulysses = ""  # --parallel ulysses=N: what the record says about the split

    # ---- loading ------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(
        cls,
        folder: str | Path,
        backend: Backend | None = None,
        dtype: torch.dtype | None = None,
        cfg: RunConfig | None = None,
        record: RunRecord | None = None,
        op_overrides: dict[str, Callable] | None = None,
    ) -> QwenEditPipeline:
        """Load a diffusers-layout folder.  ``QwenEditPipeline.from_pretrained(path)`` alone works too:
        the device defaults to ``auto`` and the dtype to float32 on the CPU (the backend's choice elsewhere)."""
        folder, backend, dtype, cfg, record = load = load_inputs(folder, "edit", backend, dtype, cfg, record)
        options = SpeedOptions.from_config(cfg)
        # An fp8 file goes straight to the device when the whole pipeline will live there anyway.
        direct = backend.device if cfg.offload in ("none", "before-decode") else "cpu"
        with load.phase():
            loaded = load_pipeline(
                folder, dtype, record, transformer_file=cfg.transformer_file, quiet=cfg.quiet, transformer_device=direct,
                backend=backend, cfg=cfg,
            )
            pipe = loaded.pipe
            settings = EditSettings.from_folder(folder)
            installed = install_overrides(pipe.transformer, op_overrides)
            for name, count in installed.items():
                fn = op_overrides[name] if op_overrides else None
                label = getattr(fn, "__qualname__", None) or type(fn).__name__
                record.adapt(name, f"override: {label}", detail=f"installed on {count} modules of this pipeline only")
            install_exact(pipe.transformer, options, record, processor_installed="attention" in installed)
            if "attention" not in installed:  # an attention override is the kernel; nothing to choose
                choose_attention(pipe, backend, dtype, record, allow_npu=options.npu_attention)
            install_fast(pipe.transformer, options, record)
            install_vae_convs(pipe.vae, options, record)  # before place(): offload hooks wrap the forward they find
            place(pipe, backend, cfg.offload, cfg.vae_tiling, record)
            install_compile(pipe.transformer, options, backend, record)
        record.extra["family"] = loaded.checked.family
        record.extra["reference_areas"] = {
            "reference": settings.reference_area, "condition": settings.condition_area, "output": settings.output_area
        }
        record.extra["speed"] = {
            "disable": list(cfg.disable), "fast": list(cfg.fast), "compile": bool(cfg.compile)
        }
        in_force = RunRecord(kind="edit")
        in_force.adaptations = list(record.adaptations)
        return cls(pipe, loaded.checked.family, backend, dtype, settings, cfg.offload, folder, options,
                   vae_tiling=cfg.vae_tiling, processor_locked="attention" in installed, in_force=in_force)

    # ---- per-run settings ---------------------------------------------------------------------
    @property
    def options(self) -> SpeedOptions:
        """The speed-ups the modules are set up for."""
        return self.installed.options

    @property
    def offload(self) -> str:
        """The offload plan in force."""
        return self.installed.offload

    @property
    def vae_tiling(self) -> bool:
        """Whether the VAE decodes in tiles."""
        return self.installed.vae_tiling

    def settings_for(self, cfg: RunConfig) -> RunSettings:
        """``cfg``'s settings, checked against this loaded pipeline; nothing changes.

        Switchable on a loaded pipeline: the exact speed-ups (``cfg.disable``), the step caches
        (``cfg.fast``), VAE tiling, and ``--offload none`` / ``before-decode``.  ``--compile``, the
        accelerate offload plans and a ulysses split are set up at load: a run that asks for other ones
        is an ``InputError`` (reload the pipeline).  The plan itself is one of ``config.OFFLOAD_PLANS``
        (``RunConfig.validate`` refuses any other).
        """
        settings = RunSettings.of(cfg)
        run = settings.options
        from .ulysses import split_for

        split = split_for(self.pipe.transformer)
        if split is not None and (cfg.parallel != f"ulysses={split[0]}" or run.real_rope != split[1]):
            raise InputError(f"This pipeline's transformer is split for --parallel ulysses={split[0]} (diffusers' "
                             "context parallelism); reload the pipeline to run it another way.")
        if run.compile != self.options.compile:
            loaded, asked = ("with", "without") if self.options.compile else ("without", "with")
            raise InputError(f"This pipeline was loaded {loaded} --compile; reload the pipeline to run {asked} it.")
        if cfg.offload != self.offload and not {cfg.offload, self.offload} <= {"none", "before-decode"}:
            raise InputError(
                f"This pipeline was loaded with --offload {self.offload}; reload the pipeline to run with --offload"
                f" {cfg.offload}."
            )
        return settings

    def configure(self, cfg: RunConfig, record: RunRecord | None = None) -> RunSettings:
        """Stage 2 of a call: ``cfg``'s settings (:meth:`settings_for`), the modules brought to them, and the
        adaptations in force written to ``record``; returns the settings the call runs with.

        Only what differs from :attr:`installed` is switched (a call with the settings in force changes
        nothing); everything is checked before anything changes.
        """
        settings = self.settings_for(cfg)
        self._install(settings)
        if record is not None and record is not self._in_force:
            self._record_in_force(record, settings)
        return settings

    def _install(self, settings: RunSettings) -> None:
        """Switch the modules from :attr:`installed` to ``settings`` (speed-ups, offload, tiling), noting each
        change in the adaptations in force."""
        state, current, run = self._in_force, self.installed, settings.options
        if run != current.options:
            transformer = self.pipe.transformer
            replaced = install_exact(transformer, run, state, processor_installed=self._processor_locked)
            if not self._processor_locked and (replaced or run.npu_attention != current.options.npu_attention):
                choose_attention(self.pipe, self.backend, self.dtype, state, allow_npu=run.npu_attention)
            install_fast(transformer, run, state, current=current.options)
            install_vae_convs(self.pipe.vae, run, state)
        if settings.offload != current.offload:
            self.restore_weights()
            record_offload(settings.offload, state)
        if settings.vae_tiling != current.vae_tiling:
            set_vae_tiling(self.pipe, settings.vae_tiling, state)
        self.installed = settings

    def _record_in_force(self, record: RunRecord, settings: RunSettings) -> None:
        """The adaptations in force, as this call's ``record`` lines (a switched-off one's line removed)."""
        state = self._in_force
        in_force = {a.what for a in state.adaptations}
        for what in RUN_SWITCHABLE:
            if what not in in_force:
                forget(record, what)
        for a in state.adaptations:
            record.adapt(a.what, a.choice, a.exact, a.detail)
        record.extra["speed"] = {"disable": list(settings.disable), "fast": list(settings.fast),
                                 "compile": settings.options.compile}

    # ---- properties ---------------------------------------------------------------------------
    @property
    def plus(self) -> bool:
        return self.family == QWEN_EDIT_PLUS

    @property
    def device(self) -> torch.device:
        return self.backend.device

    @property
    def size_multiple(self) -> int:
        return int(self.pipe.vae_scale_factor) * 2

    # ---- input checks -------------------------------------------------------------------------
    @staticmethod
    def _steps(cfg: RunConfig) -> int:
        """The run's step count: the family's default when unset (``RunConfig.validate`` refuses < 2)."""
        return DEFAULT_STEPS if cfg.steps is None else int(cfg.steps)

    def output_size(self, cfg: RunConfig, images: list[PIL.Image.Image]) -> tuple[int, int]:
        """(height, width): the user's, or the last reference's aspect ratio at the output area.

        Every reference must also fit the areas it will be resized to (a side rounding to 0 is a
        clear InputError about the image here, not a size error about flags never given).
        """
        check_fit(images, self.settings.reference_area, "reference size")
        if self.plus:
            check_fit(images, self.settings.condition_area, "vision-encoder size")
        if cfg.height is None or cfg.width is None:
            check_fit(images[-1:], self.settings.output_area, "default output size")
        default_w, default_h = fit_area(self.settings.output_area, images[-1].width / images[-1].height)
        height = default_h if cfg.height is None else int(cfg.height)
        width = default_w if cfg.width is None else int(cfg.width)
        m = self.size_multiple
        if height <= 0 or width <= 0 or height % m or width % m:
            near_h, near_w = max(m, round(height / m) * m), max(m, round(width / m) * m)
            raise SizeError(
                f"--height and --width must be positive multiples of {m} for this model, got {height}x{width};"
                f" try {near_h}x{near_w}."
            )
        return height, width

    @staticmethod
    def negative_prompt_for(cfg: RunConfig) -> str | None:
        """The negative prompt ``cfg`` runs with: None without CFG, the published " " when none is given."""
        if cfg.true_cfg <= 1:
            return None
        return DEFAULT_NEGATIVE_PROMPT if cfg.negative_prompt is None else cfg.negative_prompt

    # ---- building blocks of the stages ------------------------------------------------------------
    def references(self, images: list[PIL.Image.Image]) -> References:
        """The references as the VL encoder and the VAE see them (this folder's areas)."""
        return prepare_references(
            self.pipe.image_processor, images, self.plus, self.settings.reference_area, self.settings.condition_area
        )

    @torch.inference_mode()
    def _prepare(
        self, cfg: RunConfig, images: list[PIL.Image.Image], generator: torch.Generator | None = None
    ) -> Prepared:
        """Encode prompt(s) and references, draw the initial noise; cached for :meth:`prepared_for`."""
        pipe = self.pipe
        height, width = self.output_size(cfg, images)
        refs = self.references(images)
        with library_panics(f"The tokenizer of {self.folder}"):  # a hostile tokenizer.json panics in Rust
            embeds, mask = pipe.encode_prompt(image=refs.prompt_images, prompt=cfg.prompt, device=self.device)
            negative = self.negative_prompt_for(cfg)
            neg_embeds = neg_mask = None
            if negative is not None:
                neg_embeds, neg_mask = pipe.encode_prompt(image=refs.prompt_images, prompt=negative, device=self.device)
        channels = pipe.transformer.config.in_channels // 4
        noise, image_latents = pipe.prepare_latents(
            refs.vae_images, 1, channels, height, width, embeds.dtype, self.device,
            generator if generator is not None else self.backend.generator(cfg.seed),
        )
        f = pipe.vae_scale_factor * 2
        img_shapes = [[(1, height // f, width // f), *[(1, h // f, w // f) for w, h in refs.vae_sizes]]]
        prepared = Prepared(
            cfg.fingerprint(), height, width, embeds, mask, neg_embeds, neg_mask, image_latents, img_shapes, noise
        )
        self._prepared = prepared
        return prepared

    def cached_prepared(self, cfg: RunConfig) -> Prepared | None:
        """The prepared state of the last run if it ran ``cfg`` (same fingerprint), else None."""
        if self._prepared is not None and self._prepared.key == cfg.fingerprint():
            return self._prepared
        return None

    def prepared_for(self, cfg: RunConfig) -> Prepared:
        """``cfg``'s prepared state: the last run's when it ran ``cfg``, else prepared from ``cfg.images``.

        What a teacher-forced step needs: the same prompt states, reference latents and noise the
        run's own steps used.
        """
        cached = self.cached_prepared(cfg)
        return cached if cached is not None else self._prepare(cfg, self.images_of(cfg))

    def images_of(self, cfg: RunConfig) -> list[PIL.Image.Image]:
        """The reference images named in ``cfg.images``, checked for this family (see :func:`_open_images`)."""
        return _open_images(cfg, self.plus)

    def _timesteps(self, prepared: Prepared, steps: int) -> Tensor:
        return schedule(self.pipe.scheduler, prepared.noise.shape[1], steps, self.device)

    def denoiser(self, cfg: RunConfig) -> Denoiser:
        """This run's denoiser: batched CFG unless the run switched it off (``--parallel cfg``: split over 2 ranks)."""
        split = None
        if cfg.parallel == "cfg":
            from ...runtime.parallel import cfg_split

            split = cfg_split()
        if cfg.parallel.startswith("ulysses"):  # diffusers' context parallelism; CFG as two calls (no masks)
            from ...runtime.parallel import seq_split
            from . import ulysses

            group = seq_split()
            ulysses.check(self.pipe.transformer, group.world_size, SpeedOptions.from_config(cfg))
            self._ulysses = ulysses.enable(self.pipe.transformer, group)
            return Denoiser(self.pipe.transformer, batched_cfg=False, sequence=group)
        return Denoiser(self.pipe.transformer, batched_cfg=SpeedOptions.from_config(cfg).batched_cfg, split=split)

    def _release_before_decode(self) -> None:
        """``before-decode``: only the VAE stays on the device for the decode."""
        self.pipe.transformer.to("cpu")
        self.pipe.text_encoder.to("cpu")
        self._released = True
        self.backend.empty_cache()

    def restore_weights(self) -> None:
        """Bring back to the device what ``before-decode`` moved to the host (nothing if nothing moved)."""
        if self._released:
            self.pipe.text_encoder.to(self.device)
            self.pipe.transformer.to(self.device)
            self._released = False

    def vae_input(self, latents: Tensor, height: int, width: int, dtype: torch.dtype | None = None) -> Tensor:
        """Packed latents -> what the VAE decodes: unpacked to ``[B, z, 1, H/8, W/8]``, the latent
        normalisation undone, in ``dtype`` (the VAE's by default).  Its own method so validation compares
        the step between the denoiser and the VAE (the probe's ``post_network_step``) on this very code."""
        pipe, vae = self.pipe, self.pipe.vae
        z = vae.config.z_dim
        latents = pipe._unpack_latents(latents, height, width, pipe.vae_scale_factor).to(dtype or vae.dtype)
        mean = torch.tensor(vae.config.latents_mean).view(1, z, 1, 1, 1).to(latents.device, latents.dtype)
        inv_std = 1.0 / torch.tensor(vae.config.latents_std).view(1, z, 1, 1, 1).to(latents.device, latents.dtype)
        return latents / inv_std + mean

    def decode(self, latents: Tensor, height: int, width: int) -> list[PIL.Image.Image]:
        """Packed latents -> PIL images (:meth:`vae_input`, then the VAE decode)."""
        pipe, vae = self.pipe, self.pipe.vae
        latents = self.vae_input(latents, height, width)
        image = vae.decode(latents, return_dict=False)[0][:, :, 0]
        return pipe.image_processor.postprocess(image, output_type="pil")

    # ---- the call: both styles, then its numbered stages ------------------------------------------
    @torch.inference_mode()
    def __call__(
        self,
        cfg: RunConfig | None = None,
        record: RunRecord | None = None,
        images: list[PIL.Image.Image] | None = None,
        step_hook: StepHook | None = None,
        **kwargs: Any,
    ) -> Any:
        """difforge's contract: ``pipe(cfg, record, images)`` -> PIL images, filling the RunRecord.

        The diffusers call works too - ``pipe(image=img, prompt="...", negative_prompt=" ",
        true_cfg_scale=4.0, num_inference_steps=40, generator=g)`` returns :class:`EditOutput` with
        ``.images`` (see :meth:`edit`).
        """
        if not isinstance(cfg, RunConfig):
            return self.edit(**kwargs)
        return self._run(cfg, record if record is not None else RunRecord(kind="edit"), images, step_hook)

    def edit(
        self,
        image: PIL.Image.Image | list[PIL.Image.Image],
        prompt: str,
        negative_prompt: str | None = None,
        true_cfg_scale: float = 4.0,
        height: int | None = None,
        width: int | None = None,
        num_inference_steps: int = DEFAULT_STEPS,
        generator: torch.Generator | None = None,
        output_type: str = "pil",
    ) -> EditOutput:
        """diffusers' ``QwenImageEdit(Plus)Pipeline.__call__`` arguments, through difforge's loop.

        ``output_type`` "pil" or "np" (float ``[B, H, W, 3]`` in [0, 1], like diffusers).  Unlike
        diffusers, a missing negative prompt with ``true_cfg_scale > 1`` means ``" "`` (the published
        recipe) instead of silently switching guidance off.
        """
        if output_type not in ("pil", "np"):
            raise InputError(f"output_type must be 'pil' or 'np', got {output_type!r}.")
        images = [image] if isinstance(image, PIL.Image.Image) else list(image)
        cfg = RunConfig(model=str(self.folder), prompt=prompt, negative_prompt=negative_prompt, true_cfg=true_cfg_scale,
                        height=height, width=width, steps=num_inference_steps, quiet=True, **self.installed.config_fields())
        out = self._run(cfg, RunRecord(kind="edit"), images, None, generator=generator)
        if output_type == "np":
            return EditOutput(images=np.stack([np.asarray(im, dtype=np.float32) / 255.0 for im in out]))
        return EditOutput(images=out)

    def _run(
        self,
        cfg: RunConfig,
        record: RunRecord,
        images: list[PIL.Image.Image] | None = None,
        step_hook: StepHook | None = None,
        generator: torch.Generator | None = None,
    ) -> list[PIL.Image.Image]:
        """Both call styles' one path, in numbered stages (each a method below)."""
        # 1. check inputs
        call = self.check_inputs(cfg, record, images, step_hook, generator)
        # 2. bring the modules to the call's settings
        settings = self.configure(cfg, record)
        # 3. check the memory the call needs
        self.check_memory(call)
        # 4. encode prompt and references, draw the noise
        prepared = self.encode(call)
        # 5. denoise
        latents = self.denoise_latents(call, prepared)
        # 6. decode
        return self.decode_output(call, settings, prepared, latents)

    def check_inputs(
        self,
        cfg: RunConfig,
        record: RunRecord,
        images: list[PIL.Image.Image] | None,
        step_hook: StepHook | None = None,
        generator: torch.Generator | None = None,
    ) -> EditCall:
        """Stage 1: the references checked for this family, the step count and the output size (size errors
        before any work)."""
        images = check_images(images, self.plus)
        steps = self._steps(cfg)
        height, width = self.output_size(cfg, images)
        return EditCall(cfg, record, images, steps, height, width, step_hook, generator)

    def check_memory(self, call: EditCall) -> None:
        """Stage 3: refuse a size that cannot fit, before allocating; then the weights back on the device."""
        check_call_memory(self, call.cfg, call.images, call.height, call.width, call.record)
        self.restore_weights()

    def encode(self, call: EditCall) -> Prepared:
        """Stage 4: prompt(s) and references encoded, the initial noise drawn (the ``encode`` phase)."""
        with call.record.phase("encode", self.backend):
            return self._prepare(call.cfg, call.images, call.generator)

    def denoise_latents(self, call: EditCall, p: Prepared) -> Tensor:
        """Stage 5: the timesteps, this run's denoiser and its loop (the ``denoise`` phase), each step timed and
        handed to the call's ``step_hook``."""
        cfg, record, step_hook = call.cfg, call.record, call.step_hook
        with record.phase("denoise", self.backend):
            timesteps = self._timesteps(p, call.steps)
            denoiser = self.denoiser(cfg)
            if denoiser.split is not None:
                if not p.do_cfg:
                    raise InputError("--parallel cfg splits true CFG's two branches over two ranks; this run has no "
                                     "CFG (--true-cfg must be above 1).")
                record.adapt("true CFG", f"cfg-parallel: conditional on rank 0, unconditional on rank 1 "
                             f"({denoiser.split.dist_backend}, one all-gather per step)")
            if denoiser.sequence is not None:
                record.adapt("sequence parallel", self._ulysses, detail="true CFG as two calls per step (a padded "
                             "batch would need a mask split over ranks)")
            timer = StepTimer(self.backend)

            def on_step(i: int, latents: Tensor, t: Tensor, velocity: Tensor, stepped: Tensor) -> None:
                if step_hook is not None:
                    step_hook(
                        i,
                        {"latents": _cpu(latents), "timestep": _cpu(t)},
                        {"noise_pred": _cpu(velocity), "latents": _cpu(stepped)},
                    )
                timer.mark()

            progress = track(enumerate(timesteps), total=len(timesteps), description="denoise", quiet=cfg.quiet)
            timer.start()
            latents = denoise(denoiser, self.pipe.scheduler, p, timesteps, cfg.true_cfg, on_step, steps=progress)
            record.step_times_s = timer.durations()
            record.extra["forwards_per_step"] = denoiser.forwards_per_step(p)
        return latents

    def decode_output(self, call: EditCall, settings: RunSettings, p: Prepared, latents: Tensor) -> list[PIL.Image.Image]:
        """Stage 6: ``before-decode`` weights to the host, the VAE decode (the ``decode`` phase), the run's record
        lines."""
        record = call.record
        if settings.offload == "before-decode":
            self._release_before_decode()
        with record.phase("decode", self.backend), spinner("decoding", call.cfg.quiet):
            out = self.decode(latents, p.height, p.width)
        self.pipe.maybe_free_model_hooks()
        record.extra["tokens"] = self._token_counts(p)
        record.extra["steps"] = call.steps
        record.extra["true_cfg"] = p.do_cfg
        record.extra["output_size"] = [p.width, p.height]
        return out

    @staticmethod
    def _token_counts(p: Prepared) -> dict[str, int]:
        """The run's sequence lengths for the record: all image tokens, the output's, each text's."""
        image = sum(prod(s) for s in p.img_shapes[0])
        return {
            "image": image,
            "output_image": prod(p.img_shapes[0][0]),
            "text": int(p.prompt_embeds.shape[1]),
            "negative_text": int(p.negative_embeds.shape[1]) if p.negative_embeds is not None else 0,
        }


def _open_images(cfg: RunConfig, plus: bool) -> list[PIL.Image.Image]:
    """The reference images named in ``cfg.images`` (a teacher-forced step without a preceding run).

    Decoded by :func:`difforge.runtime.images.load_images`, the one place for the input-image rules
    (EXIF orientation, pixel limit), so validation sees the same pixels as ``difforge edit``.
    """
    return check_images(load_images(cfg.images), plus)
