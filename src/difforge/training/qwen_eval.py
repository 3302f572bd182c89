"""Held-out accuracy of ``shapes-qwen-edit``: the world's held-out edits through the normal pipeline.

``python -m difforge.training.qwen_eval [--model shapes-qwen-edit] [--n 40] [--sheet out.png]``
loads the model the way ``difforge edit`` does (registry name or folder, CPU, float32), runs each of
:func:`difforge.shapes.prompts.heldout_edit_set`'s edits with the run defaults (steps, true CFG and
negative prompt unless given) and scores the picture with the rule-based checker.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from difforge.api import load_pipeline
from difforge.config import RunConfig
from difforge.engine import run_pipeline
from difforge.shapes.prompts import heldout_edit_set, score


@dataclass
class EditEval:
    """One scored edit."""

    id: str
    kind: str
    prompt: str
    correct: bool
    detail: str
    image: np.ndarray = field(repr=False)
    source: np.ndarray = field(repr=False)


@dataclass
class EvalResult:
    items: list[EditEval]
    seconds: float

    @property
    def accuracy(self) -> float:
        return sum(i.correct for i in self.items) / len(self.items)

    def by_kind(self) -> dict[str, tuple[int, int]]:
        """kind -> (correct, total)."""
        out: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for it in self.items:
            out[it.kind][0] += it.correct
            out[it.kind][1] += 1
        return {k: (v[0], v[1]) for k, v in sorted(out.items())}

    def summary(self) -> str:
        kinds = ", ".join(f"{k} {c}/{t}" for k, (c, t) in self.by_kind().items())
        n = len(self.items)
        return f"{sum(i.correct for i in self.items)}/{n} correct ({self.accuracy:.0%}); {kinds}; {self.seconds:.0f}s"


def evaluate(
    model: str | Path = "shapes-qwen-edit",
    n: int = 40,
    seed: int = 0,
    *,
    indices: list[int] | None = None,
    steps: int | None = None,
    true_cfg: float | None = None,
    dtype: str = "float32",
    pipeline=None,
    log=None,
) -> EvalResult:
    """Run and score ``n`` held-out edits (or only ``indices`` of them); None steps / true_cfg are the
    run defaults ``difforge edit`` uses."""
    t0 = time.perf_counter()
    model = str(model)
    pipe = pipeline or load_pipeline(model, device="cpu", dtype=dtype, task="edit")
    prompt_set = heldout_edit_set(n=n, seed=seed)
    chosen = range(len(prompt_set.items)) if indices is None else indices
    options = {k: v for k, v in (("steps", steps), ("true_cfg", true_cfg)) if v is not None}
    results: list[EditEval] = []
    for k in chosen:
        item = prompt_set.items[k]
        source = prompt_set.source_image(item)
        cfg = RunConfig(model=model, prompt=item.prompt, device="cpu", dtype=dtype, quiet=True, **options)
        picture = np.asarray(run_pipeline(pipe, cfg, images=[Image.fromarray(source)]).images[0].convert("RGB"))
        s = score(picture, item)
        results.append(EditEval(item.id, item.meta["edit"], item.prompt, s.correct, s.detail, picture, source))
        if log is not None:
            log(f"{item.id} {item.meta['edit']:10s} {'ok ' if s.correct else 'BAD'} {item.prompt!r}: {s.detail}")
    return EvalResult(results, time.perf_counter() - t0)


def vae_readback(vae, n: int = 40, seed: int = 0) -> tuple[float, list[str]]:
    """The VAE's ceiling: the fraction of the ``2 n`` held-out edit pictures (sources and targets,
    64 px) whose reconstruction ``decode(encode(x).mode())`` the checker reads back as the scene it
    shows; and a line for each one it misreads."""
    import torch

    from difforge.models.qwen_edit.vae_convs import two_d as single_frame_convs
    from difforge.shapes.checker import score_caption
    from difforge.shapes.world import edits, render

    scenes = [s for e in edits(seed, n, split="heldout") for s in (e.source, e.target)]
    pixels = np.stack([render(s) for s in scenes])
    x = torch.from_numpy(pixels).permute(0, 3, 1, 2).float().div(127.5).sub(1).unsqueeze(2)
    with torch.no_grad(), single_frame_convs(vae):
        rec = torch.cat([vae.decode(vae.encode(x[i : i + 20]).latent_dist.mode()).sample for i in range(0, len(x), 20)])
    images = ((rec[:, :, 0].clamp(-1, 1) + 1) * 127.5).round().byte().permute(0, 2, 3, 1).numpy()
    bad = []
    for k, (scene, image) in enumerate(zip(scenes, images, strict=True)):
        s = score_caption(image, scene)
        if not s.correct:
            bad.append(f"{k}: {s.detail}")
    return 1 - len(bad) / len(scenes), bad


def contact_sheet(result: EvalResult, path: Path, columns: int = 8) -> Path:
    """Source above result for every edit, a red bar under each wrong one."""
    items = result.items
    tile = items[0].image.shape[0]
    rows = (len(items) + columns - 1) // columns
    sheet = np.full((rows * (2 * tile + 6), columns * (tile + 4), 3), 128, dtype=np.uint8)
    for k, it in enumerate(items):
        r, c = divmod(k, columns)
        y, x = r * (2 * tile + 6), c * (tile + 4)
        sheet[y : y + tile, x : x + tile] = it.source
        sheet[y + tile + 1 : y + 2 * tile + 1, x : x + tile] = it.image
        sheet[y + 2 * tile + 2 : y + 2 * tile + 5, x : x + tile] = (40, 170, 60) if it.correct else (220, 40, 40)
    Image.fromarray(sheet).save(path)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m difforge.training.qwen_eval")
    parser.add_argument("--model", default="shapes-qwen-edit")
    parser.add_argument("--n", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--true-cfg", type=float, default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sheet", type=Path, default=None, help="write a contact sheet PNG here")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    result = evaluate(args.model, args.n, args.seed, steps=args.steps, true_cfg=args.true_cfg,
                      log=log if args.verbose else None)
    print(result.summary())
    if args.sheet:
        contact_sheet(result, args.sheet)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
