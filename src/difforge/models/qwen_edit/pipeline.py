"""The Qwen-Image-Edit family pipeline: diffusers' components, difforge's loop.

The stages are those of diffusers' ``QwenImageEditPipeline.__call__`` / ``QwenImageEditPlusPipeline.
__call__`` (check inputs, encode prompt and references, prepare noise and timesteps, denoise with
true CFG, decode), run here one by one so each is a timed RunRecord phase, each step is timed and
observable (``step_hook``), a single step can be recomputed for teacher-forced validation
(``forward_step``), and the weights can leave the device before the VAE decode.  For the same
inputs the result equals diffusers' ``__call__`` (tested on the tiny models): bit for bit with every
exact speed-up switched off (``cfg.disable``), within float rounding with them on (see :mod:`.loop`).
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

from ...config import OFFLOAD_PLANS, RunConfig
from ...devices import Backend
from ...errors import InputError, SizeError, StepsError
from ...runtime.progress import track
from ...runtime.record import RunRecord
from ...runtime.steps import StepTimer
from ..load_defaults import load_defaults
from ..registry import QWEN_EDIT_PLUS
from .loader import choose_attention, load_pipeline, place
from .loop import Denoiser, Prepared, SpeedOptions, denoise, schedule
from .overrides import install_overrides
from .references import References, check_fit, check_images, fit_area, prepare_references
from .settings import EditSettings

DEFAULT_STEPS = 50
#: diffusers' Qwen prompt template keeps the hidden states after the system prompt's 64 tokens.
DROPPED_PROMPT_TOKENS = 64
#: When CFG is on and no negative prompt is given, use the published recipe's " " (diffusers would
#: otherwise switch CFG off without telling anyone).
DEFAULT_NEGATIVE_PROMPT = " "

StepHook = Callable[[int, dict[str, Tensor], dict[str, Tensor]], None]


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
        #: The speed and memory options in force; each run brings them to its own cfg (:meth:`configure`).
        self.options = options or SpeedOptions()
        self.offload = offload
        self.vae_tiling = vae_tiling
        self._processor_locked = processor_locked  # an attention override owns the processors
        #: The adaptations in force, copied into every run's record.
        self._in_force = in_force if in_force is not None else RunRecord(kind="edit")
        disable, fast = self.options.names()
        self._speed_cfg: dict[str, Any] = {"disable": disable, "fast": fast, "compile": self.options.compile,
                                           "offload": offload, "vae_tiling": vae_tiling}
        self._released = False  # before-decode moved the transformer and text encoder to the host
        self._prepared: Prepared | None = None

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
        from .speed import install_compile, install_exact, install_fast

        folder = Path(folder)
        backend, dtype, cfg, record = load_defaults(folder, "edit", backend, dtype, cfg, record)
        options = SpeedOptions.from_config(cfg)
        # An fp8 file goes straight to the device when the whole pipeline will live there anyway.
        direct = backend.device if cfg.offload in ("none", "before-decode") else "cpu"
        with record.phase("load", backend):
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

    # ---- per-run options ----------------------------------------------------------------------
    def configure(self, cfg: RunConfig, record: RunRecord | None = None) -> None:
        """Bring the pipeline to ``cfg``'s speed and memory options; write the adaptations in force to ``record``.

        Switchable on a loaded pipeline: the exact speed-ups (``cfg.disable``), the step caches
        (``cfg.fast``), VAE tiling, and ``--offload none`` / ``before-decode``.  ``--compile`` and the
        accelerate offload plans are set up at load: a run that asks for other ones is an
        ``InputError`` (reload the pipeline).  Everything is checked before anything changes.
        """
        from .loader import choose_attention, record_offload, set_vae_tiling
        from .speed import RUN_SWITCHABLE, forget, install_exact, install_fast

        run = SpeedOptions.from_config(cfg)
        if run.compile != self.options.compile:
            loaded, asked = ("with", "without") if self.options.compile else ("without", "with")
            raise InputError(f"This pipeline was loaded {loaded} --compile; reload the pipeline to run {asked} it.")
        if cfg.offload not in OFFLOAD_PLANS:
            raise InputError(f"Unknown --offload plan '{cfg.offload}'; use one of {', '.join(OFFLOAD_PLANS)}.")
        if cfg.offload != self.offload and not {cfg.offload, self.offload} <= {"none", "before-decode"}:
            raise InputError(
                f"This pipeline was loaded with --offload {self.offload}; reload the pipeline to run with --offload"
                f" {cfg.offload}."
            )
        state = self._in_force
        if run != self.options:
            transformer = self.pipe.transformer
            replaced = install_exact(transformer, run, state, processor_installed=self._processor_locked)
            if not self._processor_locked and (replaced or run.npu_attention != self.options.npu_attention):
                choose_attention(self.pipe, self.backend, self.dtype, state, allow_npu=run.npu_attention)
            install_fast(transformer, run, state, current=self.options)
            self.options = run
        if cfg.offload != self.offload:
            self._restore_after_release()
            self.offload = cfg.offload
            record_offload(cfg.offload, state)
        if bool(cfg.vae_tiling) != self.vae_tiling:
            set_vae_tiling(self.pipe, bool(cfg.vae_tiling), state)
            self.vae_tiling = bool(cfg.vae_tiling)
        self._speed_cfg = {"disable": list(cfg.disable), "fast": list(cfg.fast), "compile": bool(cfg.compile),
                           "offload": cfg.offload, "vae_tiling": bool(cfg.vae_tiling)}
        if record is None or record is state:
            return
        in_force = {a.what for a in state.adaptations}
        for what in RUN_SWITCHABLE:
            if what not in in_force:
                forget(record, what)
        for a in state.adaptations:
            record.adapt(a.what, a.choice, a.exact, a.detail)
        record.extra["speed"] = {"disable": list(cfg.disable), "fast": list(cfg.fast), "compile": bool(cfg.compile)}

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
    def _steps(self, cfg: RunConfig) -> int:
        steps = DEFAULT_STEPS if cfg.steps is None else int(cfg.steps)
        if steps < 2:
            raise StepsError(
                f"--steps must be at least 2 for Qwen-Image-Edit (got {steps}); its scheduler divides by zero at 1 step."
            )
        return steps

    def _size(self, cfg: RunConfig, images: list[PIL.Image.Image]) -> tuple[int, int]:
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

    def _negative_prompt(self, cfg: RunConfig) -> str | None:
        if cfg.true_cfg <= 1:
            return None
        return DEFAULT_NEGATIVE_PROMPT if cfg.negative_prompt is None else cfg.negative_prompt

    # ---- stages -------------------------------------------------------------------------------
    def _references(self, images: list[PIL.Image.Image]) -> References:
        return prepare_references(
            self.pipe.image_processor, images, self.plus, self.settings.reference_area, self.settings.condition_area
        )

    @torch.inference_mode()
    def _prepare(
        self, cfg: RunConfig, images: list[PIL.Image.Image], generator: torch.Generator | None = None
    ) -> Prepared:
        """Encode prompt(s) and references, draw the initial noise; cached for forward_step."""
        pipe = self.pipe
        height, width = self._size(cfg, images)
        refs = self._references(images)
        embeds, mask = pipe.encode_prompt(image=refs.prompt_images, prompt=cfg.prompt, device=self.device)
        negative = self._negative_prompt(cfg)
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

    def _prepared_for(self, cfg: RunConfig) -> Prepared:
        if self._prepared is not None and self._prepared.key == cfg.fingerprint():
            return self._prepared
        return self._prepare(cfg, _open_images(cfg, self.plus))

    def _timesteps(self, prepared: Prepared, steps: int) -> Tensor:
        return schedule(self.pipe.scheduler, prepared.noise.shape[1], steps, self.device)

    def denoiser(self, cfg: RunConfig) -> Denoiser:
        """This run's denoiser: batched CFG unless the run switched it off."""
        return Denoiser(self.pipe.transformer, batched_cfg=SpeedOptions.from_config(cfg).batched_cfg)

    def _velocity(self, cfg: RunConfig, p: Prepared, latents: Tensor, t: Tensor) -> Tensor:
        """The (true-CFG combined, norm-rescaled) velocity at timestep ``t`` - what the scheduler steps with."""
        return self.denoiser(cfg).velocity(p, latents, t, cfg.true_cfg)

    def _denoise(
        self, cfg: RunConfig, p: Prepared, steps: int, record: RunRecord, step_hook: StepHook | None
    ) -> Tensor:
        timesteps = self._timesteps(p, steps)
        denoiser = self.denoiser(cfg)
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

    def _release_before_decode(self) -> None:
        """``before-decode``: only the VAE stays on the device for the decode."""
        self.pipe.transformer.to("cpu")
        self.pipe.text_encoder.to("cpu")
        self._released = True
        self.backend.empty_cache()

    def _restore_after_release(self) -> None:
        if self._released:
            self.pipe.text_encoder.to(self.device)
            self.pipe.transformer.to(self.device)
            self._released = False

    def decode(self, latents: Tensor, height: int, width: int) -> list[PIL.Image.Image]:
        """Packed latents -> PIL images (unpack, undo the latent normalisation, VAE decode)."""
        pipe, vae = self.pipe, self.pipe.vae
        z = vae.config.z_dim
        latents = pipe._unpack_latents(latents, height, width, pipe.vae_scale_factor).to(vae.dtype)
        mean = torch.tensor(vae.config.latents_mean).view(1, z, 1, 1, 1).to(latents.device, latents.dtype)
        inv_std = 1.0 / torch.tensor(vae.config.latents_std).view(1, z, 1, 1, 1).to(latents.device, latents.dtype)
        latents = latents / inv_std + mean
        image = vae.decode(latents, return_dict=False)[0][:, :, 0]
        return pipe.image_processor.postprocess(image, output_type="pil")

    # ---- the run ------------------------------------------------------------------------------
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
                        height=height, width=width, steps=num_inference_steps, quiet=True, **self._speed_cfg)
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
        images = check_images(images, self.plus)
        steps = self._steps(cfg)
        height, width = self._size(cfg, images)  # size errors before any work
        self.configure(cfg, record)
        from .memory import check_call_memory  # refuse a size that cannot fit, before anything is allocated

        check_call_memory(self, cfg, images, height, width, record)
        self._restore_after_release()
        with record.phase("encode", self.backend):
            prepared = self._prepare(cfg, images, generator)
        with record.phase("denoise", self.backend):
            latents = self._denoise(cfg, prepared, steps, record, step_hook)
        if self.offload == "before-decode":
            self._release_before_decode()
        with record.phase("decode", self.backend):
            out = self.decode(latents, prepared.height, prepared.width)
        self.pipe.maybe_free_model_hooks()
        record.extra["tokens"] = self._token_counts(prepared)
        record.extra["steps"] = steps
        record.extra["true_cfg"] = prepared.do_cfg
        record.extra["output_size"] = [prepared.width, prepared.height]
        return out

    @torch.inference_mode()
    def forward_step(self, cfg: RunConfig, i: int, inputs: dict[str, Tensor]) -> dict[str, Tensor]:
        """Recompute step ``i``'s velocity from recorded inputs (teacher forcing); CPU float32 out."""
        self.configure(cfg)
        p = self._prepared_for(cfg)
        self._restore_after_release()
        latents = inputs["latents"].to(self.device, p.noise.dtype)
        t = inputs["timestep"].to(self.device, torch.float32).reshape(())
        velocity = self._velocity(cfg, p, latents, t)
        return {"noise_pred": _cpu(velocity)}

    # ---- introspection for validation ---------------------------------------------------------
    def transformer_blocks(self) -> list[tuple[str, torch.nn.Module]]:
        return [(f"transformer_blocks.{i}", block) for i, block in enumerate(self.pipe.transformer.transformer_blocks)]

    @staticmethod
    def _token_counts(p: Prepared) -> dict[str, int]:
        image = sum(prod(s) for s in p.img_shapes[0])
        return {
            "image": image,
            "output_image": prod(p.img_shapes[0][0]),
            "text": int(p.prompt_embeds.shape[1]),
            "negative_text": int(p.negative_embeds.shape[1]) if p.negative_embeds is not None else 0,
        }

    def component_inputs(self, cfg: RunConfig) -> dict[str, dict[str, Tensor]]:
        from .components import component_inputs

        return component_inputs(self, cfg)

    def run_component(self, name: str, inputs: dict[str, Tensor]) -> Tensor:
        from .components import run_component

        self._restore_after_release()
        return run_component(self, name, inputs)

    def flops_per_step(self, cfg: RunConfig) -> dict[str, Any]:
        from .components import flops_per_step

        return flops_per_step(self, cfg)


def _open_images(cfg: RunConfig, plus: bool) -> list[PIL.Image.Image]:
    """The reference images named in ``cfg.images`` (forward_step without a preceding run).

    Decoded by :func:`difforge.api.load_images`, the one place for the input-image rules (EXIF
    orientation, pixel limit), so validation sees the same pixels as ``difforge edit``.
    """
    from ...runtime.images import load_images

    return check_images(load_images(cfg.images), plus)
