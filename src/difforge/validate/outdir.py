"""The report folder ``--out``: built aside, published whole, never mixed with a user's files.

``difforge validate`` writes its report into a hidden sibling (``.NAME.XXXXXXXX.part``) and renames
it to ``--out`` only once every file is written.  An error, Ctrl-C or SIGTERM before that removes
the sibling and every parent folder this run created, so ``--out a/b`` never leaves an empty
``a/``, and an interrupted run never leaves a half-filled report.

``--out`` may name a new folder, an empty one, or a previous difforge report folder, which is then
replaced as a whole.  Any other non-empty folder is refused (exit 2): difforge never overwrites or
deletes files it did not write.  A previous report is recognised by its ``SHA256SUMS``: it lists
the sha256 of ``report.json`` (which must match and look like a report) and every other file in the
folder (an extra file, say the user's notes, makes it "not ours").
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from ..errors import OutputError
from ..runtime.signals import deferred_signals

SUMS = "SHA256SUMS"
REPORT_JSON = "report.json"
#: Keys every report.json difforge writes has (see difforge.report.render.write_report).
REPORT_KEYS = frozenset({"verdict", "exit_code", "rungs", "deliverables"})


#: Most bytes read of a previous report's SHA256SUMS and report.json to recognise it (a report is far smaller).
MAX_SUMS_BYTES = 16 << 20
MAX_REPORT_JSON_BYTES = 256 << 20


def _read(folder: Path, name: str, limit: int) -> str | None:
    """A file of a folder that may be a previous report, by the one reading rule (a FIFO or device named
    SHA256SUMS is not waited on); None when it is not a regular, readable, UTF-8 file inside the folder."""
    from ..errors import DifforgeError
    from ..runtime.reading import read_text

    try:
        return read_text(folder / name, limit=limit, what=str(folder / name), root=folder)
    except DifforgeError:
        return None


def _sums(folder: Path) -> dict[str, str] | None:
    """``SHA256SUMS`` as {relative path: sha256}; None when it is missing or not in that format."""
    text = _read(folder, SUMS, MAX_SUMS_BYTES)
    if text is None:
        return None
    listed: dict[str, str] = {}
    for line in text.splitlines():
        digest, sep, name = line.partition("  ")
        if not sep or len(digest) != 64 or not name:
            return None
        listed[name] = digest
    return listed


def is_report_folder(folder: Path) -> bool:
    """True when ``folder`` holds a difforge report and nothing else (so replacing it loses nothing)."""
    listed = _sums(folder)
    if listed is None or REPORT_JSON not in listed:
        return False
    text = _read(folder, REPORT_JSON, MAX_REPORT_JSON_BYTES)
    if text is None:
        return False
    try:
        if hashlib.sha256(text.encode("utf-8")).hexdigest() != listed[REPORT_JSON]:
            return False
        data = json.loads(text)
    except (ValueError, RecursionError):
        return False
    if not isinstance(data, dict) or not data.keys() >= REPORT_KEYS:
        return False
    allowed = {*listed, SUMS}
    allowed_dirs = {parent.as_posix() for name in allowed for parent in Path(name).parents}
    for root, dirs, files in os.walk(folder):
        rel = Path(root).relative_to(folder)
        for name in dirs + files:
            if (Path(root) / name).is_symlink():
                return False  # difforge writes no links
        if any((rel / d).as_posix() not in allowed_dirs for d in dirs):
            return False  # only the folders difforge's files sit in
        if any((rel / f).as_posix() not in allowed for f in files):
            return False
    return True


def replaceable(folder: Path) -> bool:
    """``--out`` may be used: absent, an empty folder, or a previous difforge report folder or golden bundle."""
    if not folder.exists():
        return True
    if not folder.is_dir():
        return False
    if not any(folder.iterdir()) or is_report_folder(folder):
        return True
    from .bundle import is_bundle_folder  # a previous golden bundle (difforge golden --out) is ours too

    return is_bundle_folder(folder)


def refuse_message(folder: Path) -> str:
    return (f"--out {folder} is a folder with files difforge did not write; give a new or empty folder "
            "(a previous difforge report folder is replaced as a whole).")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


class StagedFolder:
    """A hidden folder beside ``final`` to write into; :meth:`publish` renames it to ``final``.

    ``final`` is the path the user gave; a symbolic link there is followed, so the link keeps
    pointing at the (new) report.
    """

    def __init__(self, final: str | Path) -> None:
        self.final = Path(final)
        self.target = Path(os.path.realpath(self.final)) if self.final.is_symlink() else self.final
        self.work: Path | None = None
        #: Parent folders this run made, outermost first; removed again when the run fails.
        self.made: list[Path] = []

    def create(self) -> Path:
        """Make the missing parents and the hidden work folder; an OSError is one OutputError sentence."""
        missing: list[Path] = []
        probe = self.target.parent
        while not probe.exists() and probe != probe.parent:
            missing.append(probe)
            probe = probe.parent
        try:
            with deferred_signals():  # what was made is remembered before an interrupt can land
                for folder in reversed(missing):
                    folder.mkdir()
                    self.made.append(folder)
                self.work = Path(tempfile.mkdtemp(prefix=f".{self.target.name}.", suffix=".part",
                                                  dir=self.target.parent))
        except OSError as exc:
            self.discard()
            raise OutputError(f"--out {self.final} cannot be created ({exc.strerror or exc}).") from None
        return self.work

    def publish(self) -> Path:
        """Move the finished folder to ``final`` (replacing an empty folder or a previous report)."""
        assert self.work is not None, "create() first"
        with deferred_signals():  # the old report goes only once the new one is in place
            if not replaceable(self.target):  # it changed since the options were checked
                self.discard()
                raise OutputError(refuse_message(self.final))
            old: Path | None = None
            try:
                os.chmod(self.work, 0o777 & ~_umask())  # mkdtemp makes 0700 folders
                if self.target.exists():
                    old = self.work.with_name(self.work.name[: -len(".part")] + ".old")
                    os.rename(self.target, old)
                try:
                    os.rename(self.work, self.target)
                except OSError:
                    if old is not None:
                        os.rename(old, self.target)
                        old = None
                    raise
            except OSError as exc:
                self.discard()
                raise OutputError(f"Could not move the report into {self.final}: {exc.strerror or exc}.") from None
            self.work, self.made = None, []
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        return self.final

    def discard(self) -> None:
        """Remove the work folder and the parents this run made (only if they are still empty)."""
        with deferred_signals():
            if self.work is not None:
                shutil.rmtree(self.work, ignore_errors=True)
                self.work = None
            for folder in reversed(self.made):
                with contextlib.suppress(OSError):
                    folder.rmdir()
            self.made = []
