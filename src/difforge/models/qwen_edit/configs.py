"""What every numeric and flag value in a Qwen-Image-Edit folder's configs may be: one table per file.

diffusers and transformers take these values as they come: ``latents_std`` all zero divides the
latents by zero (a NaN picture, saved), ``latents_mean`` of the wrong length fails to broadcast deep
in the VAE, a processor ``patch_size: 0`` divides by zero - or makes the memory estimate ask the user
to "reduce --height/--width" for a fault of the folder.  So every value below is type- and
range-checked when the folder is checked, before any library reads it, and each fault is one
CheckpointError naming the file, the key and the value.  A key a file does not set keeps the
library's default.  The bounds are far outside every published Qwen-Image(-Edit) checkpoint and
inside what the maths survives.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...errors import CheckpointError
from ..checkpoint import Bool, Choice, Int, Items, Num, OrNull, Token, check_values, read_json, shown

_SIZE = Int(1, 1 << 16)
#: A processor's pixel bounds: every reference image is resized into them whatever --height/--width say,
#: so they decide the vision encoder's work alone.  The published Qwen2.5-VL allows 12845056 pixels
#: (16384 patches of 28 x 28); 2^24 leaves room and no more (2^28 made one edit hold 7.4 GB after 10 min).
_PIXELS = Int(1, 1 << 24)
#: The least pixels enlarge every image, however small: the published value is 3136 (56 x 56); 2^20 (1024 x 1024)
#: is the most any edit needs.  (A memory estimate that still does not fit names this value, not the size.)
_LEAST_PIXELS = Int(1, 1 << 20)

TRANSFORMER_RULES: dict[str, Any] = {
    "patch_size": Int(1, 16),
    "in_channels": _SIZE,
    "out_channels": _SIZE,
    "num_layers": Int(1, 1024),
    "attention_head_dim": Int(1, 4096),
    "num_attention_heads": Int(1, 1024),
    "joint_attention_dim": _SIZE,
    "axes_dims_rope": Items(Int(0, 4096), length=3),
    "guidance_embeds": Bool(),
    "zero_cond_t": Bool(),
    "use_additional_t_cond": Bool(),
    "use_layer3d_rope": Bool(),
}

VAE_RULES: dict[str, Any] = {
    "base_dim": Int(1, 4096),
    "z_dim": Int(1, 1024),
    "input_channels": Int(1, 64),
    "num_res_blocks": Int(1, 16),
    "dim_mult": Items(Int(1, 64), most=8),
    "attn_scales": Items(Num(0, 1e6), least=0, most=8),
    "temperal_downsample": Items(Bool(), most=8),
    "dropout": Num(0, 1),
    "latents_mean": Items(Num(-1e6, 1e6), most=1024),
    "latents_std": Items(Num(0, 1e6, open_low=True), most=1024),
}

SCHEDULER_RULES: dict[str, Any] = {
    "num_train_timesteps": Int(1, 100_000),
    "shift": Num(0, 1000, open_low=True),
    "base_shift": Num(-20, 20),
    "max_shift": Num(-20, 20),
    "base_image_seq_len": Int(1, 1 << 24),
    "max_image_seq_len": Int(1, 1 << 24),
    "shift_terminal": OrNull(Num(0, 1)),
    "time_shift_type": Choice(("exponential", "linear")),
    **{flag: Bool() for flag in ("use_dynamic_shifting", "invert_sigmas", "stochastic_sampling", "use_karras_sigmas",
                                 "use_exponential_sigmas", "use_beta_sigmas")},
}

PROCESSOR_RULES: dict[str, Any] = {
    "patch_size": Int(1, 64),
    "merge_size": Int(1, 16),
    "temporal_patch_size": Int(1, 16),
    "min_pixels": _LEAST_PIXELS,
    "max_pixels": _PIXELS,
    "shortest_edge": _LEAST_PIXELS,
    "longest_edge": _PIXELS,
    "image_mean": Items(Num(-1e3, 1e3), length=3),
    "image_std": Items(Num(0, 1e3, open_low=True), length=3),
    "rescale_factor": Num(0, 1, open_low=True),
    "resample": Int(0, 5),
    "min_frames": Int(1, 1 << 16),
    "max_frames": Int(1, 1 << 16),
    **{flag: Bool() for flag in ("do_convert_rgb", "do_normalize", "do_rescale", "do_resize", "do_sample_frames")},
}

#: transformers' Qwen2.5-VL config (top level in older files, ``text_config``/``vision_config`` in newer).
TEXT_ENCODER_RULES: dict[str, Any] = {
    "hidden_size": _SIZE,
    "intermediate_size": Int(1, 1 << 18),
    "num_attention_heads": Int(1, 1024),
    "num_key_value_heads": Int(1, 1024),
    "num_hidden_layers": Int(1, 1024),
    "vocab_size": Int(1, 1 << 24),
    "max_position_embeddings": Int(1, 1 << 24),
    "rms_norm_eps": Num(0, 0.1, open_low=True),
    "rope_theta": Num(0, 1e12, open_low=True),
    "depth": Int(1, 1024),
    "num_heads": Int(1, 1024),
    "out_hidden_size": _SIZE,
    "spatial_merge_size": Int(1, 16),
    "temporal_patch_size": Int(1, 16),
    "spatial_patch_size": Int(1, 64),
    "patch_size": Int(1, 64),
    "window_size": Int(1, 1 << 16),
    "in_chans": Int(1, 64),
    "in_channels": Int(1, 64),
}

TOKENIZER_RULES: dict[str, Any] = {
    key: Token() for key in ("bos_token", "eos_token", "pad_token", "unk_token", "image_token", "video_token",
                             "vision_bos_token", "vision_eos_token")
}

#: file (relative to the model folder) -> (rules, whether they hold in nested objects too).
FILE_RULES: dict[str, tuple[dict[str, Any], bool]] = {
    "transformer/config.json": (TRANSFORMER_RULES, False),
    "vae/config.json": (VAE_RULES, False),
    "scheduler/scheduler_config.json": (SCHEDULER_RULES, False),
    "text_encoder/config.json": (TEXT_ENCODER_RULES, True),
    "tokenizer/tokenizer_config.json": (TOKENIZER_RULES, False),
    "processor/tokenizer_config.json": (TOKENIZER_RULES, False),
    "processor/preprocessor_config.json": (PROCESSOR_RULES, True),
    "processor/video_preprocessor_config.json": (PROCESSOR_RULES, True),
    "processor/processor_config.json": (PROCESSOR_RULES, True),
}


def check_config_values(folder: Path) -> None:
    """Hold every config of ``folder`` that exists to its table, then the rules that tie values together."""
    for name, (rules, nested) in FILE_RULES.items():
        path = folder / name
        if path.is_file():
            check_values(path, read_json(path, root=folder), rules, nested=nested)
    _check_vae(folder / "vae" / "config.json", folder)
    _check_shapes(folder)
    _check_scheduler(folder / "scheduler" / "scheduler_config.json", folder)
    for name in ("preprocessor_config.json", "video_preprocessor_config.json", "processor_config.json"):
        path = folder / "processor" / name
        if path.is_file():
            _check_pixels(path, read_json(path, root=folder))


def _check_vae(path: Path, folder: Path) -> None:
    """``latents_mean``/``latents_std`` hold one value per latent channel (``z_dim``, diffusers' default 16)."""
    if not path.is_file():
        return
    data = read_json(path, root=folder)
    z_dim = data.get("z_dim", 16)
    for key in ("latents_mean", "latents_std"):
        if key in data and len(data[key]) != z_dim:
            raise CheckpointError(f"{path}: '{key}' must hold z_dim = {z_dim} values, got {len(data[key])}.")


def _check_shapes(folder: Path) -> None:
    """The transformer's numbers that must agree with each other and with the VAE's.

    Each component's weights are checked against its own config when it loads; these are the values
    no weight shape ties together, which otherwise fail mid-run as a shape error: the rotary axes
    split one attention head, and the transformer patchifies the VAE's latents (``in_channels = z_dim
    * patch_size^2``) and predicts them back (``out_channels = z_dim``).
    """
    tpath, vpath = folder / "transformer" / "config.json", folder / "vae" / "config.json"
    if not (tpath.is_file() and vpath.is_file()):
        return
    t, v = read_json(tpath, root=folder), read_json(vpath, root=folder)
    head, axes = t.get("attention_head_dim", 128), t.get("axes_dims_rope", [16, 56, 56])
    if sum(axes) != head:
        raise CheckpointError(f"{tpath}: 'axes_dims_rope' {shown(axes)} must add up to attention_head_dim ({head}).")
    z_dim, patch = v.get("z_dim", 16), t.get("patch_size", 2)
    for key, want in (("in_channels", z_dim * patch * patch), ("out_channels", z_dim)):
        have = t.get(key, {"in_channels": 64, "out_channels": 16}[key])
        if have != want:
            raise CheckpointError(
                f"{tpath}: '{key}' is {have}, but z_dim {z_dim} of {vpath} and patch_size {patch} need {want}; the"
                " transformer and the VAE come from different models."
            )


def _check_scheduler(path: Path, folder: Path) -> None:
    """Dynamic shifting interpolates between the two sequence lengths: equal ones divide by zero."""
    if not path.is_file():
        return
    data = read_json(path, root=folder)
    base, top = data.get("base_image_seq_len", 256), data.get("max_image_seq_len", 4096)
    if base >= top:
        raise CheckpointError(f"{path}: 'base_image_seq_len' ({base}) must be below 'max_image_seq_len' ({top}).")


def _check_pixels(path: Path, data: dict[str, Any]) -> None:
    """In every (nested) processor of the file, the smallest image may not be larger than the largest."""
    stack: list[Any] = [data]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            stack.extend(v for v in node.values() if isinstance(v, dict))
            for low, high in (("min_pixels", "max_pixels"), ("shortest_edge", "longest_edge")):
                if isinstance(node.get(low), int) and isinstance(node.get(high), int) and node[low] > node[high]:
                    raise CheckpointError(
                        f"{path}: '{low}' ({shown(node[low])}) must not be above '{high}' ({shown(node[high])})."
                    )
