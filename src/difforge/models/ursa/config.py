"""Configs of URSA's components, read from the checkpoint's JSON files.

The reference builds its Qwen3 backbone from only the keys ``URSATransformer3DModel`` declares, so
``head_dim`` and ``rms_norm_eps`` always take Qwen3's defaults (128 and 1e-6) whatever config.json
says.  difforge does the same: the weights were trained that way, and honouring a stray key would
build a different network from the one the reference runs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

import torch

from ...devices import DTYPES
from ...errors import CheckpointError
from ..checkpoint import Bool, Int, Num, OrNull, check_values

T = TypeVar("T")
D = TypeVar("D", bound=torch.dtype | None)

#: Keys the reference transformer class declares (everything else in config.json is dropped).
TRANSFORMER_KEYS = (
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "num_hidden_layers",
    "max_window_layers",
    "rope_theta",
    "vocab_size",
    "lm_vocab_size",
    "lm_head_size",
    "bov_token_id",
)

#: Upper bounds of the integer keys, each far above any Qwen3 shape (the largest, Qwen3-235B, has
#: hidden 4096, 94 layers, 64 heads; URSA-1.7B has vocab 282741).  They exist because the model is
#: built from these numbers before any weight is read: ``num_hidden_layers: 1000000000`` would grow
#: memory for hours without a message, and a shape big enough to overflow is never a real checkpoint.
TRANSFORMER_INT_BOUNDS = {
    "hidden_size": 65536,
    "intermediate_size": 262144,
    "num_attention_heads": 1024,
    "num_key_value_heads": 1024,
    "num_hidden_layers": 1024,
    "max_window_layers": 1024,
    "vocab_size": 1 << 24,
    "lm_vocab_size": 1 << 24,
    "lm_head_size": 1 << 24,
    "bov_token_id": (1 << 24) - 1,
}
MAX_ROPE_THETA = 1e12
_SOURCE = "transformer/config.json"


def check_int(data: dict[str, Any], key: str, low: int, high: int, source: str) -> None:
    """Refuse a config value unless it is an integer (JSON ``true`` and ``2048.0`` are not) in [low, high]."""
    check_values(source, {key: data[key]}, {key: Int(low, high)})


def check_number(data: dict[str, Any], key: str, high: float, source: str) -> None:
    """Refuse a config value unless it is a finite positive number (NaN and Infinity parse as JSON)."""
    check_values(source, {key: data[key]}, {key: Num(0, high, open_low=True)})


@dataclass(frozen=True)
class URSATransformerConfig:
    """Shape of the Qwen3-style URSA transformer.  Defaults are the 1.7B FSQ model's."""

    hidden_size: int = 2048
    intermediate_size: int = 6144
    num_attention_heads: int = 16
    num_key_value_heads: int = 8
    num_hidden_layers: int = 28
    max_window_layers: int = 28
    rope_theta: float = 1000000
    vocab_size: int = 215669
    lm_vocab_size: int = 151669
    lm_head_size: int = 64000
    bov_token_id: int = 151652
    head_dim: int = 128  # Qwen3Config default; the reference never reads config.json's value
    rms_norm_eps: float = 1e-6  # likewise
    ignored_keys: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> URSATransformerConfig:
        """Read the declared keys; list the rest (``head_dim`` included) in ``ignored_keys``.

        Every declared key is checked (type, range, the head divisibility Qwen3 shapes have) before
        anything is built from it, so a hostile or mistyped number is one CheckpointError naming the
        key and the file, not a crash deep in ``nn.Linear`` or a model that never finishes building.
        """
        kwargs = {k: data[k] for k in TRANSFORMER_KEYS if k in data}
        ignored = tuple(sorted(k for k in data if k not in TRANSFORMER_KEYS and not k.startswith("_")))
        try:
            cfg = cls(**kwargs, ignored_keys=ignored)
        except TypeError as exc:
            raise CheckpointError(f"{_SOURCE} is malformed ({exc}).") from None
        values = cfg.to_dict()
        for name, high in TRANSFORMER_INT_BOUNDS.items():
            check_int(values, name, 0 if name == "bov_token_id" else 1, high, _SOURCE)
        check_number(values, "rope_theta", MAX_ROPE_THETA, _SOURCE)
        if cfg.num_attention_heads % cfg.num_key_value_heads:
            raise CheckpointError(f"{_SOURCE}: num_attention_heads must be a multiple of num_key_value_heads.")
        if cfg.hidden_size % cfg.num_attention_heads:
            raise CheckpointError(f"{_SOURCE}: hidden_size must be a multiple of num_attention_heads.")
        return cfg

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("ignored_keys")
        return data


def vae_config_from_dict(cls: type[T], data: dict[str, Any], exclude: frozenset[str] = frozenset()) -> T:
    """Build a VAE config from the keys its class declares (like the reference, which drops the rest).

    ``block_out_channels`` becomes a tuple; a wrongly typed key becomes one CheckpointError sentence.
    Integer keys are bounded (:data:`VAE_INT_BOUNDS`) for the transformer's reason: the modules are
    built from these numbers before a weight is read, so ``layers_per_block: 1e9`` must not get there.
    """
    names = set(cls.__dataclass_fields__) - exclude  # type: ignore[attr-defined]
    kwargs = {k: v for k, v in data.items() if k in names}
    if "block_out_channels" in kwargs:
        chans = kwargs["block_out_channels"]
        if not isinstance(chans, list | tuple) or not 1 <= len(chans) <= 16 or any(
            isinstance(c, bool) or not isinstance(c, int) or not 1 <= c <= 65536 for c in chans
        ):
            raise CheckpointError(
                "vae/config.json is malformed (block_out_channels must be a list of 1 to 16 integers from 1 to"
                f" 65536, got {repr(chans)[:80]})."
            )
        kwargs["block_out_channels"] = tuple(chans)
    for key, high in VAE_INT_BOUNDS.items():
        if key in kwargs:
            check_int(kwargs, key, 1, high, "vae/config.json")
    check_values("vae/config.json", kwargs, {"attn_down_block": Bool(), "attn_up_block": Bool()})
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"vae/config.json is malformed ({exc}).") from None


#: Bounds of the VAE configs' integer keys (IBQ and FSQ); real values are at most 131072 codes,
#: 1024 channels, 4 layers per block, 49 sample frames.
VAE_INT_BOUNDS = {
    "in_channels": 64,
    "out_channels": 64,
    "layers_per_block": 64,
    "latent_channels": 65536,
    "num_vq_embeddings": 1 << 24,
    "vq_embed_dim": 65536,
    "temporal_stride": 64,
    "spatial_stride": 256,
    "sample_frames": 4096,
    "patch_size": 64,
}


@dataclass(frozen=True)
class VQConfig:
    """``AutoencoderVQ`` (IBQ, 2-D) config.  Keys starting with ``_`` are ignored, like the reference."""

    in_channels: int = 3
    out_channels: int = 3
    block_out_channels: tuple[int, ...] = (128, 256, 512, 512)
    layers_per_block: int = 2
    latent_channels: int = 16
    num_vq_embeddings: int = 16384
    vq_embed_dim: int = 8
    attn_down_block: bool = False
    attn_up_block: bool = False
    # AutoencoderVQ's class defaults.  The reference pipeline's own fallback (4 / 8) never fires for
    # this class, because diffusers fills every missing key with the class default first.
    temporal_stride: int = 1
    spatial_stride: int = 16
    decoder_dtype: str | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> VQConfig:
        cfg = vae_config_from_dict(cls, data)
        if any(c % 32 for c in cfg.block_out_channels):
            raise CheckpointError("vae/config.json: every block_out_channels entry must be a multiple of 32.")
        if cfg.decoder_dtype not in (None, "float32", "float16", "bfloat16"):
            raise CheckpointError(f"vae/config.json: unknown decoder_dtype '{cfg.decoder_dtype}'.")
        return cfg

    @property
    def decoder_upscale(self) -> int:
        """Pixels per latent cell that the decoder really produces."""
        return 2 ** (len(self.block_out_channels) - 1)


def decoder_torch_dtype(name: str | None, run_dtype: D) -> torch.dtype | D:
    """The VAE decoder's dtype: vae/config.json's ``decoder_dtype`` when it sets one, else the run dtype
    (None for the memory check's "the files' own dtype").

    The loader places the decoder in it and the memory estimate counts the decode in it, so both
    read it here (``VQConfig.from_dict`` has already refused any other name).
    """
    return DTYPES[name] if name else run_dtype


_SCHEDULER_SOURCE = "scheduler/scheduler_config.json"
#: What a scheduler value may be.  Each bound is far outside any trained model's (URSA: alpha 0.9, c 3,
#: shift 1-3, eps 1e-5) and inside what the maths survives: ``shift`` and ``c`` scale the time and the
#: kinetic path (0 or NaN gives a silent garbage picture), ``eps`` guards a normalisation (it must be a
#: small positive number), ``alpha`` is an exponent of ``t / (1 - t)``.
SCHEDULER_RULES = {
    "alpha": OrNull(Num(0, 100, open_low=True)),
    "c": OrNull(Num(0, 1e6, open_low=True)),
    "shift": Num(0, 1000, open_low=True),
    "eps": Num(0, 0.1, open_low=True),
}


@dataclass(frozen=True)
class SchedulerConfig:
    """``KineticOptimalScheduler``: ``alpha`` null selects the mixture path, numbers the metric path."""

    alpha: float | None = None
    c: float | None = None
    shift: float = 1.0
    eps: float = 1e-5

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SchedulerConfig:
        """Read the four keys, each type- and range-checked (:data:`SCHEDULER_RULES`) before it is used."""
        check_values(_SCHEDULER_SOURCE, data, SCHEDULER_RULES)
        cfg = cls(
            alpha=None if data.get("alpha") is None else float(data["alpha"]),
            c=None if data.get("c") is None else float(data["c"]),
            shift=float(data.get("shift", 1.0)),
            eps=float(data.get("eps", 1e-5)),
        )
        if cfg.alpha is not None and cfg.c is None:
            raise CheckpointError("scheduler/scheduler_config.json sets 'alpha' but not 'c' (the metric path needs both).")
        return cfg

    @property
    def path(self) -> str:
        return "mixture" if self.alpha is None else "metric"


def check_consistency(t: URSATransformerConfig, vae: VQConfig, codebook_rows: int) -> None:
    """The four codebook sizes a checkpoint states must agree (spec: four-way check)."""
    sizes = {
        "transformer lm_head_size": t.lm_head_size,
        "vae num_vq_embeddings": vae.num_vq_embeddings,
        "scheduler codebook rows": codebook_rows,
        "transformer vocab_size - lm_vocab_size": t.vocab_size - t.lm_vocab_size,
    }
    if len(set(sizes.values())) != 1:
        listing = ", ".join(f"{k} = {v}" for k, v in sizes.items())
        raise CheckpointError(f"The checkpoint's codebook sizes disagree ({listing}); the folder mixes components.")
    if not 0 <= t.bov_token_id < t.lm_vocab_size:
        raise CheckpointError(
            f"transformer bov_token_id {t.bov_token_id} is outside the text vocabulary (0..{t.lm_vocab_size - 1})."
        )
    if vae.decoder_upscale != vae.spatial_stride:
        raise CheckpointError(
            f"vae/config.json says spatial_stride {vae.spatial_stride} but its decoder upsamples by "
            f"{vae.decoder_upscale}; fix the config."
        )
