"""The one pre-flight of output paths, and the mark that makes a file recognisably difforge's own.

Why before the run: an output that cannot be written must stop the run before anything is written.
Checking the folder's permission bits is not enough (root passes ``os.access`` on ``/proc``), so the
pre-flight creates and removes a temporary file where the output's temporary file will go: a
``--record`` in an unwritable place is refused before ``--output`` is touched (issue 26 W8).

Why the mark: ``os.replace`` puts the new file where the old one was, whatever it was.  A FIFO, a
device node or a link at an output path is refused outright (the rename would replace the link, not
write through it, and a FIFO or device is somebody's plumbing).  A regular file is replaced only when
difforge wrote it - a picture carrying :data:`SOFTWARE` in its EXIF ``Software`` tag (GIF: its comment),
a RunRecord or a perf dump by their JSON keys - or when the user passes ``--overwrite`` (issue 26 D2).
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from ..errors import OutputError
from ..version import __version__

#: The EXIF ``Software`` value (tag 0x0131) every picture difforge saves carries.
SOFTWARE = f"difforge {__version__}"
SOFTWARE_TAG = 0x0131
#: Keys every RunRecord JSON has, and every perf dump (``RunRecord.perf_dump``).
RECORD_KEYS = frozenset({"kind", "config", "backend", "environment", "adaptations", "phases", "schema_version"})
PERF_KEYS = frozenset({"total_duration_ms", "steps", "denoise_steps_ms", "difforge_version"})
#: Most bytes read to recognise a previous output (the pixels are never decoded, only the header and tags).
RECOGNISE_LIMIT = 256 << 20

_KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def save_options(fmt: str) -> dict[str, Any]:
    """Keyword arguments for ``PIL.Image.save`` in format ``fmt`` that put the difforge mark in the file."""
    if fmt.upper() == "GIF":
        return {"comment": SOFTWARE.encode()}
    from PIL import Image

    exif = Image.Exif()
    exif[SOFTWARE_TAG] = SOFTWARE
    return {"exif": exif}


def is_difforge_picture(path: Path) -> bool:
    """The picture at ``path`` carries difforge's mark (any version)."""
    from PIL import Image

    from .reading import open_file

    try:
        with open_file(path, what=str(path), error=OutputError, limit=RECOGNISE_LIMIT) as fh, Image.open(fh) as im:
            comment = im.info.get("comment")
            software = im.getexif().get(SOFTWARE_TAG) if comment is None else comment
    except Exception:  # noqa: BLE001 - anything unreadable is not recognisably ours
        return False
    if isinstance(software, bytes):
        software = software.decode("utf-8", "replace")
    return isinstance(software, str) and software.startswith("difforge ")


def is_difforge_json(path: Path) -> bool:
    """The JSON at ``path`` is a RunRecord or a perf dump (by their keys)."""
    from .reading import read_text

    try:
        data = json.loads(read_text(path, limit=RECOGNISE_LIMIT, what=str(path), error=OutputError))
    except Exception:  # noqa: BLE001 - unreadable or not JSON: not recognisably ours
        return False
    return isinstance(data, dict) and (data.keys() >= RECORD_KEYS or data.keys() >= PERF_KEYS)


def _kind(mode: int) -> str | None:
    return next((name for test, name in _KINDS if test(mode)), None)


def check_writable_folder(path: Path, flag: str) -> Path:
    """The nearest existing folder of ``path``'s parent, after creating and removing a temporary file in it.

    That is where the output's temporary file (or the folders leading to it) will be created; the folder's
    permission bits say nothing for root or for read-only and virtual file systems, so try it.
    """
    probe = path.parent if str(path.parent) else Path(".")
    while not probe.exists() and not probe.is_symlink() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise OutputError(f"Cannot write {flag} {path}: {probe} is not a folder.")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".difforge-probe.", dir=probe)
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        raise OutputError(f"Cannot write {flag} {path}: {probe} is not a writable folder "
                          f"({exc.strerror or exc}).") from None
    return probe


def check_output_file(path: str | Path, flag: str, *, overwrite: bool = False, kind: str = "picture") -> Path:
    """Refuse, before any work, an output path that difforge must not or cannot replace (OutputError, exit 2).

    ``kind`` (``picture`` or ``json``) says how a previous difforge output at ``path`` is recognised; any other
    regular file is replaced only with ``overwrite``.  A link, folder, FIFO, device or socket is never replaced.
    """
    path = Path(path)
    try:
        st: os.stat_result | None = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise OutputError(f"Cannot write {flag} {path}: {exc.strerror or exc}.") from None
    if st is not None:
        what = _kind(st.st_mode)
        if what == "a folder":
            raise OutputError(f"{flag} {path} is a folder; give a file name.")
        if what is not None:
            raise OutputError(f"{flag} {path} is {what}; difforge replaces only regular files (writing would replace "
                              f"the {what.split()[-1]} itself), so give another name.")
        ours = is_difforge_json(path) if kind == "json" else is_difforge_picture(path)
        if not ours and not overwrite:
            raise OutputError(f"{flag} {path} is a file difforge did not write; pass --overwrite to replace it, or "
                              "give another name.")
    check_writable_folder(path, flag)
    return path


__all__ = ["SOFTWARE", "check_output_file", "check_writable_folder", "is_difforge_json", "is_difforge_picture",
           "save_options"]
