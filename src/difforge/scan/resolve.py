"""What to read: a file, a folder, or a module name found on disk without importing it.

A module name (``diffusers.pipelines.qwenimage``) is resolved the way the import system would find
it, minus the execution: :func:`importlib.util.find_spec` is asked about the top-level name only
(finding a top-level spec runs none of its code, whereas ``find_spec("a.b")`` imports ``a``), and
the rest of the dotted path is followed on disk through ``submodule_search_locations``.  Scanning a
package that is broken, or needs an accelerator to import, therefore works - which is the point.
"""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError
from .result import printable

#: Folders never descended into inside a scanned folder (a folder given directly is always read).
SKIP_DIRS = frozenset({"__pycache__", "site-packages", "node_modules"})
_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


@dataclass(frozen=True)
class Resolved:
    """The files to read, the root the user named, and the folder display paths are relative to."""

    root: Path
    files: tuple[Path, ...]
    base: Path

    def display(self, path: Path) -> str:
        try:
            return path.relative_to(self.base).as_posix()
        except ValueError:
            return path.as_posix()


def python_files(folder: Path) -> list[Path]:
    """``*.py`` under ``folder``, sorted, skipping hidden folders, caches, virtual envs and site-packages."""
    out: list[Path] = []
    for here, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIP_DIRS
                         and not d.startswith("venv"))
        out.extend(Path(here, n) for n in sorted(names) if n.endswith(".py"))
    return out


def resolve(target: str | Path) -> Resolved:
    """Files for a path or a module name; an unknown one is an :class:`InputError` (one line, exit 2)."""
    text = str(target)
    path = Path(text).expanduser()
    if path.exists():
        path = path.resolve()
        if path.is_dir():
            return Resolved(path, tuple(python_files(path)), path.parent)
        if path.is_file():
            return Resolved(path, (path,), path.parent)
        raise InputError(f"{printable(text)} is neither a regular file nor a folder.")
    if not _DOTTED.match(text):
        raise InputError(f"{printable(text)}: no such file or folder (and not a module name).")
    return _module(text)


def _module(name: str) -> Resolved:
    top, *rest = name.split(".")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError) as exc:  # a broken entry in sys.modules, a bad meta-path finder
        raise InputError(f"{name}: the module {top!r} cannot be located ({exc}).") from exc
    if spec is None:
        raise InputError(f"{name}: no such file or folder, and no module {top!r} is installed here.")
    if spec.submodule_search_locations:
        locations = [Path(p) for p in spec.submodule_search_locations]
    elif spec.origin and spec.origin.endswith(".py") and not rest:
        origin = Path(spec.origin).resolve()
        return Resolved(origin, (origin,), origin.parent)
    elif rest:
        raise InputError(f"{name}: {top!r} is a module, not a package, so it has no {rest[0]!r}.")
    else:
        raise InputError(f"{name}: {top!r} has no Python source to read ({spec.origin or 'no origin'}).")
    base = locations[0].resolve().parent
    for i, part in enumerate(rest):
        found: Path | None = None
        for loc in locations:
            if (loc / part).is_dir():
                found = loc / part
                break
            if (loc / f"{part}.py").is_file():
                found = loc / f"{part}.py"
                break
        if found is None:
            raise InputError(f"{name}: {'.'.join([top, *rest[:i]])} has no submodule {part!r}.")
        if found.is_file():
            if i != len(rest) - 1:
                raise InputError(f"{name}: {found.name} is a module, not a package.")
            found = found.resolve()
            return Resolved(found, (found,), base)
        locations = [found]
    roots = [loc.resolve() for loc in locations]
    files = [f for root in roots for f in python_files(root)]
    return Resolved(roots[0], tuple(files), base)
