"""Write outputs to a temporary file and rename: a failure never leaves a half-written file."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from .signals import deferred_signals


@contextmanager
def atomic_path(final: str | Path) -> Iterator[Path]:
    """Yield a temp path beside ``final``; rename it into place only if the block succeeds.

    Any OSError (no permission, a directory in the way, disk full) becomes one OutputError sentence.
    The ``finally`` removes the temp file on any exception, Ctrl-C included; SIGTERM/SIGHUP reach it
    only as exceptions, which the CLI arranges (:func:`difforge.runtime.signals.signals_raise`).
    Creating the temp file and removing it run with signals deferred, so an interrupt cannot land
    between ``mkstemp`` and the line that remembers the name.  Parent folders this call created are
    removed again when the write fails (``-o new/a.png`` interrupted leaves no empty ``new/``).
    """
    from ..errors import OutputError

    final = Path(final)
    tmp_path: Path | None = None
    made: list[Path] = []
    done = False
    try:
        with deferred_signals():
            _make_parents(final.parent, made)
            fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".part" + final.suffix, dir=final.parent)
            tmp_path = Path(tmp)
            os.close(fd)
        yield tmp_path
        os.chmod(tmp_path, 0o666 & ~_umask())  # mkstemp makes 0600 files; outputs get normal permissions
        os.replace(tmp_path, final)
        done = True
    except OSError as exc:
        raise OutputError(f"Could not write {final}: {exc.strerror or exc}.") from None
    finally:
        with deferred_signals():
            if tmp_path is not None:
                tmp_path.unlink(missing_ok=True)
            for folder in [] if done else reversed(made):
                with contextlib.suppress(OSError):  # only if still empty
                    folder.rmdir()


def _make_parents(folder: Path, made: list[Path]) -> None:
    """``mkdir -p folder``, appending each folder it creates (outermost first) to ``made``."""
    missing: list[Path] = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    for path in reversed(missing):
        try:
            path.mkdir()
        except FileExistsError:  # made meanwhile by someone else: not ours to remove
            if not path.is_dir():
                raise
            continue
        made.append(path)


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
