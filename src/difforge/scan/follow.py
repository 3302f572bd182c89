"""Which other modules of the same package the scanned code imports: found statically, never imported.

A pipeline's own folder holds almost none of its porting hazards: ``diffusers.pipelines.qwenimage``
only *uses* ``QwenImageTransformer2DModel``, whose complex RoPE is the port's first error, and that
class lives in ``diffusers/models/transformers``.  A scan that stopped at the folder would give a
false all-clear, so the scan follows the imports of the files it read, **within the same top-level
package** (``diffusers`` here; ``torch`` and ``transformers`` are other projects), to the files that
define the imported names:

* ``from ...models import QwenImageTransformer2DModel`` is resolved relative to the file, then the
  name is looked up the way the package re-exports it: a submodule of that name, an import in the
  package's ``__init__.py`` that binds it (any branch, ``if TYPE_CHECKING:`` included - the branch
  that lazy packages keep for type checkers), or a lazy ``_import_structure`` table naming it;
* re-exporting ``__init__`` files are passed through, not scanned (they import everything);
* only :data:`FOLLOW_DEPTH` levels of imports are followed and at most :data:`MAX_FOLLOWED` files added,
  and what was left out is counted, so the result always says how far it looked.

Everything is read with :func:`read_source` (difforge's one reading rule) and parsed with
:mod:`ast`; nothing runs.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import DifforgeError, InputError
from ..runtime.reading import read_bytes

#: Levels of imports followed from the scanned files (1: what they import, not what that imports).
FOLLOW_DEPTH = 1
#: Files a scan adds by following imports, at most.
MAX_FOLLOWED = 200
#: Re-exports passed through to find where a name is defined (``models/__init__`` -> ``transformers/__init__``).
MAX_REEXPORT_HOPS = 8
#: Source files larger than this are not read (generated tables, vendored blobs): 2 MiB.
MAX_SOURCE_BYTES = 2 * 1024 * 1024


def read_source(path: str | Path, limit: int = MAX_SOURCE_BYTES) -> bytes:
    """The bytes of one source file under difforge's one reading rule (:func:`difforge.runtime.reading.read_bytes`).

    Why the shared rule: a ``.py`` that links to ``/dev/zero`` stats as 0 bytes and never ends, and
    opening a FIFO blocks until someone writes; the rule decides on the open descriptor (regular files
    only, opened without blocking) and stops reading at ``limit``.  Its one-line error says why a file
    was not read; the scan lists that file as skipped with that reason.
    """
    return read_bytes(path, limit=limit, what="the file", error=InputError)


@dataclass(frozen=True)
class Package:
    """The top-level package a scanned path belongs to: its name and the folder that holds it."""

    name: str
    parent: Path

    def module_of(self, path: Path) -> tuple[str, bool] | None:
        """``(dotted name, is a package)`` of a file under this package, or None."""
        try:
            rel = path.relative_to(self.parent)
        except ValueError:
            return None
        parts = list(rel.with_suffix("").parts)
        if not parts or parts[0] != self.name:
            return None
        if parts[-1] == "__init__":
            return ".".join(parts[:-1]), True
        return ".".join(parts), False

    def locate(self, dotted: str) -> Path | None:
        """The file of a module of this package (``a.b`` -> ``a/b.py`` or ``a/b/__init__.py``), or None."""
        parts = dotted.split(".")
        if parts[0] != self.name:
            return None
        base = self.parent.joinpath(*parts)
        for candidate in (base / "__init__.py", base.with_name(base.name + ".py")):
            if candidate.is_file():
                return candidate
        return None


def package_of(path: Path) -> Package | None:
    """The outermost package holding ``path`` (folders with ``__init__.py`` upwards), or None."""
    folder = path if path.is_dir() else path.parent
    if not (folder / "__init__.py").is_file():
        return None
    while (folder.parent / "__init__.py").is_file() and folder.parent != folder:
        folder = folder.parent
    return Package(folder.name, folder.parent)


@dataclass(frozen=True)
class Followed:
    """The files added by following imports, how deep, and what was left out (and why)."""

    package: str | None
    files: tuple[Path, ...] = ()
    depth: int = 0
    not_followed: int = 0
    note: str = ""


def _parse(path: Path, cache: dict[Path, ast.Module | None]) -> ast.Module | None:
    if path not in cache:
        try:
            cache[path] = ast.parse(read_source(path).decode("utf-8-sig"), filename=str(path))
        except (DifforgeError, UnicodeDecodeError, SyntaxError, ValueError, RecursionError, MemoryError):
            cache[path] = None
    return cache[path]


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str | None:
    """The absolute module a ``from ... import`` names, resolved against the importing module."""
    if not node.level:
        return node.module
    parts = module.split(".") if is_package else module.split(".")[:-1]
    if node.level - 1 > len(parts) - 1:
        return None
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


def _imports(tree: ast.Module, module: str, is_package: bool) -> Iterator[tuple[str, str | None]]:
    """``(absolute module, imported name or None)`` for every import statement, in any branch."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None
        elif isinstance(node, ast.ImportFrom):
            target = _absolute(module, is_package, node)
            if target:
                for alias in node.names:
                    yield target, (None if alias.name == "*" else alias.name)


def _lazy_table(tree: ast.Module, name: str) -> str | None:
    """The submodule a lazy package's ``_import_structure`` table files ``name`` under, or None."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
            if (isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name)
                    and target.value.id == "_import_structure" and isinstance(target.slice, ast.Constant)
                    and isinstance(target.slice.value, str) and isinstance(value, ast.List | ast.Tuple)
                    and any(isinstance(e, ast.Constant) and e.value == name for e in value.elts)):
                return target.slice.value
    return None


def _defines(tree: ast.Module, name: str) -> bool:
    """Whether the module body itself defines ``name`` (def, class or assignment at top level)."""
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name == name:
            return True
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return True
    return False


def where_defined(pkg: Package, module: str, name: str | None, cache: dict[Path, ast.Module | None],
                  hops: int = 0) -> Path | None:
    """The file that defines ``module.name`` (``name`` None: the module itself), through re-exports."""
    path = pkg.locate(module)
    if path is None or hops > MAX_REEXPORT_HOPS:
        return None
    if name is None:
        return path
    sub = pkg.locate(f"{module}.{name}") if path.name == "__init__.py" else None
    if sub is not None:
        return sub
    tree = _parse(path, cache)
    if tree is None or _defines(tree, name) or path.name != "__init__.py":
        return path
    for target, imported in _imports(tree, module, True):
        if imported == name and target.split(".")[0] == pkg.name:
            found = where_defined(pkg, target, name, cache, hops + 1)
            if found is not None:
                return found
    lazy = _lazy_table(tree, name)
    if lazy is not None:
        return pkg.locate(f"{module}.{lazy}")
    return path


def follow(files: Iterable[Path], pkg: Package | None, depth: int = FOLLOW_DEPTH,
           limit: int = MAX_FOLLOWED) -> Followed:
    """The files of ``pkg`` that ``files`` import (to ``depth`` levels, at most ``limit`` files)."""
    if pkg is None:
        return Followed(None, note="not inside a package: imports were not followed")
    seen = {p.resolve() for p in files}
    cache: dict[Path, ast.Module | None] = {}
    frontier = sorted(seen)
    added: list[Path] = []
    capped: set[Path] = set()  # wanted within the depth, left out by the file cap
    deeper: set[Path] = set()  # imported one level beyond the depth
    for level in range(depth + 1):
        wanted: set[Path] = set()
        for path in frontier:
            owner = pkg.module_of(path)
            tree = _parse(path, cache) if owner else None
            if tree is None or owner is None:
                continue
            for target, name in _imports(tree, *owner):
                if target.split(".")[0] != pkg.name:
                    continue
                found = where_defined(pkg, target, name, cache)
                if found is None:
                    continue
                found = found.resolve()
                if found not in seen and not (found.name == "__init__.py" and name is not None
                                              and not _defines(_parse(found, cache) or ast.Module([], []), name)):
                    wanted.add(found)
        if level == depth:
            deeper = wanted - capped
            break
        room = max(limit - len(added), 0)
        ordered = sorted(wanted)
        take = ordered[:room]
        capped |= set(ordered[room:])
        added.extend(take)
        seen.update(take)
        frontier = take
        if not take:
            break
    not_followed = capped | deeper
    note = (f"imports within {pkg.name} followed {depth} level{'s' * (depth != 1)}: {len(added)} file"
            f"{'s' * (len(added) != 1)} added")
    if capped:
        note += f", {len(capped)} more left out by the {limit}-file cap"
    if deeper:
        note += f", {len(deeper)} more imported deeper not followed"
    return Followed(pkg.name, tuple(added), depth, len(not_followed), note)


__all__ = ["FOLLOW_DEPTH", "MAX_FOLLOWED", "Followed", "Package", "follow", "package_of",
           "read_source", "where_defined"]
