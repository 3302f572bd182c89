"""``make demo``: the main job on the built-in models, end to end, offline.

1. **generate**: held-out captions with ``shapes-ursa`` (trained on the shapes world; no caption's
   (shape, colour, background) combination was in its training set), one contact sheet whose tiles
   the shapes checker marks ``ok`` (the picture shows what the caption says) or ``WRONG``;
2. **edit**: held-out edits with ``shapes-qwen-edit`` (source | result tiles, marked the same way)
   when its trained weights are committed; until then ``tiny-qwen-edit`` (random weights: its
   picture is noise, it shows the edit path runs) edits a synthetic picture, and
   ``tiny-qwen-edit-plus`` two;
3. **validate** both on the best local device against a float32 CPU reference (on a CPU-only
   machine: bfloat16 under test), the semantic rung included for the trained models, and print
   the report paths.

The random-weight tiny models stay for the fast tests.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from PIL import Image

from . import api
from .devices import available_backends
from .errors import DifforgeError, ModelNotFoundError
from .models.trained import trained_path
from .runtime.atomic import atomic_save
from .runtime.images import test_picture
from .shapes.prompts import heldout_caption_set, heldout_edit_set, score
from .validate.gallery import contact_sheet

#: How many held-out captions / edits the demo draws (3-column sheets).
N_CAPTIONS = 9
N_EDITS = 6


def write_test_picture(path: Path, size: int = 128, variant: int = 0) -> Path:
    """Save difforge's synthetic test picture (:func:`difforge.runtime.images.test_picture`) as a PNG."""
    path.parent.mkdir(parents=True, exist_ok=True)
    test_picture(size, variant=variant).save(path)
    return path


def trained(name: str) -> bool:
    """Whether the trained built-in ``name`` has committed weights (the demo falls back to a tiny model)."""
    try:
        trained_path(name)
    except ModelNotFoundError:
        return False
    return True


def _mark(ok: bool, text: str) -> str:
    return f"{'ok' if ok else 'WRONG'}: {text}"


def _save_sheet(path: Path, images: list[Image.Image], labels: list[str], title: str = "", columns: int = 3) -> Path:
    grid = contact_sheet(images, labels, columns=columns, title=title)
    atomic_save(path, lambda tmp: grid.save(tmp, format="PNG"))
    return path


def sheet_title(model: str, correct: int, n: int, what: str, device: str) -> str:
    """The sheet's own figure, on the sheet: the count is this demo's (``n`` held-out prompts, one seed each,
    the model's default steps), not the 40-prompt evaluation of docs/shapes-training.md the README quotes."""
    return (f"{model}: {correct}/{n} of these held-out {what} done as asked (checker), one seed each, default "
            f"steps and dtype on {device}; the 40-prompt evaluation is in docs/shapes-training.md")


def captions_sheet(out: Path, device: str, n: int = N_CAPTIONS) -> tuple[Path, int, int]:
    """``n`` held-out captions on shapes-ursa (seed = index); the sheet, how many the checker passed, how many drawn."""
    pset = heldout_caption_set(n)
    images, labels, correct = [], [], 0
    for k, item in enumerate(pset.items):
        res = api.generate(item.prompt, model="shapes-ursa", device=device, seed=k,
                           output=str(out / "shapes-ursa" / f"{item.id}.png"), quiet=True)
        img = Image.open(res.paths[0])
        ok = score(img, item).correct
        correct += ok
        images.append(img)
        labels.append(_mark(ok, item.prompt))
    title = sheet_title("shapes-ursa", correct, len(pset.items), "captions", device)
    return _save_sheet(out / "shapes-ursa_contact_sheet.png", images, labels, title), correct, len(pset.items)


def _side_by_side(a: Image.Image, b: Image.Image) -> Image.Image:
    """``a`` then ``b`` on one canvas (an edit's source and result)."""
    a, b = a.convert("RGB"), b.convert("RGB").resize(a.size)
    canvas = Image.new("RGB", (a.width * 2 + 4, a.height), "white")
    canvas.paste(a, (0, 0))
    canvas.paste(b, (a.width + 4, 0))
    return canvas


def edits_sheet(out: Path, device: str, n: int = N_EDITS) -> tuple[Path, int, int]:
    """``n`` held-out edits on shapes-qwen-edit (source | result tiles); the sheet, passed, drawn."""
    pset = heldout_edit_set(n)
    images, labels, correct = [], [], 0
    for k, item in enumerate(pset.items):
        src = out / "shapes-qwen-edit" / f"{item.id}_source.png"
        src.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pset.source_image(item)).save(src)
        res = api.edit(str(src), item.prompt, model="shapes-qwen-edit", device=device, seed=k,
                       output=str(out / "shapes-qwen-edit" / f"{item.id}.png"), quiet=True)
        img = Image.open(res.paths[0])
        ok = score(img, item).correct
        correct += ok
        images.append(_side_by_side(Image.open(src), img))
        labels.append(_mark(ok, item.prompt))
    title = sheet_title("shapes-qwen-edit", correct, len(pset.items), "edits (source | result)", device)
    path = _save_sheet(out / "shapes-qwen-edit_contact_sheet.png", images, labels, title, columns=2)
    return path, correct, len(pset.items)


def tiny_edits(out: Path) -> tuple[str, dict[str, Any]]:
    """The random-weight edit models on synthetic pictures; the model to validate and its options."""
    src = write_test_picture(out / "input.png")
    src2 = write_test_picture(out / "input2.png", variant=1)
    t0 = time.perf_counter()
    res = api.edit(str(src), "make it red", model="tiny-qwen-edit", steps=4, seed=0,
                   output=str(out / "edit.png"), record=str(out / "edit.json"), quiet=True)
    print(f"[edit] tiny-qwen-edit (random weights; this checkout has no shapes-qwen-edit weights) -> image {res.paths[0]}  "
          f"record {out / 'edit.json'}  ({time.perf_counter() - t0:.1f}s)")
    t0 = time.perf_counter()
    res = api.edit([str(src), str(src2)], "put both in one picture", model="tiny-qwen-edit-plus", steps=4, seed=0,
                   output=str(out / "edit_plus.png"), record=str(out / "edit_plus.json"), quiet=True)
    print(f"[edit] tiny-qwen-edit-plus (2 images) -> image {res.paths[0]}  record {out / 'edit_plus.json'}  "
          f"({time.perf_counter() - t0:.1f}s)")
    return "tiny-qwen-edit", {"images": [str(src)]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="demo-out", type=Path)
    parser.add_argument("--skip-validate", action="store_true", help="only generate and edit")
    args = parser.parse_args(argv)
    out: Path = args.out
    device = available_backends()[0]
    print(f"difforge demo on {device} (backends here: {', '.join(available_backends())})")
    try:
        t0 = time.perf_counter()
        sheet, ok, n = captions_sheet(out, device)
        print(f"[generate] shapes-ursa, {n} held-out captions: {ok}/{n} drawn as asked -> {sheet} "
              f"({time.perf_counter() - t0:.1f}s)")
        if trained("shapes-qwen-edit"):
            t0 = time.perf_counter()
            sheet, ok, n = edits_sheet(out, device)
            print(f"[edit] shapes-qwen-edit, {n} held-out edits: {ok}/{n} done as asked -> {sheet} "
                  f"({time.perf_counter() - t0:.1f}s; one seed each - the 40-edit evaluation is "
                  "docs/shapes-training.md's)")
            edit_model, edit_options = "shapes-qwen-edit", {}
        else:
            edit_model, edit_options = tiny_edits(out)

        if not args.skip_validate:
            dtype = "bfloat16" if device == "cpu" else "auto"
            for model, extra in (("shapes-ursa", {}), (edit_model, edit_options)):
                t0 = time.perf_counter()
                result = api.validate(model=model, device=device, dtype=dtype, reference="cpu:float32", quick=True,
                                      out=str(out / f"validate-{model}"), quiet=True, **extra)
                semantic = result.rungs.get("semantic")
                line = f"; semantic rung {semantic.verdict}" if semantic is not None else ""
                print(f"[validate] {model} ({device} {dtype} vs cpu float32): {result.verdict}{line} "
                      f"({time.perf_counter() - t0:.1f}s)")
                for name, path in result.report_paths.items():
                    print(f"    {name}: {path}")
    except DifforgeError as exc:
        print(f"difforge: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
