"""FP8 transformer files: each real-world form detected, converted correctly, stored as fp8."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from difforge.errors import CheckpointError
from difforge.models.qwen_edit import (
    build_tiny_fp8_transformer,
    inspect_transformer_file,
    load_transformer_file,
)
from difforge.models.qwen_edit.fp8 import COMFY_PREFIX, Fp8Linear, quant_info

from .conftest import card, load, make_cfg, pixels, probe


@pytest.fixture(scope="module")
def fp8_files(plus_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("fp8")
    files = {}
    for form in ("plain", "scaled", "scaled-prefixed"):
        files[form] = out / f"{form}.safetensors"
        build_tiny_fp8_transformer(plus_folder, files[form], form)
    plain = load_file(str(files["plain"]))
    files["plain-e5m2"] = out / "plain-e5m2.safetensors"
    save_file({k: v.float().to(torch.float8_e5m2) if v.dtype == torch.float8_e4m3fn else v for k, v in plain.items()},
              str(files["plain-e5m2"]))
    return files


@pytest.fixture(scope="module")
def reference(plus_folder: Path) -> dict:
    """The fp32 model folder's transformer output and image on fixed inputs."""
    cfg = make_cfg(plus_folder)
    qe, record = load(plus_folder, cfg)
    inputs = probe(qe).component_inputs(cfg)["transformer"]
    _, bf16_record = load(plus_folder, cfg, torch.bfloat16)
    return {
        "inputs": inputs,
        "velocity": probe(qe).run_component("transformer", inputs),
        "image": pixels(qe(cfg, record, [card()])[0]),
        "bf16_bytes": bf16_record.extra["transformer_weight_bytes"],
        "linears": sum(isinstance(m, torch.nn.Linear) for m in qe.pipe.transformer.modules()),
    }


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def test_forms_are_detected_from_the_header(fp8_files: dict[str, Path]) -> None:
    plain = inspect_transformer_file(fp8_files["plain"])
    assert (plain.form, plain.fp8_dtypes, plain.scale_layout, plain.prefix, plain.zero_cond_t) == (
        "plain", ("e4m3fn",), None, "", False)
    e5m2 = inspect_transformer_file(fp8_files["plain-e5m2"])
    assert (e5m2.form, e5m2.fp8_dtypes, e5m2.storage_dtype) == ("plain", ("e5m2",), torch.float8_e5m2)
    scaled = inspect_transformer_file(fp8_files["scaled"])
    assert (scaled.form, scaled.scale_layout, scaled.prefix, scaled.zero_cond_t) == (
        "scaled", "per-tensor+per-channel", "", True)
    prefixed = inspect_transformer_file(fp8_files["scaled-prefixed"])
    assert (prefixed.form, prefixed.prefix, prefixed.zero_cond_t) == ("scaled", COMFY_PREFIX, True)
    raw = load_file(str(fp8_files["scaled"]))
    assert quant_info(raw["transformer_blocks.0.attn.to_q.comfy_quant"]) == {"format": "float8_e4m3fn"}


@pytest.mark.parametrize("form", ["plain", "plain-e5m2", "scaled", "scaled-prefixed"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_converted_transformer_is_close_and_stays_fp8(
    form: str, dtype: torch.dtype, fp8_files: dict[str, Path], plus_folder: Path, reference: dict
) -> None:
    cfg = make_cfg(plus_folder, transformer_file=str(fp8_files[form]))
    qe, record = load(plus_folder, cfg, dtype)
    out = probe(qe).run_component("transformer", reference["inputs"])
    rel = _rel(out, reference["velocity"])
    weight_bytes = record.extra["transformer_weight_bytes"]
    print(f"{form} {dtype}: relative error vs fp32 {rel:.4f}; weights {weight_bytes} B vs bf16 {reference['bf16_bytes']} B")
    assert torch.isfinite(out).all()
    assert rel < (0.15 if form == "plain-e5m2" else 0.08)
    linears = [m for m in qe.pipe.transformer.modules() if isinstance(m, Fp8Linear)]
    assert len(linears) == reference["linears"] > 0  # every Linear weight arrived in fp8 and stays fp8
    assert all(m.weight.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) for m in linears)
    assert record.extra["fp8_form"] == ("scaled" if form.startswith("scaled") else "plain")
    adaptation = next(a for a in record.adaptations if a.what == "transformer weights")
    assert adaptation.exact is False and adaptation.choice.startswith("fp8 e")
    if dtype == torch.bfloat16:
        assert weight_bytes < 0.55 * reference["bf16_bytes"]  # fp8 codes: about half of bf16


def test_scaled_form_would_be_wrong_without_its_scales(fp8_files: dict[str, Path], plus_folder: Path,
                                                       reference: dict) -> None:
    """What diffusers' single-file loader does (drop the scales, upcast the codes) is far off; ours is not."""
    from diffusers import QwenImageTransformer2DModel

    raw = load_file(str(fp8_files["scaled"]))
    naive_state = {k: v.float() for k, v in raw.items()
                   if not k.endswith(("weight_scale", "input_scale", "comfy_quant")) and not k.startswith("__")}
    naive = QwenImageTransformer2DModel.from_config(QwenImageTransformer2DModel.load_config(plus_folder / "transformer"))
    naive.load_state_dict(naive_state, strict=True)
    inputs = reference["inputs"]
    shapes = [tuple(int(v) for v in row) for row in inputs["img_shapes"].tolist()]
    with torch.no_grad():
        bad = naive(hidden_states=inputs["hidden_states"], encoder_hidden_states=inputs["encoder_hidden_states"],
                    timestep=inputs["timestep"], img_shapes=[shapes], return_dict=False)[0]
    ours = load_transformer_file(fp8_files["scaled"], plus_folder / "transformer", torch.float32).model
    with torch.no_grad():
        good = ours(hidden_states=inputs["hidden_states"], encoder_hidden_states=inputs["encoder_hidden_states"],
                    timestep=inputs["timestep"], img_shapes=[shapes], return_dict=False)[0]
    naive_err = float("inf") if not torch.isfinite(bad).all() else _rel(bad, reference["velocity"])
    print(f"scaled file: unscaled codes rel. error {naive_err}, scaled {_rel(good, reference['velocity']):.4f}")
    assert naive_err > 0.5
    assert _rel(good, reference["velocity"]) < 0.08


def test_scaled_prefixed_file_in_the_full_pipeline(fp8_files: dict[str, Path], plus_folder: Path, reference: dict) -> None:
    cfg = make_cfg(plus_folder, transformer_file=str(fp8_files["scaled-prefixed"]))
    qe, record = load(plus_folder, cfg)
    image = pixels(qe(cfg, record, [card()])[0])
    diff = np.abs(image - reference["image"]).max()
    print(f"scaled-prefixed fp8 image vs fp32: max abs diff {diff:.4f}")
    assert diff < 0.1
    assert {"load", "encode", "denoise", "decode"} <= set(record.phases)


def test_zero_cond_t_comes_from_the_marker(fp8_files: dict[str, Path], edit_folder: Path) -> None:
    # The Edit folder's transformer config says zero_cond_t=false; a 2511 file's marker switches it on.
    marked = load_transformer_file(fp8_files["scaled"], edit_folder / "transformer", torch.float32)
    assert marked.model.config.zero_cond_t is True and marked.model.zero_cond_t is True
    assert all(block.zero_cond_t for block in marked.model.transformer_blocks)
    unmarked = load_transformer_file(fp8_files["plain"], edit_folder / "transformer", torch.float32)
    assert unmarked.model.config.zero_cond_t is False


def _rewrite(src: Path, dst: Path, edit) -> Path:
    state = load_file(str(src))
    edit(state)
    save_file(state, str(dst))
    return dst


def test_mismatched_keys_name_the_key(fp8_files: dict[str, Path], plus_folder: Path, tmp_path: Path) -> None:
    config = plus_folder / "transformer"
    extra = _rewrite(fp8_files["plain"], tmp_path / "extra.safetensors",
                     lambda s: s.__setitem__("transformer_blocks.9.attn.to_q.weight", torch.zeros(2, 2)))
    with pytest.raises(CheckpointError, match=r"'transformer_blocks\.9\.attn\.to_q\.weight'.*unexpected"):
        load_transformer_file(extra, config, torch.float32)
    missing = _rewrite(fp8_files["plain"], tmp_path / "missing.safetensors",
                       lambda s: s.pop("proj_out.weight"))
    with pytest.raises(CheckpointError, match=r"lacks key 'proj_out\.weight'"):
        load_transformer_file(missing, config, torch.float32)
    shaped = _rewrite(fp8_files["plain"], tmp_path / "shape.safetensors",
                      lambda s: s.__setitem__("img_in.weight", s["img_in.weight"][:, :8].contiguous()))
    with pytest.raises(CheckpointError, match=r"'img_in\.weight' has shape \[48, 8\]"):
        load_transformer_file(shaped, config, torch.float32)


def test_broken_files_are_one_sentence(fp8_files: dict[str, Path], plus_folder: Path, tmp_path: Path) -> None:
    data = fp8_files["plain"].read_bytes()
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated") as err:
        load_transformer_file(truncated, plus_folder / "transformer", torch.float32)
    assert "\n" not in str(err.value)
    with pytest.raises(CheckpointError, match="Missing transformer file"):
        inspect_transformer_file(tmp_path / "nope.safetensors")
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    with pytest.raises(CheckpointError, match="not a valid safetensors"):
        inspect_transformer_file(garbage)
