"""The prompts file of a validation (the default prompts are each family probe's ``default_prompts``)."""

from __future__ import annotations

from pathlib import Path

from ..errors import InputError

#: Prompts one file may hold (each becomes at least one run).
MAX_PROMPTS = 10_000


def read_prompts(path: str | Path, flag: str = "--prompts") -> list[str]:
    """Non-empty, non-comment lines of a prompts file (UTF-8); every failure is one InputError sentence."""
    p = Path(path)
    if p.is_dir():
        raise InputError(f"{flag} {p} is a folder; give a text file, one prompt a line.")
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise InputError(f"{flag} file {p} is not UTF-8 text; save it as UTF-8, one prompt a line.") from None
    except FileNotFoundError:
        raise InputError(f"{flag} file {p} does not exist; give a text file, one prompt a line.") from None
    except OSError as exc:
        raise InputError(f"{flag} file {p} cannot be read ({exc.strerror or exc}).") from None
    prompts = [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
    if not prompts:
        raise InputError(f"{flag} file {path} holds no prompt; write one prompt a line.")
    if len(prompts) > MAX_PROMPTS:
        raise InputError(f"{flag} file {path} holds {len(prompts)} prompts; at most {MAX_PROMPTS} are read at once.")
    return prompts
