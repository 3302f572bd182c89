"""Prompts and input images for a validation: the seeds' samples unless the user gives their own."""

from __future__ import annotations

from pathlib import Path

from PIL import Image, ImageDraw

from ..errors import InputError

#: The sample prompts of the URSA port report (seeds/000, sections 3.4 and 6.2).
URSA_PROMPTS = [
    "The bear, calm and still, gazes upward as if lost in contemplation of the cosmos.",
    "A serene mountain lake reflecting the aurora borealis at twilight.",
    "A futuristic cityscape with neon lights and flying vehicles at night.",
]
URSA_NEGATIVE = (
    "worst quality, low quality, inconsistent motion, static, still, blurry, jittery, distorted, ugly"
)
#: The edit instruction of the Qwen-Image-Edit port report (seeds/003, section 3.2), then two more.
EDIT_PROMPTS = [
    "Add a beautiful sunset background to this image.",
    "Turn the red circle into a blue square.",
    "Make the scene look like a watercolor painting.",
]


def default_prompts(family: str) -> list[str]:
    return list(URSA_PROMPTS if family == "ursa" else EDIT_PROMPTS)


def read_prompts(path: str | Path) -> list[str]:
    """Non-empty, non-comment lines of a prompts file (UTF-8); every failure is one InputError sentence."""
    p = Path(path)
    if p.is_dir():
        raise InputError(f"--prompts {p} is a folder; give a text file, one prompt a line.")
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise InputError(f"--prompts file {p} is not UTF-8 text; save it as UTF-8, one prompt a line.") from None
    except FileNotFoundError:
        raise InputError(f"--prompts file {p} does not exist; give a text file, one prompt a line.") from None
    except OSError as exc:
        raise InputError(f"--prompts file {p} cannot be read ({exc.strerror or exc}).") from None
    prompts = [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
    if not prompts:
        raise InputError(f"--prompts file {path} holds no prompt; write one prompt a line.")
    return prompts


def synthetic_image(size: int = 512) -> Image.Image:
    """A deterministic test picture (gradient sky, red disc, green ground), like the seed's
    "合成测试图片": edits then have something to act on without shipping a photo."""
    img = Image.new("RGB", (size, size))
    px = img.load()
    for y in range(size):
        for x in range(size):
            px[x, y] = (40 + (150 * y) // size, 80 + (100 * x) // size, 200 - (120 * y) // size)
    draw = ImageDraw.Draw(img)
    draw.rectangle([0, int(size * 0.7), size, size], fill=(60, 140, 60))
    r = size // 6
    c = (size // 2, int(size * 0.45))
    draw.ellipse([c[0] - r, c[1] - r, c[0] + r, c[1] + r], fill=(210, 40, 40))
    return img
