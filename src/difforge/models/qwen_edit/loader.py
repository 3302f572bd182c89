"""Load a Qwen-Image-Edit(-Plus) diffusers pipeline safely and place it on a device.

Loading is strictly local and safetensors-only: the folder is checked first (see
:mod:`.folder`), then diffusers loads it with ``use_safetensors=True, local_files_only=True`` and
``trust_remote_code=False``.  diffusers does not hand that flag on to the transformers components,
and transformers *asks* on a terminal before importing custom code it was given no answer for, so
the text encoder, processor and tokenizer are loaded here with an explicit ``False``.  Each weighted
component is loaded on its own with its library's ``output_loading_info=True``, and the library's
report of missing, unexpected and misshaped keys decides whether the files match the config.
Every weight is checked to be finite once loaded.  A transformer-only FP8 file replaces the
folder's transformer (see :mod:`.fp8`).  Every device-specific choice made here (attention
kernel, weight format, memory plan) is written to the RunRecord.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ...config import RunConfig
from ...devices import Backend, dtype_name
from ...errors import CheckpointError, DifforgeError
from ...runtime.record import RunRecord
from ..checkpoint import check_finite, fp8_codes_finite, library_panics
from ..families import QWEN_EDIT_PLUS
from .compat import apply_processor_shim
from .folder import COMPONENTS, CheckedFolder, check_model_folder
from .fp8 import Fp8FileInfo, Fp8Linear, fp8_name, load_transformer_file, module_weight_bytes
from .memory import check_load_memory

if TYPE_CHECKING:
    from diffusers import DiffusionPipeline


@dataclass
class LoadedPipeline:
    pipe: DiffusionPipeline
    checked: CheckedFolder
    transformer_file: Fp8FileInfo | None


@contextmanager
def quiet_hf(quiet: bool) -> Iterator[None]:
    """Silence diffusers'/transformers' loading progress bars for ``--quiet`` runs."""
    if not quiet:
        yield
        return
    from diffusers.utils import logging as dlog
    from transformers.utils import logging as tlog

    d_on, t_on = dlog.is_progress_bar_enabled(), tlog.is_progress_bar_enabled()
    d_level, t_level = dlog.get_verbosity(), tlog.get_verbosity()
    dlog.disable_progress_bar()
    tlog.disable_progress_bar()
    dlog.set_verbosity_error()
    tlog.set_verbosity_error()
    try:
        yield
    finally:
        dlog.set_verbosity(d_level)
        tlog.set_verbosity(t_level)
        if d_on:
            dlog.enable_progress_bar()
        if t_on:
            tlog.enable_progress_bar()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else exc.__class__.__name__


def load_pipeline(
    folder: Path,
    dtype: torch.dtype,
    record: RunRecord,
    transformer_file: str | None = None,
    quiet: bool = False,
    transformer_device: torch.device | str = "cpu",
    backend: Backend | None = None,
    cfg: RunConfig | None = None,
) -> LoadedPipeline:
    """Check ``folder`` and load its edit pipeline on the CPU in ``dtype`` (fp8 transformer if given).

    A transformer-only file is read straight onto ``transformer_device`` (safetensors loads each
    tensor there; nothing is staged in host memory beyond the mmap), so an fp8 file never exists as
    a host copy plus a device copy.  The folder's own components load on the CPU and move later.
    Before any weight is read, the memory the load and ``cfg``'s size will need on ``backend`` (the
    host when None) is estimated from the configs, and a load that cannot fit is refused
    (:func:`.memory.check_load_memory`): otherwise 58 GB would be read before the out-of-memory.
    """
    import diffusers

    apply_processor_shim()
    folder = Path(folder)
    checked = check_model_folder(folder, skip_weights=frozenset({"transformer"}) if transformer_file else frozenset())
    check_load_memory(folder, backend, dtype, cfg or RunConfig(model=str(folder)), checked.family == QWEN_EDIT_PLUS,
                      record, transformer_file)
    cls = getattr(diffusers, checked.pipeline_class)
    components: dict[str, Any] = {}
    info: Fp8FileInfo | None = None
    if transformer_file:
        loaded = load_transformer_file(Path(transformer_file), folder / "transformer", dtype, device=transformer_device)
        components["transformer"] = loaded.model
        info = loaded.info
    try:
        with quiet_hf(True):  # difforge shows its own progress; HF loading bars are noise on stderr
            components["text_encoder"] = _load_text_encoder(folder / "text_encoder", dtype)
            for name in ("vae",) if transformer_file else ("transformer", "vae"):
                components[name] = _load_diffusers_model(folder / name, COMPONENTS[name][1], dtype)
            components.update(_load_text_side(folder))
            pipe = cls.from_pretrained(
                str(folder), dtype=dtype, use_safetensors=True, local_files_only=True, trust_remote_code=False,
                **components,
            )
    except DifforgeError:
        raise
    except Exception as exc:  # diffusers/transformers raise many types for a bad component
        raise CheckpointError(
            f"Could not load the pipeline in {folder} ({exc.__class__.__name__}: {_first_line(exc)})."
        ) from None
    for name in ("transformer", "vae", "text_encoder"):
        check_no_meta(getattr(pipe, name), folder / name)
    for name in ("transformer", "vae", "text_encoder"):
        where = info.path if name == "transformer" and info is not None else folder / name
        check_finite_weights(getattr(pipe, name), where, dtype)
    pipe.set_progress_bar_config(disable=True)  # difforge draws its own progress
    _record_weights(pipe, dtype, info, record)
    return LoadedPipeline(pipe, checked, info)


def _bad_key(where: Path, report: dict[str, Any]) -> None:
    """One sentence naming the first missing (else unexpected, else misshaped) weight of a loading report.

    ``report`` is what diffusers' and transformers' ``from_pretrained(..., output_loading_info=True)``
    return: both compare the files' keys with the model the config builds (after their own renames
    and weight tying), so the comparison is theirs; only the refusal is difforge's.  Loading itself
    only logs these, and :func:`quiet_hf` silences that log.
    """
    missing = sorted(report.get("missing_keys", ()))
    if missing:
        raise CheckpointError(
            f"{where} lacks weight '{missing[0]}' ({len(missing)} missing); the file does not match its config."
        )
    unexpected = sorted(report.get("unexpected_keys", ()))
    if unexpected:
        raise CheckpointError(
            f"{where} has unexpected weight '{unexpected[0]}' ({len(unexpected)} extra); the file does not match"
            " its config."
        )
    mismatched = sorted(report.get("mismatched_keys", ()))
    if mismatched:
        raise CheckpointError(f"{where} weight '{mismatched[0][0]}' has a shape its config does not imply.")


def _load_diffusers_model(component: Path, class_name: str, dtype: torch.dtype) -> Any:
    """A diffusers model component (transformer, VAE), loaded as the pipeline would load it, with its report.

    The keyword arguments are those diffusers' pipeline loader passes to a sub-model, so the weights
    are the ones ``DiffusionPipeline.from_pretrained`` would give; ``class_name`` is the fixed class
    :data:`.folder.COMPONENTS` admits for the component, never one named by the folder.
    """
    import diffusers

    model, report = getattr(diffusers, class_name).from_pretrained(
        str(component), torch_dtype=dtype, use_safetensors=True, local_files_only=True, output_loading_info=True,
    )
    _bad_key(component, report)
    return model


def check_no_meta(module: torch.nn.Module, component: Path) -> None:
    """No parameter or buffer may be left on the meta device (a weight the files never provided).

    The loading reports list the keys the files lack, but neither library refuses a model left
    partly on the meta device; this is the invariant the reports are trusted to imply.
    """
    for key, tensor in [*module.named_parameters(), *module.named_buffers()]:
        if tensor.is_meta:
            raise CheckpointError(f"{component} lacks weight '{key}'; the file does not match its config.")


def _load_text_encoder(component: Path, dtype: torch.dtype) -> Any:
    """The Qwen2.5-VL text encoder, with transformers' own report of missing and unexpected keys.

    transformers renames the files' keys (``model.layers.*`` -> ``model.language_model.layers.*`` and
    so on) and ties weights while loading, so its loading report - not a comparison of names - is
    what says whether the files match the config.
    """
    from transformers import Qwen2_5_VLForConditionalGeneration

    model, report = Qwen2_5_VLForConditionalGeneration.from_pretrained(
        str(component), dtype=dtype, use_safetensors=True, local_files_only=True, output_loading_info=True,
        trust_remote_code=False,
    )
    _bad_key(component, report)
    return model


def _load_text_side(folder: Path) -> dict[str, Any]:
    """The processor and tokenizer, loaded exactly as diffusers would but with ``trust_remote_code=False``.

    Their classes are the fixed ones :data:`.folder.COMPONENTS` admits; the flag reaches the Auto
    classes they use inside (AutoImageProcessor, AutoTokenizer ...), so a config asking for custom
    code is refused without a prompt even if it got past the folder check.
    """
    import transformers

    out = {}
    for name in ("processor", "tokenizer"):
        cls = getattr(transformers, COMPONENTS[name][1])
        try:
            with library_panics(str(folder / name)):
                out[name] = cls.from_pretrained(str(folder / name), local_files_only=True, trust_remote_code=False)
        except OSError as exc:  # a file transformers wants is missing: its message, as one line
            reason = " ".join(str(exc).split()).split(". If you were trying")[0]
            raise CheckpointError(f"{folder / name} does not load as {cls.__name__}: {reason}.") from None
    return out


def check_finite_weights(module: torch.nn.Module, where: Path, dtype: torch.dtype) -> None:
    """Every weight the files gave ``module`` is finite in ``dtype``, else one sentence naming the first bad key.

    Floating tensors are checked by :func:`~difforge.models.checkpoint.check_finite` (tied weights
    once).  fp8 codes of an :class:`.fp8.Fp8Linear` are checked as they are used: without NaN/inf
    codes and, with their scale applied, within ``dtype``'s range (see :func:`_fp8_finite`).
    """
    seen: set[int] = set()
    tensors = []
    for key, tensor in module.state_dict(keep_vars=True).items():
        if id(tensor) not in seen:
            seen.add(id(tensor))
            tensors.append((key, tensor))
    check_finite(where, tensors)
    for name, layer in module.named_modules():
        if isinstance(layer, Fp8Linear) and not _fp8_finite(layer, dtype):
            raise CheckpointError(
                f"{where} weight '{name}.weight' is NaN or infinite once its fp8 scale is applied in"
                f" {dtype_name(dtype)}; the file is corrupt."
            )


def _fp8_finite(layer: Fp8Linear, dtype: torch.dtype) -> bool:
    """fp8 codes are judged by their bits and the scale's bound, without a ``dtype`` copy of every layer.

    NaN and infinity codes are found by :func:`~difforge.models.checkpoint.fp8_codes_finite`.
    Finite codes times the scale stay finite in ``dtype`` when
    ``max|scale| * fp8 max`` fits; only a layer whose bound does not fit is dequantised, exactly as
    its forward does, and checked element by element.
    """
    weight = layer.weight
    if weight.numel() == 0:
        return True
    if not fp8_codes_finite(weight):
        return False
    if layer.weight_scale is None:
        return True  # 448 (e4m3fn) and 57344 (e5m2) fit bf16, fp16 and fp32
    bound = float(layer.weight_scale.abs().amax()) * torch.finfo(weight.dtype).max
    if bound <= torch.finfo(dtype).max:
        return True
    return bool(torch.isfinite(layer.dequantized_weight(dtype)).all())


def _record_weights(pipe: DiffusionPipeline, dtype: torch.dtype, info: Fp8FileInfo | None, record: RunRecord) -> None:
    transformer = pipe.transformer
    record.extra["transformer_weight_bytes"] = module_weight_bytes(transformer)
    record.extra["zero_cond_t"] = bool(transformer.config.get("zero_cond_t", False))
    if info is None:
        record.extra["fp8_form"] = None
        record.adapt("transformer weights", f"{dtype_name(dtype)} (model folder)")
        return
    record.extra["fp8_form"] = info.form if info.form != "unquantized" else None
    record.extra["transformer_file"] = {
        "path": str(info.path),
        "form": info.describe(),
        "file_bytes": info.file_bytes,
        "zero_cond_t_marker": info.zero_cond_t,
    }
    if info.storage_dtype is None:
        record.adapt("transformer weights", f"{dtype_name(dtype)} from single file", detail=info.describe())
        return
    scaled = ", scales applied per forward" if info.form == "scaled" else ""
    record.adapt(
        "transformer weights",
        f"fp8 {fp8_name(info.storage_dtype)} storage, {dtype_name(dtype)} compute",
        exact=False,
        detail=f"{info.describe()}{scaled}; biases, norms and non-fp8 tensors in {dtype_name(dtype)}",
    )


#: How the record names a diffusers attention backend other than ``native`` that a device may ask for.
FUSED_ATTENTION_LABELS = {"_native_npu": "torch_npu.npu_fusion_attention (diffusers '_native_npu')"}
NATIVE_ATTENTION_LABEL = "torch SDPA (diffusers 'native')"


def choose_attention(
    pipe: DiffusionPipeline, backend: Backend, dtype: torch.dtype, record: RunRecord, allow_npu: bool = True
) -> str:
    """Set the attention kernel the backend chooses (:meth:`~difforge.devices.Backend.diffusers_attention`).

    The device decides: its fused kernel where it applies (the NPU's ``_native_npu`` in bf16/fp16),
    else PyTorch SDPA, with the reason it gives.  SDPA itself picks flash / cuDNN / memory-efficient
    kernels on CUDA; difforge's processor never hands it a padding mask (see :mod:`.attention`), so
    those fused kernels stay eligible, and ``_native_npu`` inverts SDPA's mask polarity for
    ``npu_fusion_attention`` where a mask is passed at all.  ``allow_npu=False`` (``--disable
    npu-attention``) asks for no fused kernel.  A kernel diffusers refuses (torch_npu missing) leaves
    SDPA in place, and the record says why.
    """
    transformer = pipe.transformer
    name, why = backend.diffusers_attention(dtype, allow_fused=allow_npu)
    if name != "native":
        try:
            transformer.set_attention_backend(name)
        except Exception as exc:  # the kernel's library is missing or refused: keep SDPA and say why
            name, why = "native", f"{name} refused: {_first_line(exc)}"
        else:
            record.adapt("attention", FUSED_ATTENTION_LABELS.get(name, f"diffusers '{name}'"))
            return name
    _back_to_native(transformer)
    record.adapt("attention", NATIVE_ATTENTION_LABEL, detail=why)
    return "native"


def _back_to_native(transformer: Any) -> None:
    """A reused pipeline that ran ``_native_npu`` before goes back to SDPA explicitly.

    (``reset_attention_backend`` would fall back to diffusers' process-wide active backend, which
    ``set_attention_backend`` has made ``_native_npu``.)
    """
    blocks = getattr(transformer, "transformer_blocks", None)
    current = getattr(blocks[0].attn.processor, "_attention_backend", None) if blocks else None
    if current is not None and str(getattr(current, "value", current)) != "native":
        transformer.set_attention_backend("native")


def place(pipe: DiffusionPipeline, backend: Backend, plan: str, vae_tiling: bool, record: RunRecord) -> None:
    """Apply the memory plan: where each component lives and when it moves.

    ``plan`` is one of :data:`difforge.config.OFFLOAD_PLANS` (``RunConfig.validate`` refuses any other).
    """
    if plan in ("model", "sequential"):
        if backend.is_host:
            raise DifforgeError(
                f"--offload {plan} moves weights between the host and an accelerator, but the device is the CPU;"
                " use --offload none or before-decode."
            )
        try:
            if plan == "model":
                pipe.enable_model_cpu_offload(device=backend.device)
            else:
                pipe.enable_sequential_cpu_offload(device=backend.device)
        except (RuntimeError, ValueError) as exc:
            raise DifforgeError(f"--offload {plan} needs an accelerator diffusers can drive ({_first_line(exc)}).") from None
        detail = {
            "model": "accelerate hooks move one whole component to the device when it runs",
            "sequential": "accelerate hooks stream every layer's weights to the device (slow, least memory)",
        }[plan]
        record.adapt("offload", f"diffusers enable_{plan}_cpu_offload", detail=detail)
    else:  # none, before-decode: the whole pipeline lives on the device
        pipe.to(backend.device)
        record_offload(plan, record)
    set_vae_tiling(pipe, vae_tiling, record)


def record_offload(plan: str, record: RunRecord) -> None:
    """The record entry of a plan that keeps the whole pipeline on the device (``none`` has none)."""
    if plan == "before-decode":
        record.adapt("offload", "before-decode", detail="transformer and text encoder move to the host before VAE decode")
    else:
        record.adaptations = [a for a in record.adaptations if a.what != "offload"]


def set_vae_tiling(pipe: DiffusionPipeline, enabled: bool, record: RunRecord) -> None:
    """Switch diffusers' VAE tiling on or off (a per-run choice) and record it while on."""
    if enabled:
        pipe.vae.enable_tiling()
        record.adapt("vae", "tiled decode/encode", exact=False, detail="diffusers AutoencoderKLQwenImage tiling")
        return
    if getattr(pipe.vae, "use_tiling", False):
        pipe.vae.disable_tiling()
    record.adaptations = [a for a in record.adaptations if a.what != "vae"]
