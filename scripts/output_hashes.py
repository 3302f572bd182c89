"""Print sha256 of the tiny models' outputs for a fixed set of runs: the before/after check of refactors.

A refactor that claims "behaviour unchanged" runs this at the old and the new commit, on the same
machine and in the same kind of process, and diffs the two outputs: every line must be equal.
Covers generate (image, video, exact switches off, opt-in approximations, bf16), the diffusers-style
URSA call, edit and edit-plus (offload plans, bf16), and validate's saved images (timings excluded).

    python scripts/output_hashes.py > before.txt   # at the old commit
    python scripts/output_hashes.py > after.txt    # at the new one; diff before.txt after.txt
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

import difforge
from difforge import api


def _digest(images: list) -> str:
    h = hashlib.sha256()
    for img in images:
        h.update(np.asarray(img).tobytes())
    return h.hexdigest()[:16]


def _files(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()[:16] for p in sorted(folder.rglob("*.png"))}


def main() -> int:
    torch.manual_seed(0)
    runs: list[tuple[str, str, dict]] = [
        ("generate", "tiny-ursa", {"height": 128, "width": 128, "steps": 6}),
        ("generate", "tiny-ursa", {}),
        ("generate", "tiny-ursa", {"height": 128, "width": 128, "steps": 6, "seed": 7, "guidance": 1.0}),
        ("generate", "tiny-ursa", {"height": 128, "width": 128, "steps": 6,
                                   "disable": ["lm-head-slice", "reuse-first-forward", "rope-cache", "pinned-draws"]}),
        ("generate", "tiny-ursa", {"height": 128, "width": 128, "steps": 6, "fast": ["unguided-tail"]}),
        ("generate", "tiny-ursa", {"height": 128, "width": 128, "steps": 6, "fast": ["philox-rng"]}),
        ("generate", "tiny-ursa", {"height": 64, "width": 64, "steps": 4, "dtype": "bfloat16"}),
        ("generate", "tiny-ursa-video", {"height": 64, "width": 64, "steps": 4, "num_frames": 5}),
        ("edit", "tiny-qwen-edit", {"steps": 4}),
        ("edit", "tiny-qwen-edit", {"steps": 4, "seed": 3, "dtype": "bfloat16"}),
        ("edit", "tiny-qwen-edit", {"steps": 4, "offload": "model"}),
        ("edit", "tiny-qwen-edit", {"steps": 4, "offload": "sequential", "vae_tiling": True}),
        ("edit-plus", "tiny-qwen-edit-plus", {"steps": 4}),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "in.png"
        src2 = Path(tmp) / "in2.png"
        y, x = np.mgrid[0:96, 0:128]
        rgb = np.stack([(x * 2) % 256, (y * 2) % 256, (x + y) % 256], axis=-1).astype(np.uint8)
        from PIL import Image

        Image.fromarray(rgb).save(src)
        Image.fromarray(rgb[::-1].copy()).save(src2)
        for task, model, opts in runs:
            opts = {"device": "cpu", "dtype": "float32", "quiet": True, **opts}
            if task == "generate":
                res = api.generate("a red circle", model=model, **opts)
            elif task == "edit":
                res = api.edit(str(src), "make it red", model=model, **opts)
            else:
                res = api.edit([str(src), str(src2)], "both", model=model, **opts)
            adapt = sorted(f"{a.what}={a.choice}" for a in res.record.adaptations)
            print(f"{task} {model} {json.dumps(opts, sort_keys=True)} -> {_digest(res.images)}"
                  f" adaptations={hashlib.sha256(repr(adapt).encode()).hexdigest()[:12]}")
        pipe = api.load_pipeline("tiny-ursa", "cpu", "float32")
        out = pipe(prompt="a red circle", height=64, width=64, num_inference_steps=4,
                   generator=torch.Generator().manual_seed(5), output_type="np")
        print(f"diffusers-style tiny-ursa -> {hashlib.sha256(np.ascontiguousarray(out.frames).tobytes()).hexdigest()[:16]}")
        for model, extra in (("tiny-ursa", {"height": 64, "width": 64}), ("tiny-qwen-edit", {"images": [str(src)]})):
            folder = Path(tmp) / f"v-{model}"
            result = difforge.validate(model=model, device="cpu", dtype="bfloat16", reference="cpu:float32",
                                       quick=True, out=str(folder), quiet=True, **extra)
            print(f"validate {model} -> {result.verdict} {_files(folder)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
