"""``make demo``: the main job on the embedded tiny models, end to end, offline.

1. generate an image with ``tiny-ursa``;
2. edit a synthetic picture with ``tiny-qwen-edit`` and two pictures with ``tiny-qwen-edit-plus``;
3. validate ``tiny-ursa`` and ``tiny-qwen-edit`` on the best local device against a float32 CPU
   reference (on a CPU-only machine: bfloat16 under test) and print the report paths.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from . import api
from .devices import available_backends
from .errors import DifforgeError
from .runtime.images import test_picture


def write_test_picture(path: Path, size: int = 128, variant: int = 0) -> Path:
    """Save difforge's synthetic test picture (:func:`difforge.runtime.images.test_picture`) as a PNG."""
    path.parent.mkdir(parents=True, exist_ok=True)
    test_picture(size, variant=variant).save(path)
    return path


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
        res = api.generate(
            "a red circle", model="tiny-ursa", seed=0, output=str(out / "ursa.png"),
            record=str(out / "ursa.json"), quiet=True,
        )
        print(f"[generate] tiny-ursa -> image {res.paths[0]}  record {out / 'ursa.json'}  "
              f"({time.perf_counter() - t0:.1f}s)")

        src = write_test_picture(out / "input.png")
        src2 = write_test_picture(out / "input2.png", variant=1)
        t0 = time.perf_counter()
        res = api.edit(
            str(src), "make it red", model="tiny-qwen-edit", steps=4, seed=0,
            output=str(out / "edit.png"), record=str(out / "edit.json"), quiet=True,
        )
        print(f"[edit] tiny-qwen-edit -> image {res.paths[0]}  record {out / 'edit.json'}  "
              f"({time.perf_counter() - t0:.1f}s)")
        t0 = time.perf_counter()
        res = api.edit(
            [str(src), str(src2)], "put both in one picture", model="tiny-qwen-edit-plus", steps=4, seed=0,
            output=str(out / "edit_plus.png"), record=str(out / "edit_plus.json"), quiet=True,
        )
        print(f"[edit] tiny-qwen-edit-plus (2 images) -> image {res.paths[0]}  record {out / 'edit_plus.json'}  "
              f"({time.perf_counter() - t0:.1f}s)")

        if not args.skip_validate:
            dtype = "bfloat16" if device == "cpu" else "auto"
            # tiny-ursa validates at 128x128: CPUs without native bf16 convolutions (AVX2 x86, many aarch64
            # hosts) run torch's slow bf16 conv path, ~30x slower than fp32 at the 320x512 default.
            ursa_size = {"height": 128, "width": 128}
            for model, extra in (("tiny-ursa", ursa_size), ("tiny-qwen-edit", {"images": [str(src)]})):
                t0 = time.perf_counter()
                result = api.validate(
                    model=model, device=device, dtype=dtype, reference="cpu:float32", quick=True,
                    out=str(out / f"validate-{model}"), quiet=True, **extra,
                )
                print(f"[validate] {model} ({device} {dtype} vs cpu float32): {result.verdict} "
                      f"({time.perf_counter() - t0:.1f}s)")
                for name, path in result.report_paths.items():
                    print(f"    {name}: {path}")
    except DifforgeError as exc:
        print(f"difforge: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
