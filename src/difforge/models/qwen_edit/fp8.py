"""Transformer-only FP8 re-packs: detect the form, convert it correctly, keep it in FP8.

Community FP8 files of the Qwen-Image-Edit transformer come in two forms (spec §3.1):

* **plain** - weights simply cast to ``float8_e4m3fn`` (or ``e5m2``); the value *is* the weight.
* **scaled** (ComfyUI "fp8_scaled"/"fp8mixed") - fp8 codes plus a per-tensor or per-output-channel
  ``weight_scale`` (older files: ``scale_weight``); the weight is ``code * scale``.  The files also
  carry ``input_scale``/``scale_input`` and ``comfy_quant`` tensors (used only for fp8 *activation*
  matmuls, which we do not do) and, for Edit-2511, an empty ``__index_timestep_zero__`` marker that
  means ``zero_cond_t=True``.  Keys may carry ComfyUI's ``model.diffusion_model.`` prefix.

diffusers' own single-file loader ignores the scales, which silently turns a scaled file into NaN.

How the weights are kept (the design choice): every Linear whose weight arrives in fp8 becomes an
:class:`Fp8Linear` that stores the fp8 codes (and the scale, if any) and dequantises to the compute
dtype inside its forward.  Storage is therefore 1 byte per weight for plain *and* scaled files -
dequantising a scaled file once at load would need 2 bytes per weight (the products are generally
not fp8-representable), i.e. the bf16 footprint the re-pack exists to avoid.  The transient cost is
one layer's weight in the compute dtype (for scaled weights, one float32 copy while the scale is
applied, so only one rounding happens).  We do not use diffusers' ``enable_layerwise_casting`` for
this: it has no notion of a scale, and it would also round biases and the deliberately-bf16 layers
of "mixed" files down to fp8.  Tensors that arrive in bf16/fp32 (biases, norms, mixed layers) and
fp8 tensors outside Linear weights are cast to the compute dtype.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...errors import CheckpointError
from ..checkpoint import check_safetensors_header, load_safetensors

COMFY_PREFIX = "model.diffusion_model."
ZERO_COND_MARKER = "__index_timestep_zero__"
WEIGHT_SCALE_NAMES = ("weight_scale", "scale_weight")
INPUT_SCALE_NAMES = ("input_scale", "scale_input")
QUANT_INFO_NAME = "comfy_quant"
#: safetensors header dtype -> torch dtype, for the float8 kinds we load.
FP8_HEADER_DTYPES = {"F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}
FLOAT_HEADER_DTYPES = {"F32", "F16", "BF16", "F64", *FP8_HEADER_DTYPES}


def fp8_name(dtype: torch.dtype) -> str:
    return {torch.float8_e4m3fn: "e4m3fn", torch.float8_e5m2: "e5m2"}.get(dtype, str(dtype).removeprefix("torch."))


@dataclass(frozen=True)
class Fp8FileInfo:
    """What :func:`inspect_transformer_file` learnt from a file's header, without reading tensors."""

    path: Path
    form: str  # "plain" | "scaled" | "unquantized"
    fp8_dtypes: tuple[str, ...]  # e.g. ("e4m3fn",)
    scale_layout: str | None  # "per-tensor" | "per-channel" | "per-tensor+per-channel" | None
    prefix: str  # "" or COMFY_PREFIX
    zero_cond_t: bool  # the file carries the 2511 marker
    fp8_tensors: int
    file_bytes: int

    @property
    def storage_dtype(self) -> torch.dtype | None:
        """The fp8 dtype most weights use (e4m3fn wins a tie), or None for an unquantized file."""
        if not self.fp8_dtypes:
            return None
        return torch.float8_e4m3fn if "e4m3fn" in self.fp8_dtypes else torch.float8_e5m2

    def describe(self) -> str:
        if self.form == "unquantized":
            text = "unquantized single-file transformer"
        else:
            text = f"{self.form} fp8 {'+'.join(self.fp8_dtypes)}"
            if self.scale_layout:
                text += f" ({self.scale_layout} scales)"
        if self.prefix:
            text += f", keys prefixed '{self.prefix}'"
        if self.zero_cond_t:
            text += ", zero_cond_t marker"
        return text


def _split_module(key: str) -> tuple[str, str]:
    module, _, leaf = key.rpartition(".")
    return module, leaf


def inspect_transformer_file(path: Path) -> Fp8FileInfo:
    """Detect a transformer-only file's form from its safetensors header."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"Missing transformer file {path}.")
    if path.suffix != ".safetensors":
        raise CheckpointError(f"{path} is not a .safetensors file; difforge reads safetensors only.")
    header = check_safetensors_header(path)
    keys = [k for k in header if k != "__metadata__"]
    if not keys:
        raise CheckpointError(f"{path} holds no tensors.")
    prefix = COMFY_PREFIX if all(k.startswith(COMFY_PREFIX) or k == ZERO_COND_MARKER for k in keys) else ""
    fp8: set[str] = set()
    layouts: set[str] = set()
    count = 0
    for key in keys:
        dtype = str(header[key].get("dtype"))
        leaf = _split_module(key)[1]
        if dtype in FP8_HEADER_DTYPES:
            fp8.add(fp8_name(FP8_HEADER_DTYPES[dtype]))
            count += 1
        elif leaf in WEIGHT_SCALE_NAMES:
            shape = list(header[key].get("shape", []))
            layouts.add("per-tensor" if len(shape) == 0 or shape == [1] or all(s == 1 for s in shape) else "per-channel")
        elif dtype not in FLOAT_HEADER_DTYPES and leaf != QUANT_INFO_NAME and key != ZERO_COND_MARKER:
            raise CheckpointError(
                f"{path}: tensor '{key}' has dtype {dtype}; difforge loads float8, bf16, fp16 and fp32 transformers only."
            )
    if layouts and not fp8:
        raise CheckpointError(f"{path} has weight scales but no float8 weights; it is not a known FP8 format.")
    form = "scaled" if layouts else ("plain" if fp8 else "unquantized")
    layout = "+".join(sorted(layouts, key=["per-tensor", "per-channel"].index)) if layouts else None
    return Fp8FileInfo(
        path=path,
        form=form,
        fp8_dtypes=tuple(sorted(fp8)),
        scale_layout=layout,
        prefix=prefix,
        zero_cond_t=any(k.removeprefix(prefix) == ZERO_COND_MARKER for k in keys),
        fp8_tensors=count,
        file_bytes=path.stat().st_size,
    )


@dataclass
class ConvertedState:
    """A file's tensors renamed to diffusers keys, with scales split out per module."""

    tensors: dict[str, torch.Tensor]
    scales: dict[str, torch.Tensor]  # module path -> float32 scale (scalar or [out, 1])
    dropped: list[str] = field(default_factory=list)  # input scales, comfy_quant, marker


def convert_state(raw: dict[str, torch.Tensor], info: Fp8FileInfo) -> ConvertedState:
    """Strip the prefix, pull scales out, drop tensors that only matter to fp8 activation matmuls."""
    out = ConvertedState({}, {})
    for key, value in raw.items():
        key = key.removeprefix(info.prefix)
        module, leaf = _split_module(key)
        if key == ZERO_COND_MARKER or leaf in INPUT_SCALE_NAMES or leaf == QUANT_INFO_NAME:
            out.dropped.append(key)
        elif leaf in WEIGHT_SCALE_NAMES:
            if module in out.scales:
                raise CheckpointError(f"{info.path} has two weight scales for '{module}'.")
            scale = value.to(torch.float32)
            out.scales[module] = scale.reshape(-1, 1) if scale.numel() > 1 else scale.reshape(())
        else:
            out.tensors[key] = value
    for module, scale in out.scales.items():
        weight = out.tensors.get(f"{module}.weight")
        if weight is None or weight.dtype not in FP8_HEADER_DTYPES.values():
            raise CheckpointError(f"{info.path}: '{module}' has a weight scale but no float8 weight.")
        if scale.ndim and scale.shape[0] != weight.shape[0]:
            raise CheckpointError(
                f"{info.path}: scale of '{module}' has {scale.shape[0]} channels, its weight {weight.shape[0]} rows."
            )
    return out


class Fp8Linear(nn.Module):
    """A Linear that keeps its weight as fp8 codes (optionally scaled) and computes in the input dtype.

    ``weight`` stays a Parameter named like nn.Linear's, so state-dict keys, offload hooks and
    ``.to(device)`` behave as for the original module.  Never call ``.to(dtype)`` on a model holding
    these: that would upcast the stored codes and lose the memory saving.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, scale: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = int(weight.shape[0]), int(weight.shape[1])
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.weight_scale: torch.Tensor | None
        if scale is None:
            self.weight_scale = None
        else:
            self.register_buffer("weight_scale", scale.to(torch.float32))

    def dequantized_weight(self, dtype: torch.dtype) -> torch.Tensor:
        if self.weight_scale is None:
            return self.weight.to(dtype)  # exact: every e4m3/e5m2 value is representable in bf16/fp16/fp32
        return (self.weight.to(torch.float32) * self.weight_scale).to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, self.dequantized_weight(x.dtype), bias)

    def extra_repr(self) -> str:
        kind = "scaled " if self.weight_scale is not None else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, {kind}{self.weight.dtype}"


@dataclass
class LoadedTransformer:
    model: nn.Module
    info: Fp8FileInfo
    config: dict[str, Any]
    weight_bytes: int


def module_weight_bytes(model: nn.Module) -> int:
    """Bytes held by a module's parameters and buffers (what sits in device memory)."""
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def _transformer_config(config_dir: Path, info: Fp8FileInfo) -> dict[str, Any]:
    from ..checkpoint import read_json

    config = {k: v for k, v in read_json(config_dir / "config.json").items() if not k.startswith("_")}
    if info.zero_cond_t:
        config["zero_cond_t"] = True
    return config


def _check_keys(info: Fp8FileInfo, state: ConvertedState, expected: dict[str, torch.Tensor]) -> None:
    """One sentence naming the first key that does not fit the config (missing, extra or misshaped)."""
    have = set(state.tensors)
    missing = sorted(set(expected) - have)
    extra = sorted(have - set(expected))
    if extra:
        raise CheckpointError(
            f"{info.path} has key '{info.prefix}{extra[0]}' that the transformer config does not know"
            f" ({len(extra)} unexpected); is it a Qwen-Image transformer?"
        )
    if missing:
        raise CheckpointError(
            f"{info.path} lacks key '{info.prefix}{missing[0]}' ({len(missing)} missing); the file does not match"
            " the model folder's transformer config."
        )
    for key in sorted(expected):
        if tuple(state.tensors[key].shape) != tuple(expected[key].shape):
            raise CheckpointError(
                f"{info.path}: '{info.prefix}{key}' has shape {list(state.tensors[key].shape)}, the config expects"
                f" {list(expected[key].shape)}."
            )


def load_transformer_file(
    path: Path, config_dir: Path, compute_dtype: torch.dtype, device: torch.device | str = "cpu"
) -> LoadedTransformer:
    """Build a ``QwenImageTransformer2DModel`` from a transformer-only safetensors file.

    The architecture comes from ``config_dir/config.json`` (the model folder's transformer config);
    ``zero_cond_t`` is switched on when the file carries the 2511 marker.  Parameters are created on
    the meta device and the file's tensors are assigned in place, so the fp8 codes are never
    upcast (peak host memory is about the file size).  With ``device`` set, safetensors reads every
    tensor straight onto that device and the model is assembled there.
    """
    from accelerate import init_empty_weights
    from diffusers import QwenImageTransformer2DModel

    info = inspect_transformer_file(path)
    config = _transformer_config(config_dir, info)
    try:
        with init_empty_weights():
            model = QwenImageTransformer2DModel.from_config(config)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{config_dir / 'config.json'} is not a valid transformer config ({exc}).") from None
    state = convert_state(load_safetensors(info.path, device), info)
    _check_keys(info, state, model.state_dict())

    fp8_dtypes = tuple(FP8_HEADER_DTYPES.values())
    for name, module in list(model.named_modules()):
        weight = state.tensors.get(f"{name}.weight")
        if not isinstance(module, nn.Linear) or weight is None or weight.dtype not in fp8_dtypes:
            continue
        bias = state.tensors.pop(f"{name}.bias", None)
        bias = None if bias is None else bias.to(compute_dtype)
        replacement = Fp8Linear(state.tensors.pop(f"{name}.weight"), bias, state.scales.pop(name, None))
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, replacement)
    rest = {k: v.to(compute_dtype) if v.is_floating_point() else v for k, v in state.tensors.items()}
    model.load_state_dict(rest, strict=False, assign=True)
    leftover = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if leftover:  # every key was checked above, so this is a defect in the conversion, not the file
        raise CheckpointError(f"{info.path}: '{leftover[0]}' was not filled from the file.")
    model.eval().requires_grad_(False)
    return LoadedTransformer(model, info, config, module_weight_bytes(model))


def quant_info(raw: torch.Tensor) -> dict[str, Any]:
    """Decode a ``comfy_quant`` tensor (JSON bytes) - used in diagnostics and tests."""
    return json.loads(bytes(raw.to(torch.uint8).tolist()).decode("utf-8"))
