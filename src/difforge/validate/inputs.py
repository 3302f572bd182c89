"""The prompts file of a validation (the default prompts are each family probe's ``default_prompts``)."""

from __future__ import annotations

from pathlib import Path

from ..errors import InputError
from ..runtime.reading import read_text

#: Prompts one file may hold (each becomes at least one run).
MAX_PROMPTS = 10_000
#: Most bytes of a prompts file: MAX_PROMPTS prompts of over a thousand characters each.  The file is read by the
#: one reading rule (a regular file, capped while reading), so ``/dev/zero`` or a FIFO is refused at once.
MAX_PROMPT_FILE_BYTES = 16 << 20


def read_prompts(path: str | Path, flag: str = "--prompts") -> list[str]:
    """Non-empty, non-comment lines of a prompts file (UTF-8); every failure is one InputError sentence."""
    p = Path(path)
    if p.is_dir():
        raise InputError(f"{flag} {p} is a folder; give a text file, one prompt a line.")
    if not p.exists() and not p.is_symlink():
        raise InputError(f"{flag} file {p} does not exist; give a text file, one prompt a line.")
    text = read_text(p, limit=MAX_PROMPT_FILE_BYTES, what=f"{flag} file {p}", error=InputError)
    lines = text.splitlines()
    prompts = [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
    if not prompts:
        raise InputError(f"{flag} file {path} holds no prompt; write one prompt a line.")
    if len(prompts) > MAX_PROMPTS:
        raise InputError(f"{flag} file {path} holds {len(prompts)} prompts; at most {MAX_PROMPTS} are read at once.")
    return prompts
