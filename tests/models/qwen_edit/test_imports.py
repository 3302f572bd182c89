"""The Qwen-Image-Edit package imports one way: leaf modules -> memory -> loader -> pipeline -> probe.

Every import counts - module level, inside a function, under ``if TYPE_CHECKING:`` - because each is a
dependency a reader has to follow, and a lazy import that closes a cycle only hides it.  The graph
is read from the source with :mod:`ast`; nothing is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[3] / "src"
PACKAGE = "difforge.models.qwen_edit"
#: Modules above the family: it must never reach up to them.
FORBIDDEN = ("difforge.api", "difforge.engine", "difforge.validate", "difforge.report", "difforge.cli",
             "difforge.models.registry", "difforge.models.tiny", "difforge.models.ursa")
#: The family's layers, lowest first: a module may import only its own or lower layers.
LAYERS = {"memory": 1, "loader": 2, "pipeline": 3, "probe": 4}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in (SRC / "difforge").rglob("*.py")}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Every difforge module ``path`` imports, wherever the import statement sits."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            # ``from pkg import mod`` imports the module pkg.mod; ``from mod import name`` imports mod.
            targets = [stem] + [f"{stem}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(name, path, known) for name, path in modules.items()}


def _family(graph: dict[str, set[str]]) -> list[str]:
    return sorted(m for m in graph if m == PACKAGE or m.startswith(PACKAGE + "."))


def test_no_import_cycle_through_the_family(graph: dict[str, set[str]]) -> None:
    """Depth-first search from every family module over the whole difforge graph."""
    for start in _family(graph):
        stack: list[tuple[str, list[str]]] = [(start, [start])]
        seen: set[str] = set()
        while stack:
            node, path = stack.pop()
            for nxt in graph[node]:
                if nxt == start:
                    raise AssertionError("import cycle: " + " -> ".join([*path, start]))
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*path, nxt]))


def test_the_family_never_imports_the_layers_above_it(graph: dict[str, set[str]]) -> None:
    for module in _family(graph):
        bad = sorted(t for t in graph[module] if any(t == f or t.startswith(f + ".") for f in FORBIDDEN))
        assert not bad, f"{module} imports {bad}"


def test_layers_inside_the_family(graph: dict[str, set[str]]) -> None:
    """Leaves import leaves; memory, loader, pipeline, probe only their own layer or below; no one the probe."""
    for module in _family(graph):
        short = module.removeprefix(PACKAGE).lstrip(".") or "__init__"
        for target in sorted(t for t in graph[module] if t.startswith(PACKAGE + ".")):
            other = target.removeprefix(PACKAGE + ".")
            if short == "__init__":  # the package exports the pipeline, never the probe
                allowed = other != "probe"
            elif short in LAYERS:
                allowed = LAYERS.get(other, 0) <= LAYERS[short]
            else:
                allowed = other not in LAYERS
            assert allowed, f"{module} imports {target}, a layer above it"
