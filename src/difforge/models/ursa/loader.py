"""Load an URSA checkpoint folder into difforge's own modules, strictly and without running its code.

Components are found by the *class name* in ``model_index.json`` (the library element - a module
path, ``__transformer__``, ``transformers`` ... - is ignored, and ``.py`` files in the folder are
never imported).  Weights come only from safetensors and the scheduler's ``.pth`` is read
statically.  Every problem is one :class:`~difforge.errors.CheckpointError` sentence.  The folder
is held to the same rules as a Qwen one (no ``auto_map``, string class names, weights of the
expected dtype kind and finite), though nothing here would run its code anyway: a folder that asks
for code is not one to trust with its weights either.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from ...errors import CheckpointError, ModelFamilyError
from ...runtime.meta import on_meta
from ..checkpoint import (
    SETTINGS_FILE,
    check_component_folder,
    check_finite,
    check_tree,
    config_class_names,
    config_files,
    load_component_state_dict,
    read_json,
    read_settings,
)
from .call import DEFAULT_HEIGHT, DEFAULT_WIDTH
from .config import SchedulerConfig, URSATransformerConfig, VQConfig, check_consistency
from .memory import check_weights_fit
from .pth import read_pth_tensors
from .scheduler import DFMScheduler
from .tokenizer import PromptTokenizer
from .transformer import URSATransformer
from .vae import AutoencoderVQ
from .vae_fsq import AutoencoderVQCosmos3D, FSQConfig

if TYPE_CHECKING:
    from ...devices import Backend
    from ...runtime.record import RunRecord

COMPONENT_CLASSES = {
    "transformer": ("URSATransformer3DModel",),
    "vae": ("AutoencoderVQ", "AutoencoderVQCosmos3D"),
    "scheduler": ("KineticOptimalScheduler",),
    "tokenizer": None,  # any tokenizer class: difforge reads tokenizer.json itself
}


def component_classes(folder: Path) -> dict[str, str]:
    """``{component: ClassName}`` from model_index.json, checking each component URSA needs.

    The whole folder is held to the one reading rule first (:func:`~..checkpoint.check_tree`): every
    file below resolves inside it, is a regular file, and a config is not over its cap."""
    check_tree(folder)
    index = read_json(folder / "model_index.json", root=folder)
    if index.get("_class_name") != "URSAPipeline":
        raise ModelFamilyError(f"{folder} holds a '{index.get('_class_name')}' model, not an URSAPipeline.")
    out: dict[str, str] = {}
    for name, allowed in COMPONENT_CLASSES.items():
        entry = index.get(name)
        if isinstance(entry, list | tuple) and len(entry) == 2 and isinstance(entry[1], str):
            cls = entry[1]
        elif isinstance(entry, str):  # save_pretrained's bare-name form
            cls = entry
        else:
            raise CheckpointError(f"{folder / 'model_index.json'} has no usable '{name}' entry.")
        if allowed is not None and cls not in allowed:
            raise ModelFamilyError(f"URSA component '{name}' is a {cls}; difforge knows {', '.join(allowed)}.")
        check_component_folder(folder / name)
        out[name] = cls
    check_configs(folder)
    return out


def check_configs(folder: Path) -> None:
    """No config may ask for code, and a component config's ``_class_name`` must be a class difforge knows.

    transformers' class keys (tokenizer_class ...) only have to be strings: difforge reads the
    tokenizer itself and never hands these configs to transformers.
    """
    for path in config_files(folder):
        names = config_class_names(path, read_json(path, root=folder))
        allowed = COMPONENT_CLASSES.get(path.parent.name) if path.parent != folder else None
        for key, name in names:
            if key == "_class_name" and allowed is not None and name not in allowed:
                raise CheckpointError(f"{path} names _class_name '{name}'; difforge knows {', '.join(allowed)} there.")


def load_strict(module: nn.Module, state: dict[str, torch.Tensor], where: str) -> None:
    """``load_state_dict(strict=True, assign=True)`` with one-sentence errors naming the first bad key."""
    expected = module.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing:
        raise CheckpointError(f"{where} lacks weight '{missing[0]}' ({len(missing)} missing); the file does not match its config.")
    if unexpected:
        raise CheckpointError(f"{where} has unexpected weight '{unexpected[0]}' ({len(unexpected)} extra); the file does not match its config.")
    for key, ref in expected.items():
        if tuple(state[key].shape) != tuple(ref.shape):
            raise CheckpointError(
                f"{where} weight '{key}' has shape {tuple(state[key].shape)}, the config implies {tuple(ref.shape)}."
            )
        if state[key].is_floating_point() != ref.is_floating_point():  # int8/bool where floats belong, or back
            kind = "floating-point" if ref.is_floating_point() else str(ref.dtype).removeprefix("torch.")
            raise CheckpointError(
                f"{where} weight '{key}' has dtype {str(state[key].dtype).removeprefix('torch.')}; the model expects"
                f" {kind} there."
            )
    check_finite(where, sorted(state.items()))
    module.load_state_dict(state, strict=True, assign=True)
    module.requires_grad_(False)
    module.eval()


def default_size(folder: Path, stride: int) -> tuple[int, int]:
    """(height, width) a run gets when ``--height``/``--width`` are not given.

    URSA-1.7B's own default (320 x 512) unless the folder's ``difforge.json`` names
    ``default_height``/``default_width``: a model trained at 64 x 64 (the shapes models) draws
    nothing meaningful at 320 x 512, so its folder says so rather than every caller."""
    data = read_settings(folder)
    size = [DEFAULT_HEIGHT, DEFAULT_WIDTH]
    for i, key in enumerate(("default_height", "default_width")):
        if key not in data:
            continue
        value = data[key]
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0 or value % stride or value > 8192:
            raise CheckpointError(f"{folder / SETTINGS_FILE}: '{key}' must be a positive multiple of the VAE's "
                                  f"stride {stride} (at most 8192), got {value!r}.")
        size[i] = value
    return size[0], size[1]


@dataclass
class URSACheckpoint:
    """Configs and host-side modules of one folder (weights on the CPU, in the checkpoint dtype)."""

    folder: Path
    classes: dict[str, str]
    transformer_config: URSATransformerConfig
    vae_config: VQConfig | FSQConfig
    scheduler_config: SchedulerConfig
    codebook: torch.Tensor
    tokenizer: PromptTokenizer
    default_size: tuple[int, int] = (DEFAULT_HEIGHT, DEFAULT_WIDTH)

    @classmethod
    def read_configs(cls, folder: Path) -> URSACheckpoint:
        classes = component_classes(folder)
        tcfg = URSATransformerConfig.from_dict(read_json(folder / "transformer" / "config.json", root=folder))
        vae_json = read_json(folder / "vae" / "config.json", root=folder)
        # The VAE class decides the quantiser (VQ codebook vs FSQ digits) and the decoder; the
        # config's private ``_quantizer_name`` is ignored, like the reference does.
        fsq = classes["vae"] == "AutoencoderVQCosmos3D"
        vcfg = FSQConfig.from_dict(vae_json) if fsq else VQConfig.from_dict(vae_json)
        scfg = SchedulerConfig.from_dict(read_json(folder / "scheduler" / "scheduler_config.json", root=folder))
        tensors = read_pth_tensors(folder / "scheduler" / "scheduler_model.pth", root=folder)
        emb = tensors.get("path.emb")
        if emb is None or emb.dim() != 2:
            raise CheckpointError(f"{folder / 'scheduler' / 'scheduler_model.pth'} has no 2-D 'path.emb' tensor.")
        check_consistency(tcfg, vcfg, int(emb.shape[0]))
        tokenizer = PromptTokenizer.from_folder(folder / "tokenizer", root=folder)
        if len(tokenizer) > tcfg.lm_vocab_size:
            raise CheckpointError(
                f"The tokenizer has {len(tokenizer)} ids but transformer lm_vocab_size is {tcfg.lm_vocab_size}."
            )
        return cls(folder, classes, tcfg, vcfg, scfg, emb, tokenizer, default_size(folder, vcfg.spatial_stride))

    def load_transformer(self, dtype: torch.dtype | None = None, backend: Backend | None = None,
                         record: RunRecord | None = None) -> URSATransformer:
        """The transformer in the file's dtype on the CPU, after checking the load can fit at all.

        ``dtype``/``backend``: what the caller will convert it to and where, so the check counts the
        weights as they will be held (a bf16 file run in float32 on the CPU holds twice its size).
        """
        check_weights_fit(self, dtype, backend, record)  # the host must hold both state dicts: refuse before building
        with on_meta():
            model = URSATransformer(self.transformer_config)
        load_strict(model, load_component_state_dict(self.folder / "transformer"), str(self.folder / "transformer"))
        return model

    def load_vae(self) -> AutoencoderVQ | AutoencoderVQCosmos3D:
        with on_meta():
            cfg = self.vae_config
            vae = AutoencoderVQCosmos3D(cfg) if isinstance(cfg, FSQConfig) else AutoencoderVQ(cfg)
        load_strict(vae, load_component_state_dict(self.folder / "vae"), str(self.folder / "vae"))
        return vae

    def scheduler(self) -> DFMScheduler:
        return DFMScheduler(self.scheduler_config, self.codebook)
