"""What validation asks of a loaded Qwen-Image-Edit pipeline: the family's :class:`~difforge.models.probing.Probe`.

``difforge validate`` holds no family code; it wraps each loaded pipeline in its family's probe and
asks it to recompute one step on recorded inputs (teacher forcing), to run each component (text
encoder, transformer, VAE encode/decode) alone on identical inputs, to count a step's FLOPs, and to
capture the operators of one step with their float32 CPU references.  The pipeline itself only
runs edits; everything here uses its public attributes, so the probe sits above it and nothing in
the family imports this module (the registry does, lazily).

The component inputs are deterministic (the backend's CPU generator, the one synthetic
:func:`~difforge.runtime.images.test_picture`) and sized like a real run of the given RunConfig, so
the comparison exercises realistic token counts.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Sequence
from math import prod
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ...config import RunConfig
from ...errors import DifforgeError
from ...runtime.images import test_picture
from ..probing import LowPrecisionOnFloat32, OpCase, detach, emulated, moved, rounded, shapes, upcast
from .attention import QwenJointAttnProcessor
from .loop import EXACT_OPTIMISATIONS, FAST_OPTIMISATIONS, Denoiser, schedule
from .overrides import reference_attention, reference_rms_norm
from .pipeline import DEFAULT_STEPS, DROPPED_PROMPT_TOKENS, QwenEditPipeline
from .references import fit_area

COMPONENTS = ("text_encoder", "transformer", "vae_encode", "vae_decode")
#: Text length used for the transformer's synthetic prompt states (a short Plus prompt is ~230).
SYNTHETIC_TEXT_TOKENS = 64
#: Prompts ``difforge validate`` edits with when no --prompts file is given: a background, an object
#: and a style change, so each acts on a different part of the synthetic picture.
EDIT_PROMPTS = (
    "Add a beautiful sunset background to this image.",
    "Turn the red circle into a blue square.",
    "Make the scene look like a watercolor painting.",
)


def count_forward_flops(config: dict[str, Any], img_shapes: list[list[tuple[int, int, int]]], text_tokens: int) -> int:
    """FLOPs of one batch-1 transformer forward, counted on a meta-device copy (no compute, no memory).

    ``FlopCounterMode`` sees every matmul and, on meta tensors, the joint attention too (the CPU
    SDPA kernel is invisible to it in a real run).  Used by :meth:`QwenEditProbe.flops_per_step` and
    the benchmark.
    """
    from diffusers import QwenImageTransformer2DModel
    from torch.utils.flop_counter import FlopCounterMode

    meta = torch.device("meta")
    with meta:
        model = QwenImageTransformer2DModel.from_config(config)  # FLOPs do not depend on the dtype
    image_tokens = sum(prod(s) for s in img_shapes[0])
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        model(
            hidden_states=torch.empty(1, image_tokens, config["in_channels"], device=meta),
            encoder_hidden_states=torch.empty(1, text_tokens, config["joint_attention_dim"], device=meta),
            timestep=torch.zeros(1, device=meta),
            img_shapes=img_shapes,
            return_dict=False,
        )
    return int(counter.get_total_flops())


class QwenEditProbe:
    """The validation hooks of one :class:`~.pipeline.QwenEditPipeline` (Edit or Edit-Plus)."""

    takes_images: ClassVar[bool] = True
    default_prompts: ClassVar[tuple[str, ...]] = EDIT_PROMPTS
    #: None: the pipeline's own default (" " under true CFG, the published recipe).
    negative_prompt: ClassVar[str | None] = None
    #: Denoising steps of a run that gives no --steps (what ``--quick`` lowers).
    default_steps: ClassVar[int] = DEFAULT_STEPS
    exact_optimisations: ClassVar[tuple[str, ...]] = EXACT_OPTIMISATIONS
    approximate_optimisations: ClassVar[tuple[str, ...]] = FAST_OPTIMISATIONS

    #: forward_step outputs the step rung shows but does not judge: the true-CFG branches are the network's
    #: output before the combine, there for :meth:`post_network_step` to be teacher-forced with; a clean bf16
    #: tiny-qwen-edit branch sat at 2.65x the floor's rel-L2 where the velocity made of them (``noise_pred``,
    #: judged) sat under 1.6x - the floor rounds each module's output once, the device's branch rounds
    #: within - so the velocity is what the network is held to, as before.
    informative_outputs: ClassVar[tuple[str, ...]] = ("cond_pred", "uncond_pred")

    def __init__(self, pipeline: QwenEditPipeline) -> None:
        self.pipeline = pipeline

    @property
    def family(self) -> str:
        """``qwen-edit`` or ``qwen-edit-plus``: one probe serves both, the pipeline knows which it is."""
        return self.pipeline.family

    @property
    def dtype(self) -> torch.dtype:
        return self.pipeline.dtype

    @property
    def size_multiple(self) -> int:
        return self.pipeline.size_multiple

    # ---- teacher forcing ----------------------------------------------------------------------------
    @torch.inference_mode()
    def forward_step(self, cfg: RunConfig, i: int, inputs: dict[str, Tensor]) -> dict[str, Tensor]:
        """Recompute step ``i``'s velocity from recorded ``{"latents", "timestep"}`` (teacher forcing).

        The pipeline is first brought to ``cfg``'s options and its prepared state for ``cfg`` (the last
        run's, else prepared from ``cfg.images``), then the same :class:`~.loop.Denoiser` the run's loop
        uses makes the velocity - so for a step's own inputs the result equals what the run's
        ``step_hook`` saw.  ``noise_pred`` is that velocity (after the true-CFG combine and its norm
        rescale); under true CFG ``cond_pred`` and ``uncond_pred`` are the two branches the network gave
        before the combine (what :meth:`post_network_step` is teacher-forced with).  CPU float32 out.
        """
        qe = self.pipeline
        qe.configure(cfg)
        p = qe.prepared_for(cfg)
        qe.restore_weights()
        latents = inputs["latents"].to(qe.device, p.noise.dtype)
        t = inputs["timestep"].to(qe.device, torch.float32).reshape(())
        denoiser = qe.denoiser(cfg)
        branches: list[Tensor] = []
        combine = denoiser.combine

        def seen(cond: Tensor, uncond: Tensor, true_cfg: float) -> Tensor:
            branches[:] = [cond, uncond]
            return combine(cond, uncond, true_cfg)

        denoiser.combine = seen  # type: ignore[method-assign]  # this one denoiser only, the run's is untouched
        velocity = denoiser.velocity(p, latents, t, cfg.true_cfg)
        out = {"noise_pred": upcast(velocity).clone()}
        if branches:
            out["cond_pred"], out["uncond_pred"] = (upcast(b).clone() for b in branches)
        return out

    @torch.inference_mode()
    def post_network_step(self, cfg: RunConfig, i: int, inputs: dict[str, Tensor], teacher: dict[str, Tensor],
                          emulate: torch.dtype | None = None, hold: torch.dtype | None = None,
                          ) -> dict[str, Tensor]:
        """Step ``i``'s work after the network, each stage fed the SAME tensors on every side (teacher forcing).

        ``teacher`` is what the reference's :meth:`forward_step` returned at these ``inputs``; from it:

        * ``guided``: the true-CFG combine and its norm rescale (:meth:`~.loop.Denoiser.combine`) of
          ``teacher["cond_pred"]`` / ``["uncond_pred"]`` (only under true CFG);
        * ``latents_next``: the scheduler's Euler step from ``inputs["latents"]`` at ``inputs["timestep"]``
          with the velocity ``teacher["noise_pred"]`` (a copy of the run's scheduler, set to step ``i``);
        * ``vae_input``: ``inputs["latents"]`` as the VAE would receive them
          (:meth:`~.pipeline.QwenEditPipeline.vae_input`: unpacked, de-normalised; the same code the
          run's last latents go through).

        ``emulate`` None: on the pipeline's device, the teacher tensors held in the run's dtype as a run
        holds them - the device's own kernels.  ``emulate`` a dtype: on the host from float32 kernels,
        the teacher tensors rounded to that dtype and every all-``emulate`` computation rounded where its
        kernel would round (:class:`~difforge.models.probing.LowPrecisionOnFloat32`): the emulated floor,
        which shares no low-precision kernel with the device.  The Euler update mixes a float32 step size
        into a low-precision product, which the emulation would hand to the low-precision kernel, so
        there the floor rounds the step's inputs and output and computes in float32.

        ``hold`` (the device's dtype): the teacher tensors and latents are first rounded to it on every
        side, the reference too, so all sides start each stage from the same values bit for bit - what a
        device holds between stages - and the floor measures only what computing the stage costs.
        Without it the rounding of the inputs, amplified by true CFG's difference of two near-equal
        branches, dominates the floor: a reversed CFG direction sat at 2.4x the floor's error on the tiny
        model instead of over 3x.  CPU float32 out.
        """
        qe = self.pipeline
        p = qe.prepared_for(cfg)
        if hold is not None:
            teacher = {k: rounded(v, hold) for k, v in teacher.items()}
            inputs = {**inputs, "latents": rounded(inputs["latents"], hold)}
        if emulate is None:
            device, dtype, vae_dtype = qe.device, p.noise.dtype, qe.pipe.vae.dtype
        else:
            device, dtype, vae_dtype = torch.device("cpu"), emulate, emulate
        low = dtype in (torch.bfloat16, torch.float16) and emulate is not None
        mode = LowPrecisionOnFloat32(dtype) if low else contextlib.nullcontext()
        out: dict[str, Tensor] = {}
        if "cond_pred" in teacher and "uncond_pred" in teacher:
            cond, uncond = (moved(teacher[k], device, dtype) for k in ("cond_pred", "uncond_pred"))
            with mode:
                # the run's combine (Denoiser.combine); a bare denoiser: qe.denoiser would join a --parallel group
                out["guided"] = upcast(Denoiser(qe.pipe.transformer).combine(cond, uncond, cfg.true_cfg))
        if "noise_pred" in teacher:
            out["latents_next"] = self._euler(cfg, p, i, inputs, teacher["noise_pred"], device, dtype, low)
        held = rounded(inputs["latents"], dtype).to(dtype) if low else moved(inputs["latents"], device, dtype)
        with mode:
            out["vae_input"] = upcast(qe.vae_input(held, p.height, p.width, vae_dtype))
        return out

    def _euler(self, cfg: RunConfig, p: Any, i: int, inputs: dict[str, Tensor], velocity: Tensor,
               device: torch.device, dtype: torch.dtype, low: bool) -> Tensor:
        """The scheduler's step ``i`` from ``inputs["latents"]`` with ``velocity`` (see :meth:`post_network_step`)."""
        t = inputs["timestep"].to(device, torch.float32).reshape(())
        if low:  # held in the device's dtype, stepped in float32, stored in the device's dtype
            x = rounded(inputs["latents"], dtype)
            v = rounded(velocity, dtype)
            nxt = self._scheduler_at(cfg, p, i, device).step(v, t, x, return_dict=False)[0]
            nxt = nxt.to(dtype)
        else:
            x = moved(inputs["latents"], device, dtype)
            v = moved(velocity, device, dtype)
            nxt = self._scheduler_at(cfg, p, i, device).step(v, t, x, return_dict=False)[0]
        return upcast(nxt)

    def _scheduler_at(self, cfg: RunConfig, p: Any, i: int, device: torch.device) -> Any:
        """A copy of the run's scheduler with this run's timesteps, about to take step ``i`` (the run's own
        scheduler keeps its state)."""
        qe = self.pipeline
        sched = copy.deepcopy(qe.pipe.scheduler)
        schedule(sched, p.noise.shape[1], qe._steps(cfg), device)
        sched.set_begin_index(i)
        return sched

    def modules(self) -> dict[str, nn.Module]:
        pipe = self.pipeline.pipe
        return {name: getattr(pipe, name) for name in ("text_encoder", "transformer", "vae")
                if isinstance(getattr(pipe, name, None), nn.Module)}

    def transformer_blocks(self) -> list[tuple[str, nn.Module]]:
        return [(f"transformer_blocks.{i}", block) for i, block in
                enumerate(self.pipeline.pipe.transformer.transformer_blocks)]

    # ---- components -------------------------------------------------------------------------------
    def _output_size(self, cfg: RunConfig) -> tuple[int, int]:
        """(height, width) of ``cfg``'s output, a square reference's default when unset."""
        width, height = fit_area(self.pipeline.settings.output_area, 1.0)
        return (cfg.height or height), (cfg.width or width)

    def _prompt_text(self, prompt: str, n_images: int) -> str:
        """The text the VL encoder sees: diffusers' template around the prompt (and Plus's picture markers)."""
        if self.pipeline.plus:
            prompt = "".join(f"Picture {k + 1}: <|vision_start|><|image_pad|><|vision_end|>"
                             for k in range(n_images)) + prompt
        return self.pipeline.pipe.prompt_template_encode.format(prompt)

    def component_inputs(self, cfg: RunConfig) -> dict[str, dict[str, Tensor]]:
        """CPU inputs for each of :data:`COMPONENTS`, drawn from ``cfg.seed`` and sized like ``cfg``'s run.

        The text encoder gets the processor's ids and pixels for ``cfg.prompt`` over the synthetic
        picture (resized as a real reference would be); the transformer random states of the run's
        image tokens plus :data:`SYNTHETIC_TEXT_TOKENS` text tokens; the VAE a reference-sized image
        to encode and output-sized latents to decode.
        """
        qe = self.pipeline
        pipe = qe.pipe
        gen = qe.backend.generator(cfg.seed)
        height, width = self._output_size(cfg)
        ref_w, ref_h = fit_area(qe.settings.reference_area, width / height)
        refs = qe.references([test_picture(width, height)])
        prompt_images = refs.prompt_images if isinstance(refs.prompt_images, list) else [refs.prompt_images]
        text = pipe.processor(
            text=[self._prompt_text(cfg.prompt, len(prompt_images))], images=prompt_images, padding=True,
            return_tensors="pt",
        )
        f = pipe.vae_scale_factor
        z = pipe.vae.config.z_dim
        cfg_t = pipe.transformer.config
        out_tokens = (height // (2 * f)) * (width // (2 * f))
        ref_tokens = (ref_h // (2 * f)) * (ref_w // (2 * f))
        return {
            "text_encoder": {k: text[k] for k in ("input_ids", "attention_mask", "pixel_values", "image_grid_thw")},
            "transformer": {
                "hidden_states": torch.randn(1, out_tokens + ref_tokens, cfg_t.in_channels, generator=gen),
                "encoder_hidden_states": torch.randn(1, SYNTHETIC_TEXT_TOKENS, cfg_t.joint_attention_dim, generator=gen),
                "timestep": torch.tensor([0.5]),
                "img_shapes": torch.tensor([[1, height // (2 * f), width // (2 * f)],
                                            [1, ref_h // (2 * f), ref_w // (2 * f)]]),
            },
            "vae_encode": {"sample": torch.rand(1, 3, 1, ref_h, ref_w, generator=gen) * 2 - 1},
            "vae_decode": {"latents": torch.randn(1, z, 1, height // f, width // f, generator=gen)},
        }

    @torch.inference_mode()
    def run_component(self, name: str, inputs: dict[str, Tensor]) -> Tensor:
        """Component ``name`` on ``inputs`` (from :meth:`component_inputs`) on the pipeline's device and
        dtype; CPU float32 out."""
        if name not in COMPONENTS:
            raise DifforgeError(f"Unknown component '{name}'; use one of {', '.join(COMPONENTS)}.")
        qe = self.pipeline
        pipe = qe.pipe
        qe.restore_weights()
        x = {k: moved(v, qe.device, qe.dtype) for k, v in inputs.items()}
        if name == "text_encoder":
            out = pipe.text_encoder(**x, output_hidden_states=True).hidden_states[-1]
        elif name == "transformer":
            img_shapes = [tuple(int(v) for v in row) for row in inputs["img_shapes"].tolist()]
            transformer = pipe.transformer
            cached = getattr(transformer, "is_cache_enabled", False)  # a --fast step cache (diffusers hooks)
            if cached:  # one full forward from an empty cache: what the first step of a run computes
                transformer._reset_stateful_cache()
            with transformer.cache_context("component") if cached else contextlib.nullcontext():
                out = transformer(
                    hidden_states=x["hidden_states"],
                    encoder_hidden_states=x["encoder_hidden_states"],
                    timestep=x["timestep"],
                    img_shapes=[img_shapes],
                    return_dict=False,
                )[0]
            if cached:
                transformer._reset_stateful_cache()
        elif name == "vae_encode":
            out = pipe.vae.encode(x["sample"]).latent_dist.mode()
        else:
            out = pipe.vae.decode(x["latents"], return_dict=False)[0]
        return upcast(out)

    # ---- FLOPs ------------------------------------------------------------------------------------
    def _text_lengths(self, cfg: RunConfig) -> tuple[list[list[tuple[int, int, int]]], int, int]:
        """(img_shapes, prompt tokens, negative-prompt tokens) without running any model.

        Uses the run's prepared state when it exists, else the tokenizer and image processor on
        ``cfg.images`` (the text length depends on the references' sizes).
        """
        qe = self.pipeline
        prepared = qe.cached_prepared(cfg)
        if prepared is not None:
            neg = prepared.negative_embeds.shape[1] if prepared.negative_embeds is not None else 0
            return prepared.img_shapes, int(prepared.prompt_embeds.shape[1]), int(neg)
        images = qe.images_of(cfg)
        height, width = qe.output_size(cfg, images)
        refs = qe.references(images)
        prompt_images = refs.prompt_images if isinstance(refs.prompt_images, list) else [refs.prompt_images]

        def length(prompt: str) -> int:
            ids = qe.pipe.processor(text=[self._prompt_text(prompt, len(prompt_images))], images=prompt_images,
                                    return_tensors="pt")["input_ids"]
            return int(ids.shape[1]) - DROPPED_PROMPT_TOKENS

        f = qe.pipe.vae_scale_factor * 2
        img_shapes = [[(1, height // f, width // f), *[(1, h // f, w // f) for w, h in refs.vae_sizes]]]
        negative = qe.negative_prompt_for(cfg)
        return img_shapes, length(cfg.prompt), (length(negative) if negative is not None else 0)

    def flops_per_step(self, cfg: RunConfig) -> dict[str, Any]:
        """Model FLOPs of one denoising step, counted by ``torch.utils.flop_counter.FlopCounterMode``.

        These are the FLOPs of the computation itself: one unpadded batch-1 forward per branch, as
        diffusers runs them.  With batched CFG the executed work adds the shorter text's padding rows
        (``padded_tokens_per_row``); MFU is quoted on the model FLOPs.

        The count runs the real transformer architecture (this pipeline's config) on the meta device
        with the run's exact token counts, so it costs no compute and no memory, and includes
        attention, projections, MLPs and modulation exactly as executed.
        """
        img_shapes, text, negative = self._text_lengths(cfg)
        config = {k: v for k, v in self.pipeline.pipe.transformer.config.items() if not k.startswith("_")}
        image_tokens = sum(prod(s) for s in img_shapes[0])
        lengths = [text] + ([negative] if negative else [])
        total = sum(count_forward_flops(config, img_shapes, n) for n in lengths)
        batched = len(lengths) == 2 and self.pipeline.denoiser(cfg).batched_cfg
        return {
            "forwards_per_step": len(lengths),
            # What actually executes: one batch-2 call with the shorter text padded, or the two calls.
            "transformer_calls_per_step": 1 if batched else len(lengths),
            "batch_per_call": 2 if batched else 1,
            "padded_tokens_per_row": image_tokens + max(lengths) if batched else None,
            "tokens_per_forward": image_tokens + text,
            "image_tokens": image_tokens,
            "text_tokens": text,
            "negative_text_tokens": negative,
            "flops_per_step": total,
            "method": "torch.utils.flop_counter.FlopCounterMode on a meta-device copy of the transformer",
        }

    # ---- operators --------------------------------------------------------------------------------
    @torch.inference_mode()
    def operator_cases(self, ref_device: torch.device, cfg: RunConfig, inputs: dict[str, Tensor],
                       adaptations: Sequence[Any]) -> list[OpCase]:
        """Block 0's first RMSNorm and its joint attention, captured by forward hooks on step 0.

        The ops are diffusers modules, so they are captured where they run: a forward hook keeps the
        first call's inputs and output.  The RMSNorm is replayed through
        :func:`~.overrides.reference_rms_norm`; the attention sub-module (projections, q/k norms, RoPE,
        kernel) is copied and rerun with difforge's processor over the plain SDPA kernel - the same
        processor as the port, so its RoPE tables and ragged CFG batch are understood - once in
        float32 on the CPU (the reference) and once at the device's dtype on ``ref_device`` (the
        floor).  ``adaptations`` (the run's record entries) name the implementation that ran.
        """
        from diffusers.models.normalization import RMSNorm

        blocks = self.transformer_blocks()
        if not blocks:
            return []
        first = blocks[0][1]
        norm = next((m for m in first.modules() if isinstance(m, RMSNorm)), None)
        attn = getattr(first, "attn", None)
        seen: dict[str, tuple[tuple, dict, Any]] = {}

        def keeper(key: str) -> Any:
            def hook(_m: Any, args: tuple, kwargs: dict, out: Any) -> None:
                if key not in seen:
                    kept = tuple(detach(o) for o in out) if isinstance(out, tuple) else detach(out)
                    seen[key] = (tuple(detach(a) for a in args), {k: detach(v) for k, v in kwargs.items()}, kept)
            return hook

        handles = []
        if norm is not None:
            handles.append(norm.register_forward_hook(keeper("rms_norm"), with_kwargs=True))
        if attn is not None:
            handles.append(attn.register_forward_hook(keeper("attention"), with_kwargs=True))
        try:
            self.forward_step(cfg, 0, inputs)
        finally:
            for h in handles:
                h.remove()
        adapt = {a.what: a for a in adaptations}
        dt = self.dtype
        cases: list[OpCase] = []
        if "rms_norm" in seen and norm is not None:
            cases.append(self._rms_norm_case(norm, seen["rms_norm"], adapt.get("rms_norm"), ref_device, dt))
        if "attention" in seen and attn is not None:
            cases.append(self._attention_case(attn, seen["attention"], adapt.get("attention"), ref_device, dt))
        return cases

    @staticmethod
    def _rms_norm_case(norm: nn.Module, call: tuple[tuple, dict, Any], a: Any, ref_device: torch.device,
                       dt: torch.dtype) -> OpCase:
        (x, *_), _, out = call
        w = norm.weight
        bias = getattr(norm, "bias", None)

        def run(xx: Tensor, ww: Tensor | None, bb: Tensor | None) -> Tensor:
            y = reference_rms_norm(xx, ww, norm.eps)
            return y + bb if bb is not None else y

        ref = run(upcast(x), None if w is None else upcast(w), None if bias is None else upcast(bias))
        flo = emulated(run, dt, x, w, bias)  # float32 kernels, rounded like the device: never its kernels
        return OpCase("rms_norm", a.choice if a else "diffusers RMSNorm", a.exact if a else True,
                      shapes(x), upcast(out), ref, flo)

    @staticmethod
    def _attention_case(attn: nn.Module, call: tuple[tuple, dict, Any], a: Any, ref_device: torch.device,
                        dt: torch.dtype) -> OpCase:
        args, kwargs, out = call

        def run_copy(device: torch.device, dtype: torch.dtype) -> Tensor:
            """A copy of the module with the plain processor.  The floor copy runs at the device's dtype on
            ``ref_device``: rounding only a composite module's output would be stricter than any bf16
            kernel; the traced operator rung judges each op inside it against an emulated floor."""
            mod = copy.deepcopy(attn).to(device=device, dtype=dtype)
            for sub in mod.modules():  # drop instance-level op overrides: the reference runs plain ops
                sub.__dict__.pop("forward", None)
            mod.set_processor(QwenJointAttnProcessor(attention=reference_attention))

            def mv(t: Any) -> Any:
                return moved(t, device, dtype) if isinstance(t, Tensor) else t

            res = mod(*(mv(x) for x in args), **{k: (tuple(mv(x) for x in v) if isinstance(v, tuple) else mv(v))
                                                 for k, v in kwargs.items()})
            return torch.cat([upcast(r).reshape(-1) for r in res])

        dut_out = torch.cat([upcast(r).reshape(-1) for r in out])
        hs = args[0] if args else kwargs.get("hidden_states")
        return OpCase("joint attention (block 0)", a.choice if a else "diffusers processor", a.exact if a else True,
                      shapes(hs) if isinstance(hs, Tensor) else "?", dut_out,
                      run_copy(torch.device("cpu"), torch.float32), run_copy(ref_device, dt),
                      note="whole attention sub-module (projections, q/k norm, RoPE, kernel)")
