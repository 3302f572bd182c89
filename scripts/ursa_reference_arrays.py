"""Write tests/models/ursa/data/reference_{frames,fsq_decode}.npz by running the reference, diffnext.

The arrays are what BAAI's own implementation (package ``diffnext``, github.com/baaivision/URSA at commit
29284bb0c145) produces on difforge's deterministic tiny checkpoints; the parity tests compare difforge with
them within the tolerances of tests/models/ursa/parity.py.  Nothing in the test suite runs this script, and
the normal venv does not have diffnext.  tests/models/ursa/test_reference_live.py imports the helpers below
to run both implementations in one process (it is skipped where diffnext cannot be imported).

Scratch setup (outside the repository; torch pinned so pip takes the local CPU wheel)::

    mkdir /tmp/ursa-ref && git --git-dir=<mirror of baaivision/URSA> archive 29284bb0c145 diffnext \
        | tar -x -C /tmp/ursa-ref
    python3 -m venv /tmp/refenv
    /tmp/refenv/bin/pip install torch==2.13.0
    /tmp/refenv/bin/pip install -c constraints.txt -e .          # difforge itself, no extras
    /tmp/refenv/bin/pip install transformers==4.57.1 diffusers==0.35.2 safetensors accelerate \
        einops imageio omegaconf scipy pytest                         # after difforge: these pins win
    site=$(/tmp/refenv/bin/python -c 'import site; print(site.getsitepackages()[0])')
    echo /tmp/ursa-ref > "$site/ursa-ref.pth"
    DIFFORGE_HOME=/tmp/refhome /tmp/refenv/bin/python scripts/ursa_reference_arrays.py

Why those pins: transformers 5.x drops ``Qwen3Config.rope_theta``, which diffnext's transformer reads;
diffusers 0.35.2 is the release of the same period (difforge declares diffusers>=0.36 but its URSA code does
not import diffusers).  diffnext is put on the path (the .pth file), not installed: its declared extras
(wandb, codewithgpu, imageio-ffmpeg) are not needed for inference, and flash-attn is absent, so diffnext's
own pure-torch fallbacks run (its ``torch.compile``'d rotary functions need a C++ compiler).

Two adaptations, both made at run time, none in diffnext's files:

* SwiGLU: diffnext computes it with a ``torch.cuda.jiterator`` kernel, which raises on CPU tensors.
  :func:`patch_swiglu` routes CPU tensors to the same float32 expression, ``x*y / (1 + exp(-x))`` cast
  back to the input dtype (docs spec, section 8).
* model_index.json: difforge's tiny folders name components the way BAAI's hub files do
  (``["__vae__", "AutoencoderVQ"]``); diffusers imports the first element, so :func:`module_form_copy`
  writes a copy whose entries are diffnext's module paths.

The reference runs as ``from_pretrained`` loads it (weights requiring grad; see :func:`freeze` for the one
kernel choice that flag changes).  The arrays recorded in the repository were made with torch 2.13.0+cpu,
2 threads, on an AMD EPYC with AVX2 (ATen's native CPU capability there; a run prints it first).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "models" / "ursa" / "data"
DIFFNEXT_COMMIT = "29284bb0c145"

# The cases, as difforge RunConfig fields (tests/models/ursa/test_pipeline.py and test_video_pipeline.py
# hold the same ones; test_reference_live.py checks that they agree).
IMAGE_CASES: dict[str, dict] = {
    "cfg25": dict(prompt="a red cat", height=128, width=128, steps=25, guidance=7, guidance_trunc=0.9,
                  seed=3),
    "batch_negative": dict(prompt=["a red cat", "the blue dog on a hat"], negative_prompt=["blurry", "ugly"],
                           height=64, width=128, steps=4, guidance=5, guidance_trunc=0.9, seed=11),
    "no_cfg": dict(prompt="the sun", height=64, width=64, steps=3, guidance=1, guidance_trunc=0.9, seed=0),
    "trunc_crossing": dict(prompt="a dog", negative_prompt="a cat", height=64, width=64, steps=25, guidance=7,
                           guidance_trunc=0.5, seed=7),
    "mixture": dict(prompt="a red cat", height=64, width=64, steps=6, guidance=7, guidance_trunc=0.9, seed=5),
    "bf16": dict(prompt="a red cat", height=64, width=64, steps=4, guidance=7, guidance_trunc=0.9, seed=2),
}
# which checkpoint and dtype each image case runs on (default: tiny-ursa in float32)
IMAGE_SETUP: dict[str, tuple[str, torch.dtype]] = {
    "mixture": ("mixture", torch.float32),
    "bf16": ("image", torch.bfloat16),
}
VIDEO_COMMON = dict(prompt="a red cat", height=64, width=48, steps=4, guidance=5, guidance_trunc=0.9)
VIDEO_CASES: dict[str, tuple[int, int]] = {"v9": (9, 3), "v1": (1, 4), "v21": (21, 5)}  # num_frames, seed

# The tiny FSQ VAE of tests/models/ursa/test_vae_fsq.py (its ``model``), built here the same way.
FSQ_TINY = dict(block_out_channels=(16, 32, 32, 32), layers_per_block=1, latent_channels=8, sample_frames=9,
                num_vq_embeddings=64000, vq_embed_dim=6, temporal_stride=4, spatial_stride=8)
FSQ_PATCHES = (2, 4)

# Where diffnext defines each class a model_index.json may name.
DIFFNEXT_MODULES = {
    "URSATransformer3DModel": "diffnext.models.transformers.transformer_ursa",
    "KineticOptimalScheduler": "diffnext.schedulers.scheduling_dfm",
    "AutoencoderVQ": "diffnext.models.autoencoders.autoencoder_vq",
    "AutoencoderVQCosmos3D": "diffnext.models.autoencoders.autoencoder_vq_cosmos3d",
}


# ------------------------------------------------------------------------------------------ setup
def patch_swiglu() -> None:
    """Let diffnext's SwiGLU run on CPU tensors: the kernel's float32 formula in torch ops.

    ``SwiGLUFunction.forward`` looks ``swiglu_fwd`` up in its module at call time, so replacing that name
    is the same change as the spec's three added lines.  CUDA tensors still reach the original kernel.
    Idempotent.
    """
    import diffnext.models.flash_attention as fa

    if getattr(fa.swiglu_fwd, "_difforge_cpu", False):
        return
    kernel = fa.swiglu_fwd

    def swiglu_fwd(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if x.is_cuda:
            return kernel(x, y)
        xf = x.float()
        return (xf * y.float() / (1 + torch.exp(-xf))).to(x.dtype)

    swiglu_fwd._difforge_cpu = True
    fa.swiglu_fwd = swiglu_fwd


def module_form_copy(src: Path, dst: Path) -> Path:
    """Copy a difforge checkpoint folder to ``dst`` with model_index.json in diffusers' module form."""
    shutil.copytree(src, dst)
    path = dst / "model_index.json"
    index = json.loads(path.read_text())
    for key, value in index.items():
        if isinstance(value, list) and len(value) == 2 and value[1] in DIFFNEXT_MODULES:
            index[key] = [DIFFNEXT_MODULES[value[1]], value[1]]
    path.write_text(json.dumps(index, indent=2))
    return dst


def mixture_copy(src: Path, dst: Path) -> Path:
    """tiny-ursa with scheduler ``alpha``/``c`` null: the mixture (uniform-noise) path."""
    shutil.copytree(src, dst)
    path = dst / "scheduler" / "scheduler_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "alpha": None, "c": None}))
    return dst


def tiny_folders(scratch: Path) -> dict[str, Path]:
    """difforge's tiny checkpoints (its own layout): ``image`` (tiny-ursa), ``mixture`` and ``video``."""
    from difforge.models.tiny import ensure_tiny
    from difforge.models.ursa import build_tiny_ursa_video

    image = ensure_tiny("tiny-ursa")
    video = scratch / "tiny-ursa-video"
    if not video.exists():
        build_tiny_ursa_video(video)
    mixture = scratch / "tiny-ursa-mix"
    if not mixture.exists():
        mixture_copy(image, mixture)
    return {"image": image, "mixture": mixture, "video": video}


def load_reference(folder: Path, dtype: torch.dtype, scratch: Path):
    """diffnext's URSAPipeline on a module-form copy of ``folder`` (made under ``scratch``)."""
    patch_swiglu()
    from diffnext.pipelines import URSAPipeline

    copy = scratch / f"{folder.name}-diffnext"
    if not copy.exists():
        module_form_copy(folder, copy)
    pipe = URSAPipeline.from_pretrained(str(copy), torch_dtype=dtype)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def freeze(pipe) -> None:
    """Mark the reference's weights as not requiring grad, as difforge's loader does with its own.

    Inference runs under ``no_grad`` either way, so the maths is the same; but ``F.linear`` on a
    non-contiguous input of more than two dimensions takes another kernel path when the weight requires
    grad, and the paths differ in the last bits.  The FSQ decoder's temporal attention hits this (its
    ``to_q`` gets a strided [B*h*w, 1, T, C] view), so a video decoded by the unfrozen reference is one
    uint8 level off in a few pixels.  Only the same-process comparison of
    test_reference_live.py freezes; the stored arrays are the reference as ``from_pretrained`` loads it.
    """
    for module in (pipe.transformer, pipe.vae):
        module.requires_grad_(False)


# ------------------------------------------------------------------------------------------ runs
def reference_kwargs(cfg: dict, num_frames: int | None = None) -> dict:
    """A difforge RunConfig dict as a diffnext ``URSAPipeline.__call__`` call."""
    kw = dict(prompt=cfg["prompt"], negative_prompt=cfg.get("negative_prompt"), height=cfg["height"],
              width=cfg["width"], num_inference_steps=cfg["steps"], guidance_scale=cfg["guidance"],
              guidance_trunc=cfg["guidance_trunc"], generator=torch.Generator().manual_seed(cfg["seed"]),
              output_type="np")
    if num_frames is not None:
        kw["num_frames"] = num_frames
    return kw


def run_reference(pipe, cfg: dict, num_frames: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(token ids [B, T, h, w] int64, uint8 frames) of one reference call.

    The ids are the sampler's final latents, caught where the pipeline hands them to the VAE.
    """
    seen: dict[str, torch.Tensor] = {}
    decode = pipe.image_processor.decode_latents

    def capture(vae, latents, *args, **kwargs):
        seen["tokens"] = latents.clone()
        return decode(vae, latents, *args, **kwargs)

    pipe.image_processor.decode_latents = capture  # instance attribute over the static method
    try:
        frames = pipe(**reference_kwargs(cfg, num_frames)).frames
    finally:
        del pipe.image_processor.decode_latents
    return seen["tokens"].to(torch.int64).cpu().numpy(), np.asarray(frames)


def image_cases(scratch: Path) -> dict[str, np.ndarray]:
    folders, pipes, out = tiny_folders(scratch), {}, {}
    for name, cfg in IMAGE_CASES.items():
        kind, dtype = IMAGE_SETUP.get(name, ("image", torch.float32))
        if (kind, dtype) not in pipes:
            pipes[kind, dtype] = load_reference(folders[kind], dtype, scratch)
        tokens, frames = run_reference(pipes[kind, dtype], cfg)
        batch = len(cfg["prompt"]) if isinstance(cfg["prompt"], list) else 1
        assert frames.dtype == np.uint8, frames.dtype
        assert frames.shape == (batch, cfg["height"], cfg["width"], 3), frames.shape
        out[name], out[f"tokens_{name}"] = frames, tokens
        print(f"{name}: tokens {tokens.shape} frames {frames.shape}", flush=True)
    return out


def video_cases(scratch: Path) -> dict[str, np.ndarray]:
    pipe, out = load_reference(tiny_folders(scratch)["video"], torch.float32, scratch), {}
    for name, (num_frames, seed) in VIDEO_CASES.items():
        tokens, frames = run_reference(pipe, {**VIDEO_COMMON, "seed": seed}, num_frames)
        assert frames.ndim == 5 and frames.dtype == np.uint8, frames.shape
        out[f"video_{name}"], out[f"tokens_video_{name}"] = frames, tokens
        print(f"video_{name}: tokens {tokens.shape} frames {frames.shape}", flush=True)
    return out


# ------------------------------------------------------------------------------------------ FSQ decode
def difforge_fsq(patch_size: int):
    """difforge's tiny FSQ VAE and ids: ``model`` of tests/models/ursa/test_vae_fsq.py, the one recipe."""
    import sys

    sys.path.insert(0, str(REPO))
    from tests.models.ursa.test_vae_fsq import model

    return model(patch_size)


def reference_fsq(difforge_vae: torch.nn.Module, patch_size: int, scratch: Path) -> torch.nn.Module:
    """diffnext's AutoencoderVQCosmos3D with the same config, given difforge's weights through safetensors."""
    from diffnext.models.autoencoders.autoencoder_vq_cosmos3d import AutoencoderVQCosmos3D
    from safetensors.torch import load_file, save_file

    path = scratch / f"fsq_p{patch_size}.safetensors"
    save_file({k: v.contiguous() for k, v in difforge_vae.state_dict().items()}, str(path))
    ref = AutoencoderVQCosmos3D(**FSQ_TINY, patch_size=patch_size).eval()
    ref.load_state_dict(load_file(str(path)), strict=True)
    return ref


def fsq_decodes(scratch: Path) -> dict[str, np.ndarray]:
    out = {}
    for patch in FSQ_PATCHES:
        vae, ids = difforge_fsq(patch)
        ref = reference_fsq(vae, patch, scratch)
        with torch.no_grad():
            out[f"p{patch}_t1"] = ref.decode(ids[:, :1]).sample.float().numpy()
            out[f"p{patch}_t6"] = ref.decode(ids[:, :6]).sample.float().numpy()
            out[f"p{patch}_t3_bf16"] = ref.to(torch.bfloat16).decode(ids[:, :3]).sample.float().numpy()
        print(f"fsq p{patch}: " + ", ".join(f"{k} {v.shape}" for k, v in out.items() if k[1] == str(patch)),
              flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DATA, help="folder for the two .npz files")
    args = parser.parse_args()
    import diffusers
    import transformers

    print(f"torch {torch.__version__} (ATen CPU capability {torch.backends.cpu.get_cpu_capability()}, "
          f"{torch.get_num_threads()} threads), transformers {transformers.__version__}, "
          f"diffusers {diffusers.__version__}, diffnext @ {DIFFNEXT_COMMIT}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ursa-ref-") as tmp:
        scratch = Path(tmp)
        frames = {**image_cases(scratch), **video_cases(scratch)}
        decodes = fsq_decodes(scratch)
    np.savez_compressed(args.out / "reference_frames.npz", **frames)
    np.savez_compressed(args.out / "reference_fsq_decode.npz", **decodes)
    for name in ("reference_frames", "reference_fsq_decode"):
        path = args.out / f"{name}.npz"
        print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
