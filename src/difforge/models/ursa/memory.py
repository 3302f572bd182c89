"""How much memory an URSA load and an URSA call need, estimated from the configs alone.

Nothing here allocates a real tensor.  The parameter count comes from *one* decoder layer built on
the meta device times ``num_hidden_layers`` plus the embeddings, final norm and ``lm_head`` (the
layers are identical, so building all of them would only cost time), and the VAE is built on the
meta device once.  The activation estimate of a call adds up the large tensors that are alive at
the same time in its two heavy phases:

* denoise - ``rows = batch x (2 with CFG)`` sequences of ``L = 320 text + 1 bov + N`` tokens, with
  ``N = T x (H / stride) x (W / stride)``: one decoder layer's working set (the larger of the
  attention and the SwiGLU MLP), the rotary table, attention scores ``rows x heads x L^2`` only on
  backends whose attention kernel materialises them, and the sampler's logits: the previous step's
  ``rows x N x K`` buffer is still referenced while the next forward writes a new one, and the
  scheduler adds about three ``batch x N x K`` temporaries (softmaxes, distances).  Logits are
  counted in float32 whatever the run dtype, because the multinomial/softmax temporaries may be.
* decode - one sample (all its frames, or one temporal window for the FSQ VAE) through the VAE
  decoder: per stage the input plus the ResBlock's norm/activation/conv temporaries, and the
  nearest-neighbour upsample that holds both resolutions, in the decoder's dtype.

Weights already on the device are *not* part of a call's need: the backend's available memory
already excludes them.  :func:`check_weights_fit` checks them before loading instead: against the
host, where ``load_component_state_dict`` materialises the state dict in the file's dtype (and, on
the CPU, the modules are converted to the run dtype), and on an accelerator against the device too.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch

from ...devices import PHILOX_STREAM, Backend
from ...devices.cpu import CPUBackend
from ...runtime.memory import MemoryEstimate, check_memory
from ...runtime.meta import on_meta
from ...runtime.philox import cdf_block_size
from ..checkpoint import check_safetensors_header, weight_files
from .call import random_stream
from .config import URSATransformerConfig, VQConfig, decoder_torch_dtype
from .sampling import DEVICE_CHUNK, HOST_CHUNK, INVERSE_CDF
from .tokenizer import prompt_list
from .vae_fsq import FSQConfig

if TYPE_CHECKING:
    from ...config import RunConfig
    from ...runtime.record import RunRecord
    from .tokenizer import PromptTokenizer
    from .transformer import URSATransformer
    from .vae import AutoencoderVQ
    from .vae_fsq import AutoencoderVQCosmos3D


# The loader and the pipeline sit above this module (memory -> loader -> pipeline), so what the
# checks read of a checkpoint and of a loaded pipeline is spelled out here as protocols instead of
# importing their classes; :class:`~.loader.URSACheckpoint` and :class:`~.pipeline.URSAPipeline` fit.
class CheckpointConfigs(Protocol):
    """The configs of a checkpoint folder, before any weight is read."""

    @property
    def folder(self) -> Path: ...
    @property
    def transformer_config(self) -> URSATransformerConfig: ...
    @property
    def vae_config(self) -> VQConfig | FSQConfig: ...


class LoadedPipeline(Protocol):
    """What a call's estimate reads of a loaded pipeline: its modules, dtype, device and placement."""

    @property
    def checkpoint(self) -> CheckpointConfigs: ...
    @property
    def transformer(self) -> URSATransformer: ...
    @property
    def vae(self) -> AutoencoderVQ | AutoencoderVQCosmos3D: ...
    @property
    def tokenizer(self) -> PromptTokenizer: ...
    @property
    def backend(self) -> Backend: ...
    @property
    def dtype(self) -> torch.dtype: ...
    @property
    def device(self) -> torch.device: ...
    @property
    def transformer_device(self) -> torch.device:
        """Where the transformer's weights are now (the CPU after an offloading call)."""
        ...
    @property
    def vae_device(self) -> torch.device:
        """Where the VAE decoder's weights are now (the CPU between calls with offload "model")."""
        ...
    @property
    def spatial_stride(self) -> int: ...


#: Bytes per element of the safetensors dtypes a checkpoint may store.
SAFETENSORS_ITEMSIZE = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2,
                        "I16": 2, "U16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I8": 1, "U8": 1, "BOOL": 1}
LOGITS_ITEMSIZE = 4
SCHEDULER_TEMPORARIES = 3  # batch x N x K buffers the scheduler step adds to the logits it is given
#: Peak bytes per Philox counter of one eager Gumbel-max block: seven int64 round buffers and the four
#: stacked words (counted: 88), with a margin for the first round's and the output's small tensors.
PHILOX_BLOCK_BYTES_PER_COUNTER = 96
#: Bytes per (row, entry) of the inverse-CDF draw's small temporaries: the block sums, their cumulative
#: sum and comparison, and the chosen block's copy, cumulative sum and comparison (float32, bool), with
#: a margin.  Its one large temporary, the float32 softmax, is one of the scheduler's temporaries.
INVERSE_CDF_BYTES_PER_ENTRY = 16


def philox_block_bytes(rows: int, codebook_size: int, chunk: int, sampler: str = INVERSE_CDF) -> int:
    """Peak temporaries of one eager Philox draw over ``rows x codebook_size`` scores beyond the scheduler's.

    Gumbel-max: one block of ``chunk`` counters; inverse-CDF: ``[rows, K / block]`` and ``[rows, block]``
    buffers (``chunk`` does not apply).
    """
    if sampler == INVERSE_CDF:
        size = cdf_block_size(codebook_size)
        return INVERSE_CDF_BYTES_PER_ENTRY * rows * (-(-codebook_size // size) + size)
    blocks = -(-codebook_size // 4)
    return PHILOX_BLOCK_BYTES_PER_COUNTER * min(rows * blocks, max(chunk, blocks))


def transformer_parameters(cfg: URSATransformerConfig) -> int:
    """Parameter count of :class:`~.transformer.URSATransformer` for ``cfg``, from one meta layer."""
    from ...ops import plain_ops
    from .transformer import DecoderLayer

    with on_meta():
        layer = DecoderLayer(cfg, [plain_ops()])
    per_layer = sum(p.numel() for p in layer.parameters())
    h = cfg.hidden_size
    return per_layer * cfg.num_hidden_layers + cfg.vocab_size * h + h + cfg.lm_head_size * h


def vae_parameters(cfg: VQConfig | FSQConfig) -> int:
    """Parameter count of the whole VAE (encoder included: it is loaded too), built on the meta device."""
    return vae_counts(cfg)[0]


def vae_counts(cfg: VQConfig | FSQConfig) -> tuple[int, int]:
    """(all VAE parameters, those the pipeline puts on the device: quantizer, post_quant_conv, decoder)."""
    from .vae import AutoencoderVQ
    from .vae_fsq import AutoencoderVQCosmos3D

    with on_meta():
        vae = AutoencoderVQCosmos3D(cfg) if isinstance(cfg, FSQConfig) else AutoencoderVQ(cfg)
    on_device = sum(p.numel() for m in (vae.quantizer, vae.post_quant_conv, vae.decoder) for p in m.parameters())
    return sum(p.numel() for p in vae.parameters()), on_device


def stored_itemsize(component: Path) -> int:
    """The widest element size in a component's safetensors headers (4 when none can be read)."""
    widest = 0
    try:
        for path in weight_files(component):
            for key, meta in check_safetensors_header(path).items():
                if key != "__metadata__" and isinstance(meta, dict):
                    widest = max(widest, SAFETENSORS_ITEMSIZE.get(str(meta.get("dtype")), 4))
    except Exception:  # an unreadable file is reported by the load itself, with its own message
        return 4
    return widest or 4


def check_weights_fit(ckpt: CheckpointConfigs, dtype: torch.dtype | None = None, backend: Backend | None = None,
                      record: RunRecord | None = None) -> MemoryEstimate:
    """Before building anything: refuse when the host (or the device) cannot hold the weights the load makes.

    The count comes from the configs (so a config promising 1024 layers of width 65536 is refused
    here, before the meta model or the reads).  The host first holds the state dicts in the files'
    dtype (their headers say which); the modules are then kept in ``dtype``, the run dtype (None:
    the files' own).  On the CPU that conversion happens in host memory, so the wider of the two is
    what the host must hold: a bf16 checkpoint run in float32 needs twice its file size, which a
    count in the file's dtype would miss.  On an accelerator the host holds the files' dtype and
    the device the transformer and the decoder side of the VAE in the run dtype; both are checked.
    """
    device = backend or CPUBackend()
    on_cpu = device.is_host
    host = device if on_cpu else CPUBackend()
    held = 0 if dtype is None else torch.empty(0, dtype=dtype).element_size()
    dec = decoder_torch_dtype(ckpt.vae_config.decoder_dtype, dtype)
    dec_held = 0 if dec is None else torch.empty(0, dtype=dec).element_size()
    t_params = transformer_parameters(ckpt.transformer_config)
    v_params, v_device = vae_counts(ckpt.vae_config)
    t_file, v_file = stored_itemsize(ckpt.folder / "transformer"), stored_itemsize(ckpt.folder / "vae")
    t_host = t_params * (max(t_file, held) if on_cpu else t_file)
    v_host = v_params * (max(v_file, held, dec_held) if on_cpu else v_file)
    name = ckpt.folder.name
    hint = "use a machine with more host memory"
    if on_cpu and held > min(t_file, v_file):
        hint = f"use --dtype {'bfloat16' if min(t_file, v_file) == 2 else 'float16'} or a machine with more host memory"
    estimate = MemoryEstimate(
        what=f"Loading {name}",
        device=str(host),
        needed_bytes=t_host + v_host,
        parts={"transformer_weights": t_host, "vae_weights": v_host},
    )
    checked = check_memory(host, estimate, hint, record, key="load" if on_cpu else "load_host")
    if on_cpu:
        return checked
    t_dev, v_dev = t_params * (held or t_file), v_device * (dec_held or v_file)
    on_device = MemoryEstimate(what=f"Loading {name}", device=str(device), needed_bytes=t_dev + v_dev,
                               parts={"transformer_weights": t_dev, "vae_weights": v_dev})
    return check_memory(device, on_device, "use a smaller --dtype or a device with more memory", record, key="load")


# ---- activations --------------------------------------------------------------------------------


def transformer_forward_bytes(cfg: URSATransformerConfig, rows: int, length: int, itemsize: int,
                              scores_materialised: bool) -> dict[str, int]:
    """The working set of one decoder layer on ``rows x length`` tokens (hidden states included)."""
    h, i, nh, nkv, d = (cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads,
                        cfg.num_key_value_heads, cfg.head_dim)
    tokens = rows * length
    attention = 2 * h + 4 * nh * d + 4 * nkv * d  # x, normed x, q/k/v through norm and rotary, output
    mlp = 2 * h + 4 * i  # x, normed x, gate, up, silu(gate), product
    parts = {
        "layer_working_set": tokens * max(attention, mlp) * itemsize,
        "rope_table": 4 * length * d * itemsize,
    }
    if scores_materialised:
        parts["attention_scores"] = 2 * rows * nh * length * length * itemsize
    return parts


def _decoder_stages(cfg: VQConfig | FSQConfig) -> list[tuple[int, int, int, int, int]]:
    """``(c_in, c_out, resnets, spatial_up, temporal_up)`` per decoder stage, mid block first."""
    ch = list(reversed(cfg.block_out_channels))
    depth = cfg.layers_per_block + 1
    stages = [(ch[0], ch[0], 2, 1, 1)]  # conv_in output through the mid block
    if isinstance(cfg, FSQConfig):
        for i, up in enumerate(cfg.up_layout()):
            stages.append((ch[max(i - 1, 0)], ch[i], depth, max(up[0], 1) if up else 1, max(up[1], 1) if up else 1))
    else:
        for i, c in enumerate(ch):
            stages.append((ch[max(i - 1, 0)], c, depth, 2 if i < len(ch) - 1 else 1, 1))
    return stages


def vae_decode_bytes(cfg: VQConfig | FSQConfig, latent_shape: tuple[int, int, int], itemsize: int,
                     scores_materialised: bool) -> int:
    """Peak of decoding one sample: the largest stage working set, in the decoder's dtype."""
    t, h, w = latent_shape
    if isinstance(cfg, FSQConfig):
        frames, voxels = 1, min(t, cfg.window) * h * w  # one temporal window per decoder call
    else:
        frames, voxels = t, h * w  # IBQ frames decode as one batch
    peak = 0
    for idx, (c_in, c_out, _depth, s_up, t_up) in enumerate(_decoder_stages(cfg)):
        # input, norm/silu/conv temporaries, output and the convolution's workspace (measured on the CPU:
        # about six full-width tensors at the last stage of tiny-ursa's decoder at 2048x2048)
        resblock = (c_in + 5 * c_out + (c_out if c_in != c_out else 0)) * voxels
        stage = resblock
        attn = idx <= 1 and isinstance(cfg, VQConfig) and (idx == 0 or cfg.attn_up_block)
        if attn:
            stage = max(stage, 6 * c_out * voxels + (voxels * voxels if scores_materialised else 0))
        grow = s_up * s_up * t_up
        if grow > 1:
            stage = max(stage, c_out * voxels + 2 * c_out * voxels * grow)  # input, upsampled, conv out
            voxels *= grow
        peak = max(peak, stage)
    last = cfg.block_out_channels[1] if isinstance(cfg, FSQConfig) else cfg.block_out_channels[0]
    patch = cfg.patch_size**3 if isinstance(cfg, FSQConfig) else 1
    head = 3 * last * voxels + 2 * 3 * patch * voxels  # norm, silu, conv_out; pixels and their uint8 copy
    return frames * max(peak, head) * itemsize


def activation_parts(tcfg: URSATransformerConfig, vcfg: VQConfig | FSQConfig, latent_shape: tuple[int, int, int],
                     batch: int, guided: bool, dtype: torch.dtype, text_len: int = 320,
                     scores_materialised: bool = False, philox_chunk: int | None = None,
                     philox_sampler: str = INVERSE_CDF) -> dict[str, int]:
    """The terms of a call's estimate (bytes); ``denoise_peak`` and ``vae_decode_peak`` are the two phases.

    ``philox_chunk``: the run draws from the Philox stream (``philox_sampler``; Gumbel-max in blocks of
    this many counters), whose temporaries join the sampler's; None: the reference's stream.
    """
    rows = batch * (2 if guided else 1)
    n_img = math.prod(latent_shape)
    k = tcfg.lm_head_size
    itemsize = torch.empty(0, dtype=dtype).element_size()
    forward = transformer_forward_bytes(tcfg, rows, text_len + 1 + n_img, itemsize, scores_materialised)
    logits = rows * n_img * k * LOGITS_ITEMSIZE
    sampler = SCHEDULER_TEMPORARIES * batch * n_img * k * LOGITS_ITEMSIZE
    blocks = {} if philox_chunk is None else {
        "philox_blocks": philox_block_bytes(batch * n_img, k, philox_chunk, philox_sampler)}
    sampler += sum(blocks.values())
    dec_dtype = decoder_torch_dtype(vcfg.decoder_dtype, dtype)
    decode = vae_decode_bytes(vcfg, latent_shape, torch.empty(0, dtype=dec_dtype).element_size(), scores_materialised)
    return {
        **forward,
        "logits": logits,
        **blocks,
        "scheduler_temporaries": sampler,
        "denoise_peak": logits + max(sum(forward.values()) + logits, sampler),
        "vae_decode_peak": decode,
    }


def call_estimate(pipe: LoadedPipeline, cfg: RunConfig, latent_shape: tuple[int, int, int],
                  batch: int | None = None) -> MemoryEstimate:
    """What one ``pipe(cfg)`` call needs on the pipeline's device beyond the weights it already holds there.

    ``batch``: the rows the call denoises when ``cfg.prompt`` does not say (``generate``'s
    ``num_images_per_prompt`` repeats each prompt).
    """
    batch = batch if batch is not None else len(prompt_list(cfg.prompt) or [""])
    philox = random_stream(pipe.backend.random_stream, cfg.disable, cfg.fast) == PHILOX_STREAM
    chunk = DEVICE_CHUNK if not pipe.backend.is_host else HOST_CHUNK
    parts = activation_parts(pipe.transformer.config, pipe.checkpoint.vae_config, latent_shape, batch,
                             cfg.guidance > 1, pipe.dtype, pipe.tokenizer.max_length,
                             pipe.backend.attention_materialises_scores, chunk if philox else None,
                             getattr(pipe, "philox_sampler", INVERSE_CDF))
    weights = sum(p.numel() * p.element_size() for p in pipe.transformer.parameters())
    parts["resident_transformer_weights"] = weights  # already allocated: not part of the need
    if pipe.transformer_device != pipe.device:  # offloaded by the previous call: it comes back first
        parts["denoise_peak"] += weights
    if pipe.vae_device != pipe.device:  # offload "model": the VAE comes back for the decode
        parts["vae_decode_peak"] += sum(p.numel() * p.element_size() for m in (pipe.vae.decoder, pipe.vae.post_quant_conv)
                                        for p in m.parameters())
    height, width = latent_shape[1] * pipe.spatial_stride, latent_shape[2] * pipe.spatial_stride
    what = f"{Path(cfg.model).name or pipe.checkpoint.folder.name} at {height}x{width}"
    if cfg.num_frames > 1:
        what += f" with {cfg.num_frames} frames"
    if batch > 1:
        what += f" for a batch of {batch}"
    return MemoryEstimate(what=what, device=str(pipe.backend), parts=parts,
                          needed_bytes=max(parts["denoise_peak"], parts["vae_decode_peak"]))


def check_call_memory(pipe: LoadedPipeline, cfg: RunConfig, latent_shape: tuple[int, int, int],
                      record: RunRecord | None, batch: int | None = None) -> MemoryEstimate:
    """Refuse a call whose activations cannot fit on the device, before it allocates anything."""
    return check_memory(pipe.backend, call_estimate(pipe, cfg, latent_shape, batch),
                        "reduce --height/--width" + (" or --num-frames" if cfg.num_frames > 1 else ""), record)
