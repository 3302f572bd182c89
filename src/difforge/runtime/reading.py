"""The one rule for reading a file a user handed over: a regular file, size-capped, inside its root.

Why one place: every loader (model folders, ``--config``, ``--prompt-file``, bundles) reads files
an attacker may have prepared.  Each rule below closes a hole a campaign found open when every
loader made its own checks:

* **Regular files only, decided on the open descriptor.**  The file is opened first and
  ``os.fstat`` of the open descriptor decides, so nothing can be swapped in between the check and
  the read.  A FIFO is opened with ``O_NONBLOCK`` so that opening it cannot wait for a writer; a
  FIFO, a device (``/dev/zero``), a folder or a socket is then refused by name, never reported as
  "missing".
* **Size-capped while reading.**  At most ``limit + 1`` bytes are read, whatever the size the
  file reports (``/proc`` files report 0), so no input can make difforge allocate without bound.
* **Inside the root after every link.**  With a ``root``, the *real* path must lie inside the
  real root: a component folder that is a link to elsewhere is outside, a link that stays inside
  is fine.  On Linux the path the open descriptor really names is checked again after opening,
  so a link swapped in after the check still cannot lead outside.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

from ..errors import CheckpointError, DifforgeError, InputError

#: How many bytes one ``os.read`` asks for (large enough to be fast, small enough to waste nothing).
_CHUNK = 1 << 20

_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def describe_size(limit: int) -> str:
    """``limit`` bytes as a person reads it (``16 MB``, ``512 KB``, ``300 bytes``)."""
    for unit, size in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if limit >= size:
            value = limit / size
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{limit} bytes"


def kind_of(mode: int) -> str:
    """What an ``st_mode`` is, in words (``a FIFO``, ``a folder``, ``a regular file`` ...)."""
    if stat.S_ISREG(mode):
        return "a regular file"
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _real(path: Path, what: str, error: type[DifforgeError]) -> Path:
    try:
        return path.resolve()
    except (OSError, RuntimeError, ValueError) as exc:  # a link loop, a NUL byte in a name
        raise error(f"{what} cannot be resolved ({exc}).") from None


def _within(real: Path, roots: Sequence[Path]) -> bool:
    return any(real == root or real.is_relative_to(root) for root in roots)


def resolve_inside(
    root: Path,
    path: Path,
    what: str,
    error: type[DifforgeError] = CheckpointError,
    *,
    also: Sequence[Path] = (),
) -> Path:
    """The real path of ``path`` (every link followed) when it lies inside the real ``root``; else one line.

    ``what`` names the file and starts the sentence (``"tokenizer.json of M"``, ``"the --config
    file a.yaml"``).  ``also`` adds further real roots that count as inside (a Hugging Face cache
    snapshot's ``blobs`` store).  A path that does not exist resolves as far as it can and is
    judged the same way; whether it exists is the reader's question.
    """
    real = _real(Path(path), what, error)
    roots = [_real(Path(root), str(root), error), *(Path(r) for r in also)]
    if _within(real, roots):
        return real
    raise error(
        f"{what} resolves to {real}, outside {root}; difforge reads only files that lie inside it after every link."
    )


def _opened_path(fd: int) -> Path | None:
    """The path the kernel says descriptor ``fd`` names (Linux ``/proc``), ``None`` where it cannot say."""
    try:
        return Path(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:
        return None


def _open(target: Path, what: str, error: type[DifforgeError]) -> int:
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        return os.open(target, flags)
    except FileNotFoundError:
        raise error(f"{what} does not exist.") from None
    except PermissionError:
        raise error(f"{what} cannot be read (permission denied).") from None
    except OSError as exc:
        try:  # a socket cannot be opened at all (ENXIO): say what it is all the same
            kind = kind_of(os.stat(target).st_mode)
        except OSError:
            kind = ""
        if kind and kind not in ("a regular file", "not a regular file"):
            raise error(f"{what} is {kind}, not a regular file.") from None
        raise error(f"{what} cannot be opened ({exc.strerror or exc}).") from None


def _open_checked(
    path: Path, what: str, error: type[DifforgeError], root: Path | None, also: Sequence[Path],
    limit: int | None = None,
) -> tuple[int, os.stat_result]:
    """A descriptor open on the regular file ``path`` (inside ``root`` when given, at most ``limit`` bytes as
    ``fstat`` reports them) and its ``fstat``."""
    target = resolve_inside(root, path, what, error, also=also) if root is not None else path
    fd = _open(target, what, error)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{what} is {kind_of(st.st_mode)}, not a regular file.")
        if root is not None:
            opened = _opened_path(fd)
            if opened is not None and opened.is_absolute() and not _within(opened, [Path(root).resolve(), *also]):
                raise error(f"{what} was replaced by a link to {opened} while being opened; it lies outside {root}.")
        if limit is not None and st.st_size > limit:
            raise error(f"{what} is larger than {describe_size(limit)}, the most difforge reads for it.")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def check_file(
    path: str | Path,
    *,
    what: str,
    error: type[DifforgeError] = CheckpointError,
    root: Path | None = None,
    also: Sequence[Path] = (),
    limit: int | None = None,
) -> Path:
    """The real path of ``path`` once it is known to be a regular file (inside ``root``, at most ``limit``
    bytes when given); else one ``error`` line.

    For files a library opens itself (safetensors, transformers' tokenizer files): difforge cannot
    read them for it, so it holds them to the same rule first.  Judged on an open descriptor, like
    :func:`read_bytes`.
    """
    os.close(_open_checked(Path(path), what, error, root, also, limit)[0])
    return _real(Path(path), what, error)


def open_file(
    path: str | Path,
    *,
    what: str,
    error: type[DifforgeError] = CheckpointError,
    root: Path | None = None,
    also: Sequence[Path] = (),
    limit: int | None = None,
) -> BinaryIO:
    """The regular file ``path`` open for binary reading (seekable, for readers such as ``zipfile``), held to
    :func:`check_file`'s rule on the very descriptor returned."""
    fd, _st = _open_checked(Path(path), what, error, root, also, limit)
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_bytes(
    path: str | Path,
    *,
    limit: int,
    what: str,
    error: type[DifforgeError] = InputError,
    root: Path | None = None,
    also: Sequence[Path] = (),
) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them, else one ``error`` line.

    ``what`` names the file and starts each message (e.g. ``"the --config file a.yaml"``).  With
    ``root`` the file must lie inside it (or inside one of ``also``) after every link (see
    :func:`resolve_inside`).
    """
    fd, _st = _open_checked(Path(path), what, error, root, also)
    try:
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            try:
                chunk = os.read(fd, min(_CHUNK, limit + 1 - size))
            except OSError as exc:
                raise error(f"{what} cannot be read ({exc.strerror or exc}).") from None
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise error(
                f"{what} is larger than {describe_size(limit)}, the most difforge reads for it;"
                " it cannot be the file it should be."
            )
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_text(
    path: str | Path,
    *,
    limit: int,
    what: str,
    error: type[DifforgeError] = InputError,
    root: Path | None = None,
    also: Sequence[Path] = (),
) -> str:
    """:func:`read_bytes` decoded as UTF-8; bytes that are not UTF-8 are one ``error`` line naming the offset."""
    data = read_bytes(path, limit=limit, what=what, error=error, root=root, also=also)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{what} is not UTF-8 text (byte {exc.start} cannot be decoded).") from None


__all__ = ["check_file", "describe_size", "kind_of", "open_file", "read_bytes", "read_text", "resolve_inside"]
