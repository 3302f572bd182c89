"""How much memory a Qwen-Image-Edit load and an edit call need, estimated from the configs alone.

Nothing here allocates a real tensor.  Parameter counts come from the model classes built on the
meta device: the transformer as its outer layers (built with ``num_layers=0``) plus *one*
``QwenImageTransformerBlock`` times ``num_layers``, the Qwen2.5-VL text encoder built with one
decoder layer and one vision block, each multiplied out, and the VAE whole (0.13 B parameters).
A config promising 10^5 layers is therefore refused before anything is built layer by layer.
Weights are counted in the dtype they will be *held* in: the run dtype for every folder
component (diffusers and transformers load them with ``dtype=``, so a bf16 folder held in
float32 on the CPU counts twice its file size), and 1 byte for each fp8 Linear weight of a
transformer-only file (:mod:`.fp8` keeps the codes), its header read without the tensors.

The offload plan decides what is on the device at once (``config.OFFLOAD_PLANS``, see
:func:`.loader.place`):

* ``none`` - every component, always;
* ``before-decode`` - every component until the decode, then only the VAE;
* ``model`` - one component at a time (accelerate moves each in as it runs);
* ``sequential`` - one module's weights at a time (the largest leaf: the text encoder's 152k-row
  embedding, 1.1 GB in bf16).

The activation estimate of a call adds up the large tensors alive at once in its four phases:

* text encode - the Qwen2.5-VL pass over ``template + prompt + vision tokens`` (the prompt counted
  as one token per UTF-8 byte, an upper bound; vision tokens from the processor's resize rule):
  every layer's hidden state (diffusers asks for all of them), one layer's working set and the
  vocabulary logits; plus the vision tower over the reference's patches;
* reference encode - the VAE encoder on one reference (they are encoded one by one);
* denoise - ``rows`` = 2 with batched CFG, else 1 (the two CFG calls then run one after the other)
  sequences of ``output + reference image tokens + text tokens``, image tokens being
  ``(H / 16) x (W / 16)`` per image: one block's working set (:data:`BLOCK_UNITS` hidden-sized
  tensors), the per-token modulation of ``zero_cond_t`` models, and an fp8 Linear's transient
  dequantised weight;
* decode - the VAE decoder at the output size: every causal convolution keeps its input frame
  in the decoder's feature cache until the decode ends (that sum dominates), plus the working set of
  the widest full-resolution stage.  ``--vae-tiling`` bounds encode and decode to one tile.

Attention scores are counted only on backends whose kernel materialises them
(:attr:`~difforge.devices.Backend.attention_materialises_scores`).  Weights already on the device
are not part of a call's need (the backend's available memory already excludes them); weights an
offload plan brings in for a phase are.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from ...config import OFFLOAD_PLANS  # leanest last: a refusal suggests the first later plan that fits
from ...devices import Backend
from ...devices.cpu import CPUBackend
from ...errors import DifforgeError
from ...runtime.memory import MemoryEstimate, check_memory, format_bytes
from ...runtime.meta import on_meta
from ..checkpoint import check_safetensors_header, read_json
from .references import fit_area

if TYPE_CHECKING:
    import PIL.Image

    from ...config import RunConfig
    from ...runtime.record import RunRecord
    from .settings import EditSettings

#: Hidden-sized (tokens x dim) tensors alive at the peak of one transformer block: the block's
#: input, normed and modulated streams, q/k/v and their RoPE'd and concatenated copies, the float32
#: RoPE temporaries, the attention output and projection; the MLP phase (4x-wide projection and
#: GELU output) is about as large.  Measured on the CPU: tiny-qwen-edit's
#: transformer at 18.7k tokens x 2 rows peaks at 133 MiB, estimated 124 MiB.
BLOCK_UNITS = 18
#: Tokens the prompt template adds around the user's prompt (system prompt, markers), as an upper
#: bound in bytes: the byte-level tiny tokenizer spends one token per byte, the real one fewer.
TEMPLATE_TOKENS = 400
PLUS_IMAGE_TOKENS = 40  # "Picture k: " and the vision markers per reference (Edit-Plus)
DROPPED_TEXT_TOKENS = 64  # the system prompt's hidden states are dropped before the transformer
#: Channel-sized planes alive in a VAE residual block besides the feature cache: the block's input,
#: the normalised/activated copy, the causally padded (3-frame) convolution input, the output and
#: the convolution's own reorders.  Measured on the CPU (float32, peak RSS): with 9 the real-layout
#: decoder is estimated at 87% of its peak at 384x384, the tiny one at 98% at 2048x2048
#: (the encoders at 97% and about 120%).
RESBLOCK_UNITS = 9
#: The Qwen2-VL processor's defaults (real checkpoints): patch 14, 2x2 merge, pixel bounds.
VISION_DEFAULTS = {"patch_size": 14, "merge_size": 2, "min_pixels": 56 * 56, "max_pixels": 28 * 28 * 1280}


class LoadedEdit(Protocol):
    """What the call estimate reads of a loaded pipeline (``QwenEditPipeline`` is one).

    Spelled out here so this module stays below the pipeline: the pipeline asks memory before a
    call, never the other way round.
    """

    pipe: Any  # the diffusers pipeline: transformer, text_encoder, vae
    backend: Backend
    dtype: torch.dtype
    folder: Path
    settings: EditSettings
    offload: str
    vae_tiling: bool

    @property
    def plus(self) -> bool: ...


# ---- parameters --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModuleCount:
    """Elements of one component: all of them, the largest single module's own, the largest Linear's."""

    params: int
    largest_leaf: int
    largest_linear: int = 0


def _own(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters(recurse=False))


def _count(module: nn.Module) -> ModuleCount:
    """Parameters plus floating buffers (what is moved to the device), and the largest leaf's."""
    total = sum(p.numel() for p in module.parameters())
    total += sum(b.numel() for b in module.buffers() if b.is_floating_point())
    leaf = max((_own(m) for m in module.modules()), default=0)
    linear = max((m.weight.numel() for m in module.modules() if isinstance(m, nn.Linear)), default=0)
    return ModuleCount(total, leaf, linear)


@contextlib.contextmanager
def _meta() -> Iterator[None]:
    with on_meta():
        yield


def _transformer_config(config: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in config.items() if not k.startswith("_")}


def _transformer_parts(config: dict[str, Any]) -> tuple[nn.Module, nn.Module, int]:
    """The transformer's outer layers (``num_layers=0``), one block, and the block count, on meta."""
    from diffusers import QwenImageTransformer2DModel
    from diffusers.models.transformers.transformer_qwenimage import QwenImageTransformerBlock

    config = _transformer_config(config)
    layers = int(config.get("num_layers", 60))
    with _meta():
        outer = QwenImageTransformer2DModel.from_config({**config, "num_layers": 0})
        heads, head_dim = outer.config.num_attention_heads, outer.config.attention_head_dim
        block = QwenImageTransformerBlock(heads * head_dim, heads, head_dim, zero_cond_t=outer.config.zero_cond_t)
    return outer, block, layers


def transformer_count(config: dict[str, Any]) -> ModuleCount:
    """Parameters of ``QwenImageTransformer2DModel(**config)`` from its outer layers and one block."""
    outer, block, layers = _transformer_parts(config)
    o, b = _count(outer), _count(block)
    return ModuleCount(o.params + layers * b.params, max(o.largest_leaf, b.largest_leaf),
                       max(o.largest_linear, b.largest_linear))


def transformer_parameters(config: dict[str, Any]) -> int:
    """Parameter count of the edit transformer for ``config`` (20,430,401,088 for the real one)."""
    return transformer_count(config).params


def fp8_elements(config: dict[str, Any], header: dict[str, Any], prefix: str) -> tuple[int, int]:
    """(fp8 Linear weight elements, weight-scale elements) a transformer-only file's header declares.

    Only Linear weights stay fp8 (:class:`.fp8.Fp8Linear`); other fp8 tensors are cast to the compute
    dtype, so they are not counted here.
    """
    from .fp8 import FP8_HEADER_DTYPES, WEIGHT_SCALE_NAMES

    outer, block, _ = _transformer_parts(config)
    outer_linear = {f"{n}.weight" for n, m in outer.named_modules() if isinstance(m, nn.Linear)}
    block_linear = {f"{n}.weight" for n, m in block.named_modules() if isinstance(m, nn.Linear)}
    fp8 = scales = 0
    for key, meta in header.items():
        if key == "__metadata__" or not isinstance(meta, dict):
            continue
        name = key.removeprefix(prefix)
        numel = math.prod(int(s) for s in meta.get("shape", []))
        if name.rpartition(".")[2] in WEIGHT_SCALE_NAMES:
            scales += numel
            continue
        if str(meta.get("dtype")) not in FP8_HEADER_DTYPES:
            continue
        parts = name.split(".", 2)
        in_block = len(parts) == 3 and parts[0] == "transformer_blocks" and parts[1].isdigit() and parts[2] in block_linear
        if in_block or name in outer_linear:
            fp8 += numel
    return fp8, scales


def text_encoder_count(cfg: Any) -> ModuleCount:
    """Parameters of the Qwen2.5-VL text encoder (``cfg``: its config) from one layer and one vision block on meta."""
    from transformers import Qwen2_5_VLForConditionalGeneration

    layers, depth = int(cfg.text_config.num_hidden_layers), int(cfg.vision_config.depth)
    small = copy.deepcopy(cfg)
    small.text_config.num_hidden_layers = 1
    if getattr(small.text_config, "layer_types", None):
        small.text_config.layer_types = list(small.text_config.layer_types)[:1]
    small.vision_config.depth = 1
    with _meta():
        model = Qwen2_5_VLForConditionalGeneration(small)
    base = _count(model)
    layer = _count(model.model.language_model.layers[0]).params
    block = _count(model.model.visual.blocks[0]).params
    return ModuleCount(base.params + (layers - 1) * layer + (depth - 1) * block, base.largest_leaf, base.largest_linear)


def vae_count(config: dict[str, Any]) -> ModuleCount:
    """Parameters of the whole ``AutoencoderKLQwenImage`` (encoder included: references are encoded)."""
    from diffusers import AutoencoderKLQwenImage

    with _meta():
        vae = AutoencoderKLQwenImage.from_config(_transformer_config(config))
    return _count(vae)


# ---- weights as held ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Weights:
    """Bytes each component holds in the dtype it is held in, and what offloading streams at once."""

    transformer: int
    text_encoder: int
    vae: int
    largest_leaf: int  # the most one module holds (``sequential`` streams one at a time)
    fp8_layer: int = 0  # the transient compute-dtype copy of the largest fp8 Linear (0: no fp8)
    transformer_on_host: bool = True  # False: an fp8 file read straight onto the device

    @property
    def total(self) -> int:
        return self.transformer + self.text_encoder + self.vae

    def parts(self) -> dict[str, int]:
        return {"transformer_weights": self.transformer, "text_encoder_weights": self.text_encoder,
                "vae_weights": self.vae}


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


def weights_for(tcfg: dict[str, Any], te_cfg: Any, vcfg: dict[str, Any], dtype: torch.dtype,
                fp8_header: dict[str, Any] | None = None, prefix: str = "", scaled: bool = False) -> Weights:
    """What the three components hold in ``dtype``, from their configs (and an fp8 file's header)."""
    size = _itemsize(dtype)
    t, te, v = transformer_count(tcfg), text_encoder_count(te_cfg), vae_count(vcfg)
    t_bytes, fp8_layer = t.params * size, 0
    if fp8_header is not None:
        fp8, scales = fp8_elements(tcfg, fp8_header, prefix)
        t_bytes = (t.params - fp8) * size + fp8 + 4 * scales
        if fp8:
            fp8_layer = t.largest_linear * (size + (4 if scaled else 0))
    leaf = max(t.largest_leaf, te.largest_leaf, v.largest_leaf) * size
    return Weights(t_bytes, te.params * size, v.params * size, leaf, fp8_layer)


def weights_from_configs(folder: Path, dtype: torch.dtype, transformer_file: str | None = None) -> Weights:
    """What loading ``folder`` in ``dtype`` will hold (a transformer-only file replacing its transformer)."""
    from .fp8 import inspect_transformer_file

    header, prefix, scaled = None, "", False
    if transformer_file:
        info = inspect_transformer_file(Path(transformer_file))
        if info.storage_dtype is not None:
            header, prefix, scaled = check_safetensors_header(info.path), info.prefix, info.form == "scaled"
    return weights_for(read_json(folder / "transformer" / "config.json"), text_config(folder),
                       read_json(folder / "vae" / "config.json"), dtype, header, prefix, scaled)


def module_bytes(module: nn.Module) -> int:
    """Bytes a loaded module's parameters and buffers hold now (fp8 codes at 1 byte)."""
    return sum(t.numel() * t.element_size() for t in [*module.parameters(), *module.buffers()])


def _on_device(module: nn.Module) -> bool:
    """Whether a loaded module's weights are on the accelerator now (not on the host, not offloaded to meta)."""
    first = next(module.parameters(), None)
    return first is not None and first.device.type not in ("cpu", "meta")


def weights_of(pipe: LoadedEdit) -> Weights:
    """What a loaded pipeline's components hold, measured from the modules themselves."""
    from .fp8 import Fp8Linear

    p = pipe.pipe
    leaf = max((sum(t.numel() * t.element_size() for t in m.parameters(recurse=False))
                for c in (p.transformer, p.text_encoder, p.vae) for m in c.modules()), default=0)
    fp8 = [m for m in p.transformer.modules() if isinstance(m, Fp8Linear)]
    size = _itemsize(pipe.dtype)
    fp8_layer = max((m.weight.numel() * (size + (4 if m.weight_scale is not None else 0)) for m in fp8), default=0)
    return Weights(module_bytes(p.transformer), module_bytes(p.text_encoder), module_bytes(p.vae), leaf, fp8_layer)


# ---- activations -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shapes:
    """What one call processes: output size, the references as the VAE and the VL encoder see them."""

    height: int
    width: int
    references: tuple[tuple[int, int], ...]  # (width, height) of each reference the VAE encodes
    vision: tuple[tuple[int, int], ...]  # (width, height) of each image the VL encoder sees
    prompt_bytes: int
    guided: bool
    batched_cfg: bool
    plus: bool


def shapes_for(cfg: RunConfig, settings: EditSettings, plus: bool, height: int, width: int,
               images: list[PIL.Image.Image] | None = None) -> Shapes:
    """The call's shapes; without images (at load) the references are taken as square."""
    from .loop import SpeedOptions

    aspects = [im.width / im.height for im in images] if images else [1.0] * max(1, len(cfg.images) if plus else 1)
    refs = tuple(fit_area(settings.reference_area, a) for a in aspects)
    vision = tuple(fit_area(settings.condition_area, a) for a in aspects) if plus else refs
    negative = cfg.negative_prompt if cfg.negative_prompt is not None else " "
    prompt_bytes = max(len(cfg.prompt.encode("utf-8")), len(negative.encode("utf-8")))
    return Shapes(height, width, refs, vision, prompt_bytes, cfg.true_cfg > 1,
                  SpeedOptions.from_config(cfg).batched_cfg, plus)


def vision_patches(width: int, height: int, processor: dict[str, Any]) -> int:
    """Patches the Qwen2-VL image processor makes of a ``width x height`` image (its ``smart_resize``)."""
    patch, merge = int(processor["patch_size"]), int(processor["merge_size"])
    factor, lo, hi = patch * merge, int(processor["min_pixels"]), int(processor["max_pixels"])
    h, w = max(factor, round(height / factor) * factor), max(factor, round(width / factor) * factor)
    if h * w > hi:
        beta = math.sqrt(height * width / hi)
        h, w = max(factor, math.floor(height / beta / factor) * factor), max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < lo:
        beta = math.sqrt(lo / (height * width))
        h, w = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return (h // patch) * (w // patch)


def processor_settings(folder: Path) -> dict[str, Any]:
    """Patch/merge size and pixel bounds of the image processor (defaults otherwise).

    Read from ``processor/preprocessor_config.json`` (the published layout) or, for folders saved by
    transformers 5, the ``image_processor`` nested in ``processor/processor_config.json``.
    """
    out = dict(VISION_DEFAULTS)
    for name in ("preprocessor_config.json", "processor_config.json"):
        if (folder / "processor" / name).is_file():
            break
    with contextlib.suppress(DifforgeError):
        data = read_json(folder / "processor" / name)
        image = data.get("image_processor", data)
        size = image.get("size") if isinstance(image.get("size"), dict) else {}
        for key, value in (("patch_size", image.get("patch_size")), ("merge_size", image.get("merge_size")),
                           ("min_pixels", image.get("min_pixels", size.get("shortest_edge"))),
                           ("max_pixels", image.get("max_pixels", size.get("longest_edge")))):
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                out[key] = value
    return out


def text_tokens(shapes: Shapes, processor: dict[str, Any]) -> tuple[int, int]:
    """(tokens the text encoder sees, text tokens the transformer gets), both upper bounds."""
    merge = int(processor["merge_size"]) ** 2
    vision = sum(vision_patches(w, h, processor) // merge for w, h in shapes.vision)
    encoder = TEMPLATE_TOKENS + shapes.prompt_bytes + vision + (PLUS_IMAGE_TOKENS * len(shapes.vision) if shapes.plus else 0)
    return encoder, max(1, encoder - DROPPED_TEXT_TOKENS)


def transformer_forward_bytes(config: dict[str, Any], rows: int, image_tokens: int, text: int, itemsize: int,
                              scores_materialised: bool) -> dict[str, int]:
    """One transformer block's working set on ``rows`` sequences (the blocks run one after another)."""
    heads = int(config.get("num_attention_heads", 24))
    dim = heads * int(config.get("attention_head_dim", 128))
    length = image_tokens + text
    parts = {"block_working_set": BLOCK_UNITS * rows * length * dim * itemsize}
    if config.get("zero_cond_t"):  # shift/scale/gate chosen per token: three image-sized tensors
        parts["zero_cond_t_modulation"] = 3 * rows * image_tokens * dim * itemsize
    if scores_materialised:
        parts["attention_scores"] = 2 * heads * length * length * itemsize  # the ragged path: one row at a time
    return parts


def text_encoder_bytes(te: Any, tokens: int, patches: list[int], itemsize: int, scores_materialised: bool) -> int:
    """One Qwen2.5-VL pass: all hidden states kept, one layer's working set, the logits, the vision tower."""
    t, v = te.text_config, te.vision_config
    h, inter = int(t.hidden_size), int(t.intermediate_size)
    kv = int(t.num_key_value_heads) * (h // int(t.num_attention_heads))
    layer = max(2 * h + 2 * (h + 2 * kv), 2 * h + 3 * inter)
    lm = tokens * ((int(t.num_hidden_layers) + 1) * h + layer + int(t.vocab_size))
    p = sum(patches)
    vh, vi = int(v.hidden_size), int(v.intermediate_size)
    vision = p * (3 * vh + max(4 * vh, 3 * vi))
    scores = 0
    if scores_materialised:
        scores = 2 * int(t.num_attention_heads) * tokens**2 + 2 * int(v.num_heads) * sum(n * n for n in patches)
    return (max(lm, vision) + scores) * itemsize


def _decoder_walk(vcfg: dict[str, Any], pixels: int, itemsize: int, scores: bool = False) -> tuple[int, int]:
    """(feature-cache bytes, peak working-set bytes) of decoding one frame of ``pixels`` pixels.

    The stages mirror ``QwenImageDecoder3d``: conv_in and the mid block at 1/8 resolution, then per
    up block ``num_res_blocks + 1`` residual blocks and a 2x nearest upsample (computed in float32)
    whose convolution halves the channels.
    """
    base, mult = int(vcfg.get("base_dim", 96)), list(vcfg.get("dim_mult", [1, 2, 4, 4]))
    res = int(vcfg.get("num_res_blocks", 2))
    dims = [base * u for u in [mult[-1], *mult[::-1]]]
    p = max(1, pixels // (4 ** (len(mult) - 1)))
    cache = int(vcfg.get("z_dim", 16)) * p * itemsize
    work = 0

    def resblocks(c_in: int, c_out: int, n: int) -> None:
        nonlocal cache, work
        for _ in range(n):
            cache += (c_in + c_out) * p * itemsize
            work = max(work, RESBLOCK_UNITS * max(c_in, c_out) * p * itemsize)
            c_in = c_out

    resblocks(dims[0], dims[0], 2)  # mid block
    # its single-head attention: norm, qkv and their copies, output (and the p x p scores where materialised)
    work = max(work, (10 * dims[0] * p + (2 * p * p if scores else 0)) * itemsize)
    for i, (c_in, c_out) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
        resblocks(c_in // 2 if i else c_in, c_out, res + 1)
        if i != len(mult) - 1:  # input, its float32 copy, the float32 upsample, its cast back, the conv output
            copies = itemsize if itemsize < 4 else 0  # float32 input and output are used as they are
            up = c_out * p * (itemsize + (4 if copies else 0)) + c_out * 4 * p * (4 + copies)
            work = max(work, up + c_out // 2 * 4 * p * itemsize)
            p *= 4
    cache += dims[-1] * p * itemsize  # the head convolution's input
    return cache, max(work, RESBLOCK_UNITS * dims[-1] * p * itemsize)


def _encoder_walk(vcfg: dict[str, Any], pixels: int, itemsize: int, scores: bool = False) -> tuple[int, int]:
    """(feature-cache bytes, peak working-set bytes) of encoding one frame of ``pixels`` pixels.

    The stages mirror ``QwenImageEncoder3d``: conv_in at full resolution, per down block
    ``num_res_blocks`` residual blocks and a strided 2x downsample (a temporal one caches its output).
    """
    base, mult = int(vcfg.get("base_dim", 96)), list(vcfg.get("dim_mult", [1, 2, 4, 4]))
    res = int(vcfg.get("num_res_blocks", 2))
    dims = [base * u for u in [1, *mult]]
    p = pixels
    cache = int(vcfg.get("input_channels", 3)) * p
    work = (3 + 1) * dims[0] * p  # conv_in: the padded input and its output
    c_out = dims[0]
    for i, (c_in, c_out) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
        for _ in range(res):
            cache += (c_in + c_out) * p
            work = max(work, RESBLOCK_UNITS * max(c_in, c_out) * p)
            c_in = c_out
        if i != len(mult) - 1:
            work = max(work, 3 * c_out * p)  # input, zero-padded copy, strided output
            p = max(1, p // 4)
            cache += c_out * p
    cache += 5 * c_out * p  # mid block (two residual blocks) and the head
    return cache * itemsize, max(work, 10 * c_out * p + (2 * p * p if scores else 0)) * itemsize


def _tiles(vae: dict[str, Any], width: int, height: int) -> int:
    side, stride = int(vae["tile_min"]), int(vae["tile_stride"])
    return math.ceil(height / stride) * math.ceil(width / stride) if (width > side or height > side) else 0


def vae_bytes(vcfg: dict[str, Any], width: int, height: int, itemsize: int, tiling: dict[str, int] | None,
              decode: bool, scores_materialised: bool = False) -> int:
    """Peak of decoding (or encoding) one ``width x height`` image, one tile at a time when tiling applies."""
    walk = _decoder_walk if decode else _encoder_walk
    tiles = _tiles(tiling, width, height) if tiling else 0
    pixels = tiling["tile_min"] ** 2 if tiles else width * height  # type: ignore[index]
    cache, work = walk(vcfg, pixels, itemsize, scores_materialised)
    image = 3 * width * height * itemsize
    kept = 2 * image + (3 * tiles * pixels * itemsize if decode else 0)  # the image, the finished tiles
    return cache + work + kept


def activation_parts(tcfg: dict[str, Any], te: Any, vcfg: dict[str, Any], shapes: Shapes, processor: dict[str, Any],
                     dtype: torch.dtype, tiling: dict[str, int] | None, scores_materialised: bool,
                     fp8_layer: int = 0) -> dict[str, int]:
    """The terms of a call's estimate (bytes); the four ``*_peak`` entries are its phases."""
    size = _itemsize(dtype)
    # one token per (VAE scale x patch)^2 pixels: 8 x 2 = 16 for the real VAE and transformer
    per = 2 ** len(vcfg.get("temperal_downsample", [False, True, True])) * int(tcfg.get("patch_size", 2))
    image_tokens = sum((h // per) * (w // per) for w, h in ((shapes.width, shapes.height), *shapes.references))
    te_tokens, text = text_tokens(shapes, processor)
    patches = [vision_patches(w, h, processor) for w, h in shapes.vision]
    rows = 2 if shapes.guided and shapes.batched_cfg else 1
    forward = transformer_forward_bytes(tcfg, rows, image_tokens, text, size, scores_materialised)
    if fp8_layer:
        forward["fp8_dequantised_layer"] = fp8_layer
    embeds = 2 * text * int(tcfg.get("joint_attention_dim", 3584)) * size
    return {
        **forward,
        "encode_peak": text_encoder_bytes(te, te_tokens, patches, size, scores_materialised),
        "reference_encode_peak": max(vae_bytes(vcfg, w, h, size, tiling, False, scores_materialised)
                                     for w, h in shapes.references),
        "denoise_peak": sum(forward.values()) + embeds,
        "decode_peak": vae_bytes(vcfg, shapes.width, shapes.height, size, tiling, True, scores_materialised),
    }


PHASES = ("encode_peak", "reference_encode_peak", "denoise_peak", "decode_peak")


def plan_total(plan: str, w: Weights, parts: dict[str, int], on_cpu: bool) -> int:
    """Bytes on the device at the worst moment of a call under ``plan``, weights included."""
    enc, ref, den, dec = (parts[p] for p in PHASES)
    if on_cpu or plan == "none":  # on the CPU every plan leaves the weights in host memory
        return w.total + max(enc, ref, den, dec)
    if plan == "before-decode":
        return max(w.total + max(enc, ref, den), w.vae + dec)
    if plan == "model":
        return max(w.text_encoder + enc, w.vae + ref, w.transformer + den, w.vae + dec)
    return w.largest_leaf + max(enc, ref, den, dec)  # sequential


def _options(plan: str, tiling: bool, on_cpu: bool) -> list[tuple[str, bool]]:
    """Leaner settings to suggest, cheapest change first (offload plans only on accelerators)."""
    plans = [] if on_cpu else list(OFFLOAD_PLANS[OFFLOAD_PLANS.index(plan) + 1:])  # RunConfig.validate admits no other plan
    out = [] if tiling else [(plan, True)]
    out += [(p, tiling) for p in plans]
    out += [] if tiling else [(p, True) for p in plans]
    return out


def _safe_available(backend: Backend) -> int | None:
    try:
        return backend.available_memory_bytes()
    except Exception:  # check_memory records the failure; the hint just has no alternative then
        return None


def _hint(budget: int | None, fits: list[tuple[str, int]], fallback: str) -> str:
    """``fits``: (flags, total bytes) per leaner setting; name the first that fits ``budget``."""
    if budget is not None:
        for flags, total in fits:
            if total <= budget:
                return f"with {flags} it needs about {format_bytes(total)}"
    return fallback


def _flags(plan: str, tiling: bool) -> str:
    return " and ".join([f"--offload {plan}"] * (plan != "") + ["--vae-tiling"] * tiling)


def tiling_settings(vae: Any = None) -> dict[str, int]:
    """The tile size and stride diffusers' ``AutoencoderKLQwenImage`` uses (its attributes when loaded)."""
    return {"tile_min": int(getattr(vae, "tile_sample_min_height", 256)),
            "tile_stride": int(getattr(vae, "tile_sample_stride_height", 192))}


def _estimate(what: str, backend: Backend, w: Weights, parts_for: Any, plan: str, tiling: bool,
              resident: int, fallback: str) -> tuple[MemoryEstimate, str]:
    """The estimate of ``plan``/``tiling`` and the hint naming a leaner setting that would fit."""
    on_cpu = backend.is_host
    parts = parts_for(tiling)
    total = plan_total(plan, w, parts, on_cpu)
    estimate = MemoryEstimate(what=what, device=str(backend), needed_bytes=max(0, total - resident),
                              parts={**w.parts(), **parts, "resident_weights": resident, "plan_total": total})
    available = _safe_available(backend)
    budget = None if available is None else available + resident
    fits = [(_flags(p if p != plan else "", t), plan_total(p, w, parts_for(t), on_cpu))
            for p, t in _options(plan, tiling, on_cpu)]
    return estimate, _hint(budget, fits, fallback)


def _skipped(what: str, backend: Backend, exc: Exception, record: RunRecord | None, key: str) -> None:
    """An estimate that could not be computed never blocks a run: it is recorded with the reason."""
    est = MemoryEstimate(what=what, device=str(backend), needed_bytes=0,
                         skipped_reason=f"estimating failed ({exc.__class__.__name__}: {str(exc)[:200]})")
    if record is not None:
        record.extra.setdefault("memory_estimate", {})[key] = est.to_dict()


def _processor_fault(folder: Path, processor: dict[str, Any], settings: Any, plus: bool) -> str | None:
    """The hint when the processor config, not the size asked for, sets how large the encoder's images are.

    The pipeline hands the vision-language encoder each reference at ``condition_area`` (Plus) or
    ``reference_area`` pixels; a processor ``min_pixels`` above that enlarges every one of them
    whatever --height/--width say, so "reduce --height/--width" would send the user the wrong way.
    """
    seen = settings.condition_area if plus else settings.reference_area
    least = int(processor["min_pixels"])
    if least <= seen:
        return None
    return (f"the processor config in {folder / 'processor'} sets min_pixels {least}, which enlarges every reference"
            f" image the text encoder sees to at least that many pixels whatever --height/--width say; lower it (the"
            f" published model uses {VISION_DEFAULTS['min_pixels']})")


def _name(cfg: RunConfig, folder: Path) -> str:
    return Path(cfg.model).name or folder.name


def _size_text(shapes: Shapes) -> str:
    refs = len(shapes.references)
    return f"{shapes.height}x{shapes.width}" + (f" with {refs} references" if refs > 1 else "")


def check_load_memory(folder: Path, backend: Backend | None, dtype: torch.dtype, cfg: RunConfig, plus: bool,
                      record: RunRecord | None, transformer_file: str | None = None) -> MemoryEstimate | None:
    """Before any weight is read: refuse a load whose weights (plus the requested size) cannot fit.

    On an accelerator the host is checked too: every component passes through host memory while
    diffusers loads it (an fp8 file under ``none``/``before-decode`` goes straight to the device).
    """
    from .settings import EditSettings

    backend = backend or CPUBackend()
    on_cpu = backend.is_host
    what = f"Loading {_name(cfg, folder)}"
    try:
        settings = EditSettings.from_folder(folder)
        w = weights_from_configs(folder, dtype, transformer_file)
        if transformer_file and not on_cpu and cfg.offload in ("none", "before-decode"):
            w = replace(w, transformer_on_host=False)
        height = int(cfg.height) if cfg.height is not None else fit_area(settings.output_area, 1.0)[1]
        width = int(cfg.width) if cfg.width is not None else fit_area(settings.output_area, 1.0)[0]
        shapes = shapes_for(cfg, settings, plus, height, width)
        te = text_config(folder)
        tcfg, vcfg = read_json(folder / "transformer" / "config.json"), read_json(folder / "vae" / "config.json")
        processor = processor_settings(folder)

        def parts_for(tiling: bool) -> dict[str, int]:
            return activation_parts(tcfg, te, vcfg, shapes, processor, dtype, tiling_settings() if tiling else None,
                                    backend.attention_materialises_scores, w.fp8_layer)

        fp8 = "" if transformer_file else ", use an fp8 --transformer file"
        fallback = _processor_fault(folder, processor, settings, plus) or (
            "reduce --height/--width or use a machine with more memory" if on_cpu else
            f"reduce --height/--width{fp8} or use a device with more memory")
        estimate, hint = _estimate(f"{what} at {_size_text(shapes)}", backend, w, parts_for, cfg.offload,
                                   bool(cfg.vae_tiling), 0, fallback)
    except DifforgeError:
        raise
    except Exception as exc:  # a config the estimate cannot read is reported by the load itself
        _skipped(what, backend, exc, record, "load")
        return None
    if not on_cpu:
        host = CPUBackend()
        on_host = w.text_encoder + w.vae + (w.transformer if w.transformer_on_host else 0)
        check_memory(host, MemoryEstimate(what=what, device=str(host), needed_bytes=on_host, parts=w.parts()),
                     "use a machine with more host memory", record, key="load_host")
    return check_memory(backend, estimate, hint, record, key="load")


def text_config(folder: Path) -> Any:
    """The folder's ``Qwen2_5_VLConfig`` (a concrete class: nothing in the folder picks the code).

    A config it cannot read makes the load check skip with the reason; the load itself then reports
    the broken component in its own words.
    """
    from transformers import Qwen2_5_VLConfig

    return Qwen2_5_VLConfig.from_pretrained(str(folder / "text_encoder"), local_files_only=True)


def check_call_memory(pipe: LoadedEdit, cfg: RunConfig, images: list[PIL.Image.Image], height: int, width: int,
                      record: RunRecord | None) -> MemoryEstimate | None:
    """Before the prompt is encoded: refuse a call whose activations (and offloaded weights) cannot fit."""
    p = pipe.pipe
    what = f"{_name(cfg, pipe.folder)} at {height}x{width}"
    try:
        shapes = shapes_for(cfg, pipe.settings, pipe.plus, height, width, images)
        what = f"{_name(cfg, pipe.folder)} at {_size_text(shapes)}"
        w = weights_of(pipe)
        resident = sum(module_bytes(m) for m in (p.transformer, p.text_encoder, p.vae) if _on_device(m))
        if pipe.backend.is_host:
            resident = w.total
        processor = processor_settings(pipe.folder)
        tcfg, vcfg = dict(p.transformer.config), dict(p.vae.config)

        def parts_for(tiling: bool) -> dict[str, int]:
            return activation_parts(tcfg, p.text_encoder.config, vcfg, shapes, processor, pipe.dtype,
                                    tiling_settings(p.vae) if tiling else None,
                                    pipe.backend.attention_materialises_scores, w.fp8_layer)

        fallback = _processor_fault(pipe.folder, processor, pipe.settings, pipe.plus) or "reduce --height/--width"
        estimate, hint = _estimate(what, pipe.backend, w, parts_for, pipe.offload, pipe.vae_tiling, resident, fallback)
    except DifforgeError:
        raise
    except Exception as exc:  # never let the estimate itself break a run that might fit
        _skipped(what, pipe.backend, exc, record, "call")
        return None
    return check_memory(pipe.backend, estimate, hint, record)
