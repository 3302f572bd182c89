"""URSAPipeline end to end on the tiny FSQ video checkpoint (``build_tiny_ursa_video``).

Reference pins: diffnext's URSAPipeline (baaivision/URSA @ 29284bb0c145, torch 2.13.0+cpu,
transformers 4.57.1, diffusers 0.35.2, the spec's 3-line CPU SwiGLU workaround) loaded this exact build
(model_index.json rewritten to module form for diffusers) and ran each case below on the CPU in float32
with ``torch.Generator().manual_seed(seed)``.  Token ids are pinned exactly (their sha256 below); the
reference's uint8 frames are stored in data/reference_frames.npz and compared within the tolerance of
parity.py, since their last bits follow the CPU's kernels.  The cases include the two-window one, whose
trailing window drops its first frame (17 frames, not 21).  In one process, on one machine, difforge matches
the reference bit for bit (test_reference_live.py).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from difforge.config import RunConfig
from difforge.errors import CheckpointError
from difforge.models.ursa import URSAPipeline
from difforge.models.ursa.tiny import build_tiny_ursa_video
from difforge.models.ursa.vae_fsq import AutoencoderVQCosmos3D
from difforge.runtime.record import RunRecord

from .conftest import load
from .parity import assert_frames_close, reference

COMMON = dict(prompt="a red cat", height=64, width=48, steps=4, guidance=5, guidance_trunc=0.9)
REF_CASES = {  # num_frames, seed -> (frames out, sha256 of the int64 tokens)
    "v9": ((9, 3), 9, "a0119e156bb1de244d68aecaab9b4070d67483a3be24271aeb96d60ae39dfde4"),
    "v1": ((1, 4), 1, "714b98095d03509b153af2ff931350acabf39d02c9157ef3da8a5921d9d3d75d"),
    "v21": ((21, 5), 17, "c1ab86f6ad9af4e77411fe6c67706c4cea2ecb8efafa31e846f58395f02fc74f"),
}


def tokens_sha(tokens: np.ndarray) -> str:
    return hashlib.sha256(tokens.astype("<i8").tobytes()).hexdigest()


def digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def video_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("video") / "tiny-ursa-video"
    build_tiny_ursa_video(folder)
    return folder


@pytest.fixture(scope="module")
def video_pipe(video_folder: Path) -> URSAPipeline:
    return load(video_folder)[0]


def test_layout_and_determinism(video_folder: Path, tmp_path: Path) -> None:
    index = json.loads((video_folder / "model_index.json").read_text())
    assert index["vae"] == ["__vae__", "AutoencoderVQCosmos3D"]
    vae_cfg = json.loads((video_folder / "vae" / "config.json").read_text())
    assert vae_cfg["patch_size"] == 2 and vae_cfg["num_vq_embeddings"] == 64 and vae_cfg["vq_embed_dim"] == 6
    t_cfg = json.loads((video_folder / "transformer" / "config.json").read_text())
    assert t_cfg["lm_head_size"] == 64 == t_cfg["vocab_size"] - t_cfg["lm_vocab_size"]
    build_tiny_ursa_video(tmp_path / "again")
    assert digest(tmp_path / "again") == digest(video_folder)


def test_loads_the_fsq_vae(video_pipe: URSAPipeline) -> None:
    assert isinstance(video_pipe.vae, AutoencoderVQCosmos3D)
    assert video_pipe.temporal_stride == 4 and video_pipe.spatial_stride == 8
    assert video_pipe.scheduler.codebook_size == 64


@pytest.mark.parametrize("name", list(REF_CASES))
def test_matches_reference(video_pipe: URSAPipeline, video_folder: Path, name: str) -> None:
    (num_frames, seed), n_out, want_tokens = REF_CASES[name]
    cfg = RunConfig(model=str(video_folder), num_frames=num_frames, seed=seed, quiet=True, **COMMON)
    images = video_pipe(cfg, RunRecord("generate"))
    tokens, frames = video_pipe.last_tokens, video_pipe.last_frames
    assert tokens.shape == (1, (num_frames - 1) // 4 + 1, 8, 6)
    assert frames.shape == (1, n_out, 64, 48, 3) and len(images) == n_out
    assert tokens_sha(tokens.numpy()) == want_tokens
    assert tokens_sha(reference("reference_frames")[f"tokens_video_{name}"]) == want_tokens  # same reference run
    assert_frames_close(frames, reference("reference_frames")[f"video_{name}"])


def test_codebook_sizes_must_agree(video_folder: Path, tmp_path: Path) -> None:
    import shutil

    folder = tmp_path / "broken"
    shutil.copytree(video_folder, folder)
    path = folder / "vae" / "config.json"
    cfg = json.loads(path.read_text())
    path.write_text(json.dumps({**cfg, "num_vq_embeddings": 125}))
    with pytest.raises(CheckpointError, match="codebook sizes disagree"):
        load(folder)
    path.write_text(json.dumps({**cfg, "vq_embed_dim": 8}))
    with pytest.raises(CheckpointError, match="vq_embed_dim"):
        load(folder)


def test_cli_writes_a_gif(video_folder: Path, tmp_path: Path) -> None:
    from PIL import Image

    from difforge.cli import app

    out = tmp_path / "out.gif"
    result = CliRunner().invoke(
        app,
        ["generate", "--model", str(video_folder), "--prompt", "a red cat", "--num-frames", "9", "--height", "32",
         "--width", "32", "--steps", "2", "--output", str(out)],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.stdout
    with Image.open(out) as im:
        assert im.size == (32, 32) and im.n_frames == 9


def test_bfloat16_decodes(video_folder: Path) -> None:
    pipe = load(video_folder, torch.bfloat16)[0]
    cfg = RunConfig(model=str(video_folder), num_frames=5, seed=0, quiet=True, **COMMON)
    pipe(cfg, RunRecord("generate"))
    assert pipe.last_frames.shape == (1, 5, 64, 48, 3) and pipe.last_frames.dtype == np.uint8
