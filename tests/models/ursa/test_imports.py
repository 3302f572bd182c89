"""The URSA package imports one way: building blocks -> memory -> loader -> pipeline -> probe.

Every import counts - module level, inside a function, under ``if TYPE_CHECKING:`` - because each is a
dependency a reader has to follow, and a lazy import that closes a cycle only hides it.  The graph
is read from the source with :mod:`ast`; nothing is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[3] / "src"
PACKAGE = "difforge.models.ursa"
#: Modules above the family (or beside it): it must never reach them.
FORBIDDEN = ("difforge.api", "difforge.engine", "difforge.validate", "difforge.report", "difforge.cli",
             "difforge.models.registry", "difforge.models.tiny", "difforge.models.qwen_edit")
#: The family's layers, lowest first: a module may import only its own or lower layers.  Every other
#: module of the family (config, rope, sampling, scheduler, tokenizer, transformer, vae, vae_fsq, pth,
#: tiny) is a building block and imports none of these.
LAYERS = {"memory": 1, "loader": 2, "pipeline": 3, "probe": 4}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Every difforge module ``path`` imports, wherever the import statement sits."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                stem = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
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
    modules = {_module_name(p): p for p in (SRC / "difforge").rglob("*.py")}
    return {name: _imports(name, path, set(modules)) for name, path in modules.items()}


def _family(graph: dict[str, set[str]]) -> list[str]:
    return sorted(m for m in graph if m == PACKAGE or m.startswith(PACKAGE + "."))


def test_the_graph_sees_lazy_and_type_checking_imports(graph: dict[str, set[str]]) -> None:
    """The walk is not blind: memory's TYPE_CHECKING imports and the loader's module imports are found."""
    assert f"{PACKAGE}.transformer" in graph[f"{PACKAGE}.memory"]  # under ``if TYPE_CHECKING:``
    assert f"{PACKAGE}.memory" in graph[f"{PACKAGE}.loader"]
    assert f"{PACKAGE}.pipeline" in graph[f"{PACKAGE}.probe"]


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
    """Blocks import blocks; memory, loader, pipeline, probe only their own layer or below; no one the probe."""
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
