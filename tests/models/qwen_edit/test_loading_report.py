"""Weights that do not match their config are refused from the libraries' own loading reports.

diffusers and transformers compare a component's files with the model its config builds and return
the missing, unexpected and misshaped keys when asked (``output_loading_info=True``); loading alone
only logs them (and difforge silences that log), dropping extra weights and leaving missing ones on
the meta device.  Each case here plants one key problem in a copy of the tiny model and expects one
CheckpointError sentence naming the component folder and the key.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from difforge.errors import CheckpointError
from difforge.models.qwen_edit import build_tiny_fp8_transformer, loader

from .conftest import load, make_cfg

WEIGHTS = "diffusion_pytorch_model.safetensors"


@pytest.fixture
def copy(edit_folder: Path, tmp_path: Path) -> Path:
    target = tmp_path / "model"
    shutil.copytree(edit_folder, target)
    return target


def _rewrite(path: Path, change) -> None:
    state = load_file(str(path))
    change(state)
    save_file(state, str(path))


def _refused(folder: Path, *needles: str, **cfg) -> str:
    with pytest.raises(CheckpointError) as err:
        load(folder, make_cfg(folder, **cfg))
    text = str(err.value)
    assert "\n" not in text and "Traceback" not in text
    for needle in needles:
        assert needle in text, text
    return text


def test_an_extra_transformer_weight_is_refused(copy: Path) -> None:
    def extra(state: dict) -> None:
        state["transformer_blocks.0.attn.to_q.extra"] = torch.zeros(2)

    _rewrite(copy / "transformer" / WEIGHTS, extra)
    _refused(copy, str(copy / "transformer"), "has unexpected weight 'transformer_blocks.0.attn.to_q.extra' (1 extra)",
             "does not match its config")


def test_a_missing_transformer_weight_is_refused(copy: Path) -> None:
    _rewrite(copy / "transformer" / WEIGHTS, lambda state: state.pop("proj_out.bias"))
    _refused(copy, str(copy / "transformer"), "lacks weight 'proj_out.bias' (1 missing)")


def test_missing_keys_are_counted_and_the_first_in_order_named(copy: Path) -> None:
    def drop(state: dict) -> None:
        for key in ("norm_out.linear.weight", "img_in.bias", "proj_out.weight"):
            state.pop(key)

    _rewrite(copy / "transformer" / WEIGHTS, drop)
    _refused(copy, "lacks weight 'img_in.bias' (3 missing)")


def test_the_vae_is_checked_beside_an_fp8_transformer_file(plus_folder: Path, tmp_path: Path) -> None:
    """A transformer-only file replaces the folder's transformer; the folder's VAE still gets its report."""
    folder = tmp_path / "model"
    shutil.copytree(plus_folder, folder)
    fp8 = tmp_path / "fp8.safetensors"
    build_tiny_fp8_transformer(folder, fp8, "plain")
    _rewrite(folder / "vae" / WEIGHTS, lambda state: state.pop("decoder.conv_out.bias"))
    _refused(folder, str(folder / "vae"), "lacks weight 'decoder.conv_out.bias'", transformer_file=str(fp8))


def test_the_sentence_follows_the_report() -> None:
    """Missing before unexpected before misshaped, whichever library's report it is."""
    where = Path("/m/vae")
    with pytest.raises(CheckpointError, match=r"^/m/vae lacks weight 'a' \(2 missing\)"):
        loader._bad_key(where, {"missing_keys": ["b", "a"], "unexpected_keys": ["c"]})
    with pytest.raises(CheckpointError, match=r"^/m/vae has unexpected weight 'c' \(1 extra\)"):
        loader._bad_key(where, {"missing_keys": [], "unexpected_keys": ["c"]})
    with pytest.raises(CheckpointError, match=r"^/m/vae weight 'w' has a shape its config does not imply\.$"):
        loader._bad_key(where, {"mismatched_keys": [("w", (2,), (3,))]})
    loader._bad_key(where, {"missing_keys": [], "unexpected_keys": [], "mismatched_keys": [], "error_msgs": []})


def test_a_matching_folder_loads_with_empty_reports(edit_folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reports difforge reads are the libraries' (one per weighted component), and they are empty here."""
    reports: list[tuple[str, dict]] = []
    original = loader._bad_key
    monkeypatch.setattr(loader, "_bad_key", lambda where, report: (reports.append((where.name, report)),
                                                                 original(where, report))[1])
    load(edit_folder, make_cfg(edit_folder))
    assert sorted(name for name, _ in reports) == ["text_encoder", "transformer", "vae"]
    for _, report in reports:
        assert not report.get("missing_keys") and not report.get("unexpected_keys") and not report.get("mismatched_keys")
