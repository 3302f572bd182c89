"""docs/architecture.md is the map, and the imports of src/difforge must follow it.

Every import statement is read with ``ast`` (top level, inside functions, under ``if TYPE_CHECKING``):
a lazy import that runs against the flow is still a dependency running against the flow.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
DOC = ROOT / "docs" / "architecture.md"


def module_files(src: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under ``src/package``."""
    out: dict[str, Path] = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imports_of(name: str, path: Path, modules: dict[str, Path], package: str) -> set[str]:
    """The package's modules that ``name`` imports (``from pkg import mod`` resolves to the module)."""
    is_pkg = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            targets = [f"{stem}.{a.name}" if f"{stem}.{a.name}" in modules else stem for a in node.names]
        for target in targets:
            if target != package and not target.startswith(package + "."):
                continue
            while target not in modules and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in modules and target != name:
                found.add(target)
    return found


def import_graph(src: Path, package: str) -> dict[str, set[str]]:
    modules = module_files(src, package)
    return {name: imports_of(name, path, modules, package) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    comp.append(top)
                    if top == node:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def layer_table(doc: Path) -> list[tuple[int, str]]:
    """(layer, module-or-package) rows of the doc's layer table."""
    rows = re.findall(r"^\|\s*(\d+)\s*\|\s*`([\w.]+)`\s*\|", doc.read_text(encoding="utf-8"), flags=re.M)
    return [(int(layer), name) for layer, name in rows]


def place(module: str, table: list[tuple[int, str]], root: str) -> tuple[int, str] | None:
    """The most specific row naming ``module`` (the root package only matches itself)."""
    best: tuple[int, str] | None = None
    for layer, name in table:
        hit = module == name or (name != root and module.startswith(name + "."))
        if hit and (best is None or len(name) > len(best[1])):
            best = (layer, name)
    return best


def violations(graph: dict[str, set[str]], table: list[tuple[int, str]], root: str) -> list[str]:
    bad: list[str] = []
    for module in sorted(graph):
        here = place(module, table, root)
        if here is None:
            bad.append(f"{module} is not on the map (docs/architecture.md layer table)")
            continue
        for target in sorted(graph[module]):
            there = place(target, table, root)
            if there is None:
                continue  # reported as unplaced on its own line
            if there[1] == here[1] or there[0] < here[0]:
                continue
            kind = "a sibling" if there[0] == here[0] else "a later layer"
            bad.append(f"{module} (layer {here[0]}) imports {target}: {kind} ({there[1]}, layer {there[0]})")
    return bad


# ---- the project ----------------------------------------------------------------------------------
def test_the_layer_table_is_there_and_ordered() -> None:
    table = layer_table(DOC)
    assert len(table) >= 15
    names = [name for _, name in table]
    assert len(names) == len(set(names)), "a module is placed twice"
    layers = [layer for layer, _ in table]
    assert layers == sorted(layers), "the table lists layers out of order"


def test_src_difforge_has_no_import_cycle() -> None:
    assert cycles(import_graph(SRC, "difforge")) == []


def test_every_import_follows_the_documented_direction() -> None:
    assert violations(import_graph(SRC, "difforge"), layer_table(DOC), "difforge") == []


def test_the_rules_named_in_the_map_exist() -> None:
    """The "one place" table names real objects (a renamed method must update the map)."""
    from difforge.config import RunConfig, check_steps
    from difforge.devices import Backend
    from difforge.models.registry import pipeline_class, probe_class
    from difforge.runtime.images import load_images, test_picture

    for method in ("generator", "compile_policy", "fused_kernel", "diffusers_attention", "env_presets",
                   "apply_env_presets", "resolve_dtype"):
        assert callable(getattr(Backend, method)), method
    assert isinstance(Backend.pinned_host_copies, bool)
    from difforge.devices import RANDOM_STREAMS
    from difforge.models.ursa.call import random_stream

    assert Backend.random_stream in RANDOM_STREAMS and callable(random_stream)
    assert all(callable(f) for f in (RunConfig.validate, check_steps, pipeline_class, probe_class, load_images,
                                       test_picture))


# ---- the checker itself can fail ----------------------------------------------------------------------
def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


@pytest.fixture
def toy(tmp_path: Path) -> Path:
    _write(tmp_path, {
        "toy/__init__.py": "",
        "toy/low.py": "X = 1\n",
        "toy/high.py": "from .low import X\n",
        "toy/fam/__init__.py": "",
        "toy/fam/a.py": "from . import b\n",
        "toy/fam/b.py": "def f():\n    from .a import g\n",  # a lazy import closes the cycle
        "toy/other.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .high import X\n",
    })
    return tmp_path


def test_a_lazy_import_cycle_is_found(toy: Path) -> None:
    assert cycles(import_graph(toy, "toy")) == [["toy.fam.a", "toy.fam.b"]]


def test_imports_against_the_table_are_found(toy: Path) -> None:
    table = [(0, "toy.low"), (1, "toy.high"), (1, "toy.other"), (2, "toy.fam"), (3, "toy")]
    graph = import_graph(toy, "toy")
    assert violations(graph, table, "toy") == [
        "toy.other (layer 1) imports toy.high: a sibling (toy.high, layer 1)",
    ]
    backwards = [(0, "toy.high"), (1, "toy.low"), (1, "toy.other"), (2, "toy.fam"), (3, "toy")]
    assert "toy.high (layer 0) imports toy.low: a later layer (toy.low, layer 1)" in violations(graph, backwards, "toy")
    assert "toy.fam.a is not on the map (docs/architecture.md layer table)" in violations(graph, table[:-2], "toy")
