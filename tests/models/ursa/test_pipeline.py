"""URSAPipeline end to end on tiny-ursa: determinism, exact optimisations, reference pins, errors, hooks."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from difforge.config import RunConfig
from difforge.errors import CheckpointError, InputError, ModelFamilyError, SizeError, StepsError
from difforge.models.ursa import URSAPipeline
from difforge.models.ursa.pipeline import step_seed
from difforge.runtime.record import RunRecord

from .conftest import load

# Reference pins: produced on 2026-11 by diffnext's URSAPipeline (baaivision/URSA @ 29284bb0c145,
# torch 2.13.0+cpu, transformers 4.57.1, diffusers 0.35.2, only the spec's 3-line CPU SwiGLU
# workaround) on this tiny-ursa build (TINY_VERSION v1; model_index.json rewritten to module form
# for diffusers), CPU float32 unless noted, generator = torch.Generator().manual_seed(seed).
# difforge matched every case bit for bit (tokens and uint8 frames), with optimisations on and off.
REF_CASES = {
    "cfg25": dict(
        cfg=dict(prompt="a red cat", height=128, width=128, steps=25, guidance=7, guidance_trunc=0.9, seed=3),
        tokens=[46, 2, 52, 2, 33, 32, 2, 46, 2, 46, 2, 2, 2, 4, 46, 23, 32, 46, 33, 33, 23, 23, 3, 2, 45, 2, 55, 46,
                32, 2, 46, 7, 32, 2, 32, 54, 36, 2, 46, 62, 13, 32, 62, 13, 36, 55, 45, 52, 6, 33, 55, 23, 23, 7, 7,
                23, 54, 45, 52, 54, 7, 13, 13, 32],
        frames="63aedd817f6a64a77d3b4edcf477d3e9b7f5b4ab2299c59b33731867689c2d1b",
    ),
    "batch_negative": dict(
        cfg=dict(prompt=["a red cat", "the blue dog on a hat"], negative_prompt=["blurry", "ugly"], height=64,
                 width=128, steps=4, guidance=5, guidance_trunc=0.9, seed=11),
        tokens=[46, 2, 55, 49, 2, 3, 2, 23, 54, 54, 32, 2, 2, 45, 23, 2, 45, 7, 45, 23, 2, 2, 23, 23, 2, 32, 59, 2,
                2, 59, 23, 3, 46, 23, 45, 2, 2, 2, 33, 2, 46, 32, 54, 33, 36, 2, 36, 62, 6, 23, 2, 27, 33, 2, 25, 36,
                27, 36, 13, 23, 33, 46, 36, 45],
        frames="75da9ebb0ed1e76755745171c61ccffae34750562b1ca88f96a942668da8493c",
    ),
    "no_cfg": dict(
        cfg=dict(prompt="the sun", height=64, width=64, steps=3, guidance=1, guidance_trunc=0.9, seed=0),
        tokens=[46, 49, 45, 2, 2, 2, 45, 33, 27, 46, 36, 33, 6, 2, 36, 23],
        frames="a1156068598ecdb1f50716f67f6e299bfdf51d8c71fe6835a2346f0585893dfd",
    ),
    "trunc_crossing": dict(
        cfg=dict(prompt="a dog", negative_prompt="a cat", height=64, width=64, steps=25, guidance=7,
                 guidance_trunc=0.5, seed=7),
        tokens=[37, 46, 2, 6, 2, 2, 3, 35, 2, 59, 21, 2, 52, 46, 36, 21],
        frames="8f7c2a4555aa0c5b00c64ccdf178cfd1dbec6b5e02e964fa640efac1f506de16",
    ),
}
REF_MIXTURE = dict(  # same checkpoint with scheduler alpha/c = null
    cfg=dict(prompt="a red cat", height=64, width=64, steps=6, guidance=7, guidance_trunc=0.9, seed=5),
    tokens=[46, 2, 13, 52, 36, 2, 46, 46, 2, 23, 7, 27, 36, 27, 2, 36],
    frames="7514a5bbd1ce5f76c0efb4d8d405da6ac3555d0908add916b8245ef798cdc956",
)
REF_BF16 = dict(  # bfloat16 pipeline
    cfg=dict(prompt="a red cat", height=64, width=64, steps=4, guidance=7, guidance_trunc=0.9, seed=2),
    tokens=[46, 2, 2, 3, 23, 27, 7, 7, 33, 2, 36, 2, 33, 33, 23, 46],
    frames="0e585a234904da83780fd96ec7ef3d1b9ddf3c25d847b5bf5aa35f54b9108a05",
)
# transformer logits of the reference on ids [txt("a red cat") | bov | codes], codes from
# torch.randint(0, 64, (2, 32), generator=manual_seed(123)) on a (1, 4, 8) grid; row 0, position -5, first 6 codes
REF_LOGITS_ROW = [-5.487127304077148, 0.5603408217430115, 3.3658127784729004, -4.849870204925537,
                  -2.537318229675293, -10.566351890563965]


def run(pipe: URSAPipeline, **kw) -> tuple[torch.Tensor, np.ndarray, RunRecord]:
    cfg = RunConfig(model="tiny-ursa", quiet=True, **kw)
    record = RunRecord("generate")
    images = pipe(cfg, record)
    assert len(images) == pipe.last_frames.shape[0] * pipe.last_frames.shape[1]
    assert np.array_equal(np.asarray(images[0]), pipe.last_frames[0, 0])
    return pipe.last_tokens, pipe.last_frames, record


def sha(frames: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(frames).tobytes()).hexdigest()


@pytest.mark.parametrize("name", sorted(REF_CASES))
def test_matches_reference_pins(tiny_pipe: URSAPipeline, name: str) -> None:
    case = REF_CASES[name]
    tokens, frames, _ = run(tiny_pipe, **case["cfg"])
    assert tokens.flatten().tolist() == case["tokens"]
    assert sha(frames[:, 0]) == case["frames"]


def test_exact_optimisations_off_give_identical_output(tiny_pipe: URSAPipeline) -> None:
    case = REF_CASES["trunc_crossing"]
    tok_on, fr_on, rec_on = run(tiny_pipe, **case["cfg"])
    tok_off, fr_off, rec_off = run(tiny_pipe, **case["cfg"], disable=["lm-head-slice", "reuse-first-forward"])
    assert torch.equal(tok_on, tok_off) and np.array_equal(fr_on, fr_off)
    assert rec_on.extra["ursa"]["forwards"] == 24 and rec_off.extra["ursa"]["forwards"] == 25
    assert {a.what: a.choice for a in rec_off.adaptations}["lm_head rows"].startswith("all positions")


def test_mixture_path_matches_reference(mixture_folder: Path) -> None:
    pipe, _ = load(mixture_folder)
    tokens, frames, record = run(pipe, **REF_MIXTURE["cfg"])
    assert tokens.flatten().tolist() == REF_MIXTURE["tokens"] and sha(frames[:, 0]) == REF_MIXTURE["frames"]
    assert record.extra["ursa"]["forwards"] == 6  # no first-forward reuse off the metric path


def test_bfloat16_matches_reference(tiny_ursa: Path) -> None:
    pipe, _ = load(tiny_ursa, torch.bfloat16)
    tokens, frames, _ = run(pipe, **REF_BF16["cfg"])
    assert tokens.flatten().tolist() == REF_BF16["tokens"] and sha(frames[:, 0]) == REF_BF16["frames"]


def test_transformer_logits_match_reference(tiny_pipe: URSAPipeline) -> None:
    from difforge.models.ursa.rope import positions

    txt = tiny_pipe.tokenizer.encode(["a red cat", "blurry"])
    codes = torch.randint(0, 64, (2, 32), generator=torch.Generator().manual_seed(123))
    tcfg = tiny_pipe.transformer.config
    ids = torch.cat([txt, torch.nn.functional.pad(codes + tcfg.lm_vocab_size, (1, 0), value=tcfg.bov_token_id)], 1)
    with torch.no_grad():
        logits = tiny_pipe.transformer(ids, positions((1, 4, 8), 320))
    torch.testing.assert_close(logits[0, -5, :6], torch.tensor(REF_LOGITS_ROW), rtol=0, atol=1e-5)


def test_seed_determinism(tiny_pipe: URSAPipeline) -> None:
    kw = dict(prompt="a cat", height=64, width=64, steps=3)
    a = run(tiny_pipe, seed=1, **kw)
    b = run(tiny_pipe, seed=1, **kw)
    c = run(tiny_pipe, seed=2, **kw)
    assert torch.equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])


def test_unguided_tail_is_opt_in_and_recorded(tiny_pipe: URSAPipeline) -> None:
    _, _, record = run(tiny_pipe, prompt="a cat", height=64, width=64, steps=25, fast=["unguided-tail"])
    assert record.extra["ursa"]["forwards"] == 23.0  # 24 forwards, the last two at half cost
    tail = {a.what: a for a in record.adaptations}["unguided tail"]
    assert not tail.exact


def test_record_phases_steps_and_offload(tiny_pipe: URSAPipeline) -> None:
    _, _, record = run(tiny_pipe, prompt="a cat", height=64, width=64, steps=4, offload="before-decode")
    assert {"encode", "denoise", "decode"} <= set(record.phases)
    assert len(record.step_times_s) == 4
    assert "offload" in {a.what for a in record.adaptations}
    assert next(tiny_pipe.transformer.parameters()).device.type == "cpu"
    run(tiny_pipe, prompt="a cat", height=64, width=64, steps=2)  # moves back and still works


def test_step_hook_and_forward_step(tiny_pipe: URSAPipeline) -> None:
    seen: dict[int, tuple[dict, dict]] = {}
    kw = dict(prompt="a cat", height=64, width=64, steps=4, seed=5)
    cfg = RunConfig(model="tiny-ursa", quiet=True, **kw)
    tiny_pipe(cfg, RunRecord("generate"), step_hook=lambda i, a, b: seen.__setitem__(i, (a, b)))
    assert sorted(seen) == [0, 1, 2, 3]
    inputs, outputs = seen[0]
    assert inputs["tokens"].shape == (1, 16) and outputs["logits"].shape == (1, 16, 64)
    assert outputs["logits"].dtype == torch.float32 and torch.equal(outputs["tokens"], inputs["tokens"])
    assert torch.equal(seen[3][1]["tokens"], tiny_pipe.last_tokens.flatten(1))
    for i in (1, 2):  # teacher forcing reproduces the run's guided logits from the recorded tokens
        out = tiny_pipe.forward_step(cfg, i, {"tokens": seen[i][0]["tokens"]})
        torch.testing.assert_close(out["logits"], seen[i][1]["logits"], rtol=0, atol=0)
        again = tiny_pipe.forward_step(cfg, i, {"tokens": seen[i][0]["tokens"]})
        assert torch.equal(out["tokens"], again["tokens"]) and out["tokens"].dtype == torch.int64
    assert step_seed(5, 1) != step_seed(5, 2)


def test_components_blocks_and_flops(tiny_pipe: URSAPipeline) -> None:
    cfg = RunConfig(model="tiny-ursa", prompt="a cat", height=64, width=32)
    inputs = tiny_pipe.component_inputs(cfg)
    assert inputs["transformer"]["ids"].shape == (1, 320 + 1 + 8)
    logits = tiny_pipe.run_component("transformer", inputs["transformer"])
    assert logits.shape == (1, 8, 64) and logits.dtype == torch.float32
    pixels = tiny_pipe.run_component("vae_decode", inputs["vae_decode"])
    assert pixels.shape == (1, 3, 64, 32)
    names = [n for n, _ in tiny_pipe.transformer_blocks()]
    assert names[1:3] == ["model.layers.0", "model.layers.1"]
    flops = tiny_pipe.flops_per_step(cfg)
    assert flops["tokens_per_forward"] == 2 * 329 and flops["flops_per_step"] > 0


def test_input_errors(tiny_pipe: URSAPipeline) -> None:
    with pytest.raises(SizeError, match="multiples of 16"):
        run(tiny_pipe, prompt="x", height=72, width=64)
    with pytest.raises(StepsError, match="at least 2"):
        run(tiny_pipe, prompt="x", height=64, width=64, steps=1)
    with pytest.raises(InputError, match="Unknown URSA optimisation"):
        run(tiny_pipe, prompt="x", height=64, width=64, steps=2, disable=["warp-drive"])
    with pytest.raises(InputError, match="text only"):
        tiny_pipe(RunConfig(model="x", height=64, width=64), RunRecord("generate"), images=["a.png"])


def test_missing_component_folder(copy_tiny) -> None:
    folder = copy_tiny()
    import shutil

    shutil.rmtree(folder / "vae")
    with pytest.raises(CheckpointError, match="Missing component folder"):
        load(folder)


def test_corrupt_and_truncated_safetensors(copy_tiny) -> None:
    folder = copy_tiny()
    path = folder / "transformer" / "diffusion_pytorch_model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match="truncated"):
        load(folder)
    path.write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="not a valid safetensors"):
        load(folder)


def test_config_inconsistency_and_foreign_classes(copy_tiny) -> None:
    folder = copy_tiny()
    path = folder / "vae" / "config.json"
    cfg = json.loads(path.read_text())
    path.write_text(json.dumps({**cfg, "num_vq_embeddings": 65}))
    with pytest.raises(CheckpointError, match="codebook sizes disagree"):
        load(folder)
    path.write_text(json.dumps(cfg))
    index = folder / "model_index.json"
    data = json.loads(index.read_text())
    index.write_text(json.dumps({**data, "vae": ["__vae__", "AutoencoderVQCosmos3D"]}))
    with pytest.raises(CheckpointError, match="vq_embed_dim"):  # an IBQ VAE relabelled as FSQ
        load(folder)
    index.write_text(json.dumps({**data, "transformer": ["diffnext.x", "SomethingElse"]}))
    with pytest.raises(ModelFamilyError, match="SomethingElse"):
        load(folder)


def test_state_dict_mismatch_names_the_key(copy_tiny) -> None:
    from safetensors.torch import load_file, save_file

    folder = copy_tiny()
    path = folder / "transformer" / "diffusion_pytorch_model.safetensors"
    state = load_file(str(path))
    state["model.layers.0.self_attn.extra.weight"] = torch.zeros(1)
    save_file(state, str(path))
    with pytest.raises(CheckpointError, match="unexpected weight 'model.layers.0.self_attn.extra.weight'"):
        load(folder)


def test_load_records_choices(tiny_ursa: Path) -> None:
    pipe, record = load(tiny_ursa)
    chosen = {a.what: a.choice for a in record.adaptations}
    assert chosen["attention"] == "sdpa" and "rms_norm" in chosen and "scheduler_model.pth" in chosen
    assert "load" in record.phases and record.extra["ursa_model"]["codebook_size"] == 64
    assert pipe.family == "ursa" and pipe.dtype == torch.float32


def test_reference_style_call_matches_reference_pins(tiny_ursa: Path) -> None:
    """``URSAPipeline.from_pretrained(path)(prompt=..., generator=...)`` - the diffnext call, argument for argument."""
    pipe = URSAPipeline.from_pretrained(tiny_ursa, backend=None, dtype=torch.float32)
    case = REF_CASES["batch_negative"]["cfg"]
    kwargs = dict(prompt=case["prompt"], negative_prompt=case["negative_prompt"], height=case["height"],
                  width=case["width"], num_inference_steps=case["steps"], guidance_scale=case["guidance"],
                  guidance_trunc=case["guidance_trunc"])
    out = pipe(**kwargs, generator=torch.Generator().manual_seed(case["seed"]), output_type="np")
    assert out.frames.dtype == np.uint8 and out.frames.shape == (2, 64, 128, 3)
    assert sha(out.frames) == REF_CASES["batch_negative"]["frames"]
    ids = pipe(**kwargs, generator=torch.Generator().manual_seed(case["seed"]), output_type="latent").frames
    assert ids.shape == (2, 1, 4, 8) and ids.flatten().tolist() == REF_CASES["batch_negative"]["tokens"]
    pil = pipe("the sun", height=64, width=64, num_inference_steps=3, guidance_scale=1,
               generator=torch.Generator().manual_seed(0)).frames
    assert sha(np.stack([np.asarray(p) for p in pil])) == REF_CASES["no_cfg"]["frames"]
    with pytest.raises(InputError, match="output_type"):
        pipe(prompt="x", output_type="pt")
