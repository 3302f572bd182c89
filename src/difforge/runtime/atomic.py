"""Write outputs to a temporary file and rename: a failure never leaves a half-written file."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(final: str | Path) -> Iterator[Path]:
    """Yield a temp path beside ``final``; rename it into place only if the block succeeds.

    Any OSError (no permission, a directory in the way, disk full) becomes one OutputError sentence.
    """
    from ..errors import OutputError

    final = Path(final)
    tmp_path: Path | None = None
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".part" + final.suffix, dir=final.parent)
        os.close(fd)
        tmp_path = Path(tmp)
        yield tmp_path
        os.chmod(tmp_path, 0o666 & ~_umask())  # mkstemp makes 0600 files; outputs get normal permissions
        os.replace(tmp_path, final)
    except OSError as exc:
        raise OutputError(f"Could not write {final}: {exc.strerror or exc}.") from None
    finally:
        if tmp_path is not None and tmp_path.exists():
            tmp_path.unlink()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_text(final: Path, text: str) -> Path:
    with atomic_path(final) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return final


def atomic_write_bytes(final: Path, data: bytes) -> Path:
    with atomic_path(final) as tmp:
        tmp.write_bytes(data)
    return final


def atomic_save(final: str | Path, writer: Callable[[Path], None]) -> Path:
    """Run ``writer(tmp_path)`` then move the result to ``final``."""
    with atomic_path(final) as tmp:
        writer(tmp)
    return Path(final)
