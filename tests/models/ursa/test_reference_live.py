"""Optional: the reference (diffnext) and difforge side by side, in one process, on one machine.

Skipped unless ``diffnext`` imports; scripts/ursa_reference_arrays.py says how to make the scratch venv
(diffnext on the path, the pinned transformers/diffusers, difforge installed too) and holds the helpers used
here: the module-form copy of each tiny folder, the CPU SwiGLU patch and the reference call.  Run it as::

    cd <repo> && /tmp/refenv/bin/python -m pytest -p no:xdist tests/models/ursa/test_reference_live.py

In one process both implementations run on the same ATen kernels, so the guarantee checked here is the
strong one: equal token ids and bit-identical uint8 frames and FSQ decodes.  (The stored arrays checked by
the other files hold across CPUs only within parity.py's tolerances.)  The reference's weights are frozen
like difforge's (see ``freeze`` in the script: the flag changes one kernel choice, not the maths).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from difforge.config import RunConfig
from difforge.runtime.record import RunRecord

from . import test_pipeline, test_vae_fsq, test_video_pipeline
from .conftest import load
from .parity import assert_frames_close

pytest.importorskip("diffnext")

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "ursa_reference_arrays.py"
IMAGE = ["cfg25", "trunc_crossing", "mixture", "bf16"]
VIDEO = ["v9", "v21"]


@pytest.fixture(scope="module")
def ura():
    spec = importlib.util.spec_from_file_location("ursa_reference_arrays", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("reference")


@pytest.fixture(scope="module")
def folders(ura, scratch: Path) -> dict[str, Path]:
    return ura.tiny_folders(scratch)


@pytest.fixture(scope="module")
def pipes(ura, folders: dict[str, Path], scratch: Path):
    """(reference, difforge) pipelines per (checkpoint, dtype), loaded on first use."""
    cache: dict = {}

    def get(kind: str, dtype: torch.dtype):
        if (kind, dtype) not in cache:
            ref = ura.load_reference(folders[kind], dtype, scratch)
            ura.freeze(ref)
            cache[kind, dtype] = ref, load(folders[kind], dtype)[0]
        return cache[kind, dtype]

    return get


def test_script_cases_are_the_parity_tests_cases(ura) -> None:
    want = {name: case["cfg"] for name, case in test_pipeline.REF_CASES.items()}
    want.update(mixture=test_pipeline.REF_MIXTURE["cfg"], bf16=test_pipeline.REF_BF16["cfg"])
    assert want == ura.IMAGE_CASES
    assert test_video_pipeline.COMMON == ura.VIDEO_COMMON
    assert {name: case[0] for name, case in test_video_pipeline.REF_CASES.items()} == ura.VIDEO_CASES
    assert test_vae_fsq.TINY == ura.FSQ_TINY  # the reference VAE is built from the same config


@pytest.mark.parametrize("name", IMAGE)
def test_image_pipeline_is_bit_identical(ura, pipes, folders: dict[str, Path], name: str) -> None:
    cfg = ura.IMAGE_CASES[name]
    kind, dtype = ura.IMAGE_SETUP.get(name, ("image", torch.float32))
    ref, ours = pipes(kind, dtype)
    want_tokens, want_frames = ura.run_reference(ref, cfg)
    ours(RunConfig(model=str(folders[kind]), quiet=True, **cfg), RunRecord("generate"))
    np.testing.assert_array_equal(ours.last_tokens.numpy(), want_tokens)
    assert ours.last_frames.dtype == want_frames.dtype == np.uint8
    np.testing.assert_array_equal(ours.last_frames[:, 0], want_frames)


@pytest.mark.parametrize("name", VIDEO)
def test_video_pipeline_is_bit_identical(ura, pipes, folders: dict[str, Path], name: str) -> None:
    num_frames, seed = ura.VIDEO_CASES[name]
    ref, ours = pipes("video", torch.float32)
    want_tokens, want_frames = ura.run_reference(ref, {**ura.VIDEO_COMMON, "seed": seed}, num_frames)
    cfg = RunConfig(model=str(folders["video"]), num_frames=num_frames, seed=seed, quiet=True,
                    **ura.VIDEO_COMMON)
    ours(cfg, RunRecord("generate"))
    np.testing.assert_array_equal(ours.last_tokens.numpy(), want_tokens)
    np.testing.assert_array_equal(ours.last_frames, want_frames)


def test_unfrozen_reference_video_is_within_the_parity_bounds(ura, folders: dict[str, Path], scratch) -> None:
    """The stored arrays are the reference as loaded (weights requiring grad): within the parity bounds."""
    num_frames, seed = ura.VIDEO_CASES["v9"]
    ref = ura.load_reference(folders["video"], torch.float32, scratch)
    tokens, frames = ura.run_reference(ref, {**ura.VIDEO_COMMON, "seed": seed}, num_frames)
    ours = load(folders["video"])[0]
    assert_frames_close(ours.decode_tokens(torch.from_numpy(tokens)), frames)


def test_fsq_decode_is_bit_identical(ura, scratch: Path) -> None:
    ours, ids = test_vae_fsq.model(2)
    ref = ura.reference_fsq(ours, 2, scratch)
    with torch.no_grad():
        for t in (1, 3, 6):
            got, want = ours.decode(ids[:, :t]), ref.decode(ids[:, :t]).sample
            assert got.dtype == want.dtype == torch.float32
            assert float((got - want).abs().max()) == 0.0, t
        ours, ref = ours.to(torch.bfloat16), ref.to(torch.bfloat16)
        got, want = ours.decode(ids[:, :3]), ref.decode(ids[:, :3]).sample
    assert got.dtype == want.dtype == torch.bfloat16
    assert float((got.float() - want.float()).abs().max()) == 0.0
