"""The family's validation probe: teacher-forced steps, components alone, FLOP counts and operator capture."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
import torch

from difforge.errors import DifforgeError
from difforge.models.families import QWEN_EDIT, QWEN_EDIT_PLUS
from difforge.models.probing import OpCase, Probe
from difforge.models.qwen_edit.probe import QwenEditProbe

from .conftest import card, load, make_cfg, probe


def test_the_probe_answers_the_protocol(edit_folder: Path, plus_folder: Path) -> None:
    qe, _ = load(edit_folder, make_cfg(edit_folder))
    plus, _ = load(plus_folder, make_cfg(plus_folder))
    hooks, plus_hooks = QwenEditProbe(qe), QwenEditProbe(plus)
    assert hooks.pipeline is qe and (hooks.family, plus_hooks.family) == (QWEN_EDIT, QWEN_EDIT_PLUS)
    assert QwenEditProbe.takes_images and QwenEditProbe.negative_prompt is None
    assert len(QwenEditProbe.default_prompts) == 3 and all(isinstance(p, str) and p for p in QwenEditProbe.default_prompts)
    assert hooks.dtype == torch.float32 and hooks.size_multiple == 16
    # the protocol's optional hooks (after its "optional" marker) are asked for with hasattr; the discrete
    # sampler's are not this family's: its work after the network is post_network_step, judged the same way
    source = inspect.getsource(Probe)
    optional = set(re.findall(r"def (\w+)\(", source.split("# ---- optional", 1)[1])) if "# ---- optional" in source else set()
    members = ({n for n in dir(Probe) if not n.startswith("_")} | set(Probe.__annotations__)) - optional
    assert all(hasattr(hooks, n) for n in members), sorted(n for n in members if not hasattr(hooks, n))
    assert not hasattr(hooks, "sampler_step") and callable(hooks.post_network_step)
    assert not hasattr(qe, "forward_step") and not hasattr(qe, "component_inputs")  # the pipeline only edits


@pytest.mark.parametrize("disable", [[], ["batched-cfg"]], ids=["batched", "two-calls"])
def test_forward_step_equals_the_runs_own_step(plus_folder: Path, disable: list[str]) -> None:
    """For the inputs a run's step saw, the recomputed velocity is that step's, bit for bit."""
    cfg = make_cfg(plus_folder, steps=3, disable=disable)
    qe, record = load(plus_folder, cfg)
    seen: list[tuple[int, dict, dict]] = []
    qe(cfg, record, [card()], step_hook=lambda i, inp, out: seen.append((i, inp, out)))
    assert [s[0] for s in seen] == [0, 1, 2]
    hooks = probe(qe)
    for i, inputs, outputs in seen:
        assert inputs["latents"].device.type == "cpu" and outputs["noise_pred"].dtype == torch.float32
        assert torch.isfinite(outputs["noise_pred"]).all()
        again = hooks.forward_step(cfg, i, inputs)["noise_pred"]
        assert again.dtype == torch.float32 and again.device.type == "cpu"
        assert torch.equal(again, outputs["noise_pred"])
    assert torch.equal(seen[1][1]["latents"], seen[0][2]["latents"])  # step i+1 starts where step i ended
    assert seen[0][1]["timestep"] > seen[2][1]["timestep"]


def test_forward_step_without_a_run_reads_cfg_images(plus_folder: Path, tmp_path: Path) -> None:
    path = tmp_path / "ref.png"
    card().save(path)
    cfg = make_cfg(plus_folder, images=[str(path)])
    qe, record = load(plus_folder, cfg)
    seen: list[tuple[dict, dict]] = []
    qe(cfg, record, [card()], step_hook=lambda i, inp, out: seen.append((inp, out)))
    fresh, _ = load(plus_folder, cfg)  # no cached state: must prepare from cfg.images
    assert fresh.cached_prepared(cfg) is None
    got = probe(fresh).forward_step(cfg, 1, seen[1][0])
    assert torch.equal(got["noise_pred"], seen[1][1]["noise_pred"])
    assert fresh.cached_prepared(cfg) is not None


def test_components_run_deterministically(edit_folder: Path) -> None:
    cfg = make_cfg(edit_folder)
    qe, _ = load(edit_folder, cfg)
    hooks = probe(qe)
    inputs = hooks.component_inputs(cfg)
    assert set(inputs) == {"text_encoder", "transformer", "vae_encode", "vae_decode"}
    again = probe(qe).component_inputs(cfg)
    for name, tensors in inputs.items():
        for key, value in tensors.items():
            assert value.device.type == "cpu" and torch.equal(value, again[name][key])
        out = hooks.run_component(name, tensors)
        assert out.dtype == torch.float32 and out.device.type == "cpu" and torch.isfinite(out).all()
        assert torch.equal(out, hooks.run_component(name, tensors))
    assert hooks.run_component("vae_decode", inputs["vae_decode"]).shape[-2:] == (64, 64)
    assert [n for n, _ in hooks.transformer_blocks()] == ["transformer_blocks.0", "transformer_blocks.1"]
    other = hooks.component_inputs(make_cfg(edit_folder, seed=1))
    assert not torch.equal(other["transformer"]["hidden_states"], inputs["transformer"]["hidden_states"])
    with pytest.raises(DifforgeError, match="Unknown component 'unet'"):
        hooks.run_component("unet", {})


def test_component_inputs_follow_the_run_size(plus_folder: Path) -> None:
    """Token counts as a real run of that size: output plus one reference, the reference at the folder's area."""
    cfg = make_cfg(plus_folder, height=96, width=64)
    qe, _ = load(plus_folder, cfg)
    inputs = probe(qe).component_inputs(cfg)
    shapes = inputs["transformer"]["img_shapes"].tolist()
    assert shapes[0] == [1, 96 // 16, 64 // 16]
    assert inputs["transformer"]["hidden_states"].shape[1] == sum(h * w for _, h, w in shapes)
    assert inputs["vae_decode"]["latents"].shape[-2:] == (96 // 8, 64 // 8)
    assert inputs["vae_encode"]["sample"].shape[-2:] == (shapes[1][1] * 16, shapes[1][2] * 16)


def test_flops_per_step_matches_a_real_counted_step(plus_folder: Path) -> None:
    from torch.utils.flop_counter import FlopCounterMode

    # Two unpadded batch-1 calls execute exactly the model FLOPs; batched CFG adds the padding rows.
    cfg = make_cfg(plus_folder, disable=["batched-cfg"])
    qe, record = load(plus_folder, cfg)
    seen: list[dict] = []
    qe(cfg, record, [card()], step_hook=lambda i, inp, out: seen.append(inp))
    hooks = probe(qe)
    counted = hooks.flops_per_step(cfg)
    counter = FlopCounterMode(display=False)
    with counter:
        hooks.forward_step(cfg, 0, seen[0])
    tokens = record.extra["tokens"]
    assert counted["forwards_per_step"] == 2 and counted["transformer_calls_per_step"] == 2
    assert counted["tokens_per_forward"] == tokens["image"] + tokens["text"]
    # The CPU SDPA kernel is invisible to FlopCounterMode, so the real step shows only the matmuls;
    # the meta-device count must add exactly the joint attention: QK^T and PV, 4*L^2*d per block.
    config = qe.pipe.transformer.config
    inner, layers = config.num_attention_heads * config.attention_head_dim, config.num_layers
    lengths = [tokens["image"] + tokens["text"], tokens["image"] + tokens["negative_text"]]
    attention = sum(4 * n * n * inner * layers for n in lengths)
    assert set(counter.get_flop_counts()["Global"]) == {torch.ops.aten.addmm}
    assert counted["flops_per_step"] == counter.get_total_flops() + attention


def test_flops_without_a_run_read_cfg_images(plus_folder: Path, tmp_path: Path) -> None:
    """The token counts come from the tokenizer and the references' sizes when no run is cached."""
    path = tmp_path / "ref.png"
    card().save(path)
    cfg = make_cfg(plus_folder, images=[str(path)])
    qe, record = load(plus_folder, cfg)
    qe(cfg, record, [card()])
    fresh, _ = load(plus_folder, cfg)
    assert probe(fresh).flops_per_step(cfg) == probe(qe).flops_per_step(cfg)
    assert fresh.cached_prepared(cfg) is None  # counted without encoding anything


@pytest.mark.parametrize("which", ["edit", "plus"])
def test_operator_cases_capture_block_zero(which: str, edit_folder: Path, plus_folder: Path) -> None:
    """The first RMSNorm and the joint attention of block 0, each with its fp32 reference and floor."""
    folder = plus_folder if which == "plus" else edit_folder
    cfg = make_cfg(folder)
    qe, record = load(folder, cfg)
    seen: list[dict] = []
    qe(cfg, record, [card()], step_hook=lambda i, inp, out: seen.append(inp))
    cases = probe(qe).operator_cases(torch.device("cpu"), cfg, seen[0], record.adaptations)
    assert [c.op for c in cases] == ["rms_norm", "joint attention (block 0)"]
    chosen = {a.what: a for a in record.adaptations}
    for case in cases:
        assert isinstance(case, OpCase) and case.floor is not None and case.shape
        assert case.dut.dtype == case.ref.dtype == torch.float32 and case.dut.shape == case.ref.shape
        # fp32 on the CPU: the port and the reference differ by float rounding only
        assert torch.allclose(case.dut, case.ref, atol=1e-5, rtol=1e-4)
        assert torch.equal(case.floor, case.ref)  # the floor is the reference at the device's dtype
    assert cases[1].impl == chosen["attention"].choice and cases[0].impl == "diffusers RMSNorm"


def test_forward_step_gives_the_cfg_branches_its_velocity_combines(edit_folder: Path) -> None:
    """Under true CFG the two branches come out too (the post-network rows are teacher-forced with them);
    combined by the run's own rule they are the velocity, bit for bit.  Without CFG there are none."""
    from difforge.models.qwen_edit.loop import combine_cfg

    cfg = make_cfg(edit_folder, steps=2, true_cfg=4.0)
    qe, record = load(edit_folder, cfg)
    seen: list[tuple[int, dict, dict]] = []
    qe(cfg, record, [card()], step_hook=lambda i, inp, out: seen.append((i, inp, out)))
    out = probe(qe).forward_step(cfg, 1, seen[1][1])
    assert set(out) == {"noise_pred", "cond_pred", "uncond_pred"}
    assert torch.equal(out["noise_pred"], seen[1][2]["noise_pred"])
    assert torch.equal(combine_cfg(out["cond_pred"], out["uncond_pred"], 4.0), out["noise_pred"])
    post = probe(qe).post_network_step(cfg, 1, seen[1][1], out)
    assert torch.equal(post["latents_next"], seen[1][2]["latents"])  # the run's own Euler step
    plain = make_cfg(edit_folder, steps=2, true_cfg=1.0)
    qe2, record2 = load(edit_folder, plain)
    seen2: list[tuple[int, dict, dict]] = []
    qe2(plain, record2, [card()], step_hook=lambda i, inp, out: seen2.append((i, inp, out)))
    assert set(probe(qe2).forward_step(plain, 0, seen2[0][1])) == {"noise_pred"}
