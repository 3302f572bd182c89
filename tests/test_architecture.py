"""docs/architecture.md is the map, and the imports of src/difforge must follow it.

Every import statement is read with ``ast`` (top level, inside functions, under ``if TYPE_CHECKING``),
and so is every ``importlib.import_module("difforge....")`` / ``__import__("difforge....")`` call with a
constant name: a lazy import that runs against the flow is still a dependency running against the flow.

``benchmarks/`` and ``scripts/`` are the top layer: they may import difforge, but only through its public
seams (:func:`seam_violations`; the rule is docs/architecture.md's "Benchmarks and scripts").
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


#: The calls that import a module named by a string: ``importlib.import_module(name)`` and ``__import__(name)``.
DYNAMIC_IMPORTS = {"import_module", "__import__"}


def dynamic_import(node: ast.AST) -> str | None:
    """The constant module name of an ``importlib.import_module("...")`` / ``import_module("...")`` /
    ``__import__("...")`` call, else None (a computed name cannot be placed, so it is not read)."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    first = node.args[0]
    if called in DYNAMIC_IMPORTS and isinstance(first, ast.Constant) and isinstance(first.value, str):
        return first.value
    return None


def imports_of(name: str, path: Path, modules: dict[str, Path], package: str) -> set[str]:
    """The package's modules that ``name`` imports (``from pkg import mod`` resolves to the module)."""
    is_pkg = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif (dynamic := dynamic_import(node)) is not None:
            targets = [dynamic]
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


# ---- benchmarks/ and scripts/: the top layer, through public seams only ------------------------------
#: The folders of the top layer: they import difforge, nothing of difforge imports them.
TOP_LAYER = ("benchmarks", "scripts")
#: The model families: reached through the package's ``__all__``, or its probe module (the validation seam the
#: registry hands out, kept out of ``__init__`` so the probe stays lazy); their other modules are internals.
FAMILIES = ("difforge.models.ursa", "difforge.models.qwen_edit")
FAMILY_SEAM_MODULES = ("probe",)
#: Calls that rebind an attribute of their first argument.
REBINDING_CALLS = {"setattr", "delattr"}


def is_private(name: str) -> bool:
    """``_name`` (a dunder such as ``__version__`` is public)."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def module_file(src: Path, module: str) -> Path | None:
    """The file of dotted ``module`` under ``src`` (a module or a package's ``__init__.py``), or None."""
    base = src.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def declared_all(path: Path | None) -> set[str] | None:
    """The names of a module's top-level ``__all__`` (the surface it declares), or None where it declares none."""
    if path is None:
        return None
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets) and node.value is not None:
            value = node.value
            if isinstance(value, (ast.List, ast.Tuple)):
                return {e.value for e in value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return None


def root_name(node: ast.AST) -> str | None:
    """The name an attribute chain starts from (``a`` of ``a.b.c``), else None."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _module_problems(module: str, names: list[str], src: Path, families: tuple[str, ...]) -> list[str]:
    """Why importing ``names`` from ``module`` (or ``module`` itself when ``names`` is empty) is not a public seam."""
    problems = [f"imports the private {part}" for part in [*module.split("."), *names] if is_private(part)]
    for family in families:
        if module.startswith(family + "."):
            inner = module[len(family) + 1:].split(".")[0]
            if inner not in FAMILY_SEAM_MODULES:
                problems.append(f"reaches into {module}: import the family through {family} (its __all__)")
    surface = declared_all(module_file(src, module))
    if surface is not None:  # a submodule that declares its own surface is a seam of its own
        problems += [f"imports {name} from {module}, which does not export it (__all__)"
                     for name in names if name not in surface and not is_private(name)
                     and declared_all(module_file(src, f"{module}.{name}")) is None]
    return problems


def seam_violations(files: list[Path], src: Path, package: str, families: tuple[str, ...] = FAMILIES) -> list[str]:
    """Every place in ``files`` (the top layer) that uses ``package`` other than through its public seams.

    A public seam is: an import of a module or name that is not private (no ``_name`` anywhere in it); from a
    module that declares ``__all__``, only names it lists; a family (``families``) only through its package
    or its probe module.  And the top layer never changes ``package``: no assignment, augmented assignment
    or ``del`` onto an attribute of a name bound from it, no ``setattr``/``delattr`` on one, no read of a
    ``_private`` attribute of one.  ``importlib.import_module("...")`` / ``__import__("...")`` calls with a
    constant name count as imports.
    """
    bad: list[tuple[str, int, str]] = []

    def ours(module: str) -> bool:
        return module == package or module.startswith(package + ".")

    for path in files:
        where = path.relative_to(path.parents[1]).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        bound: set[str] = set()  # names bound to objects of the package (modules, classes, functions)
        for node in ast.walk(tree):
            found: list[str] = []
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if ours(alias.name):
                        found += _module_problems(alias.name, [], src, families)
                        bound.add(alias.asname or alias.name.split(".")[0])
            elif isinstance(node, ast.ImportFrom) and not node.level and ours(node.module or ""):
                names = [a.name for a in node.names]
                found += _module_problems(node.module or "", names, src, families)
                bound.update(a.asname or a.name for a in node.names)
            elif (dynamic := dynamic_import(node)) is not None and ours(dynamic):
                found += _module_problems(dynamic, [], src, families)
            bad += [(where, node.lineno, problem) for problem in found]
        for node in ast.walk(tree):
            targets: list[ast.AST] = []
            if isinstance(node, (ast.Assign, ast.Delete)):
                targets = list(node.targets)
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            for target in targets:
                if isinstance(target, ast.Attribute) and root_name(target) in bound:
                    bad.append((where, node.lineno, f"rebinds {ast.unparse(target)} (an attribute of {package})"))
            if isinstance(node, ast.Call) and node.args:
                func = node.func
                called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
                if called in REBINDING_CALLS and root_name(node.args[0]) in bound:
                    bad.append((where, node.lineno, f"{called} on {ast.unparse(node.args[0])} (of {package})"))
            if isinstance(node, ast.Attribute) and is_private(node.attr) and root_name(node) in bound:
                bad.append((where, node.lineno, f"reads the private {ast.unparse(node)}"))
    return [f"{where}:{line}: {problem}" for where, line, problem in sorted(bad)]


def top_layer_files(root: Path) -> list[Path]:
    return sorted(p for folder in TOP_LAYER for p in (root / folder).glob("*.py"))


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


def test_benchmarks_and_scripts_use_public_seams_only() -> None:
    files = top_layer_files(ROOT)
    assert {p.parent.name for p in files} == set(TOP_LAYER) and len(files) >= 10
    assert seam_violations(files, SRC, "difforge") == []


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


def test_a_dynamic_import_of_a_later_layer_is_found(tmp_path: Path) -> None:
    _write(tmp_path, {
        "toy/__init__.py": "",
        "toy/high.py": "X = 1\n",
        "toy/low.py": "import importlib\ndef f():\n    return importlib.import_module('toy.high')\n",
        "toy/side.py": "def g():\n    return __import__('toy.high')\n",
        "toy/computed.py": "import importlib\ndef h(n):\n    return importlib.import_module('toy.' + n)\n",
    })
    table = [(0, "toy.low"), (0, "toy.side"), (0, "toy.computed"), (1, "toy.high"), (2, "toy")]
    assert violations(import_graph(tmp_path, "toy"), table, "toy") == [
        "toy.low (layer 0) imports toy.high: a later layer (toy.high, layer 1)",
        "toy.side (layer 0) imports toy.high: a later layer (toy.high, layer 1)",
    ]


@pytest.fixture
def seams(tmp_path: Path) -> Path:
    """A toy package with a declared surface, a family, and a top-layer folder that uses it."""
    _write(tmp_path, {
        "src/toy/__init__.py": "__all__ = ['api']\n",
        "src/toy/api.py": "__all__ = ['run']\ndef run(): ...\ndef helper(): ...\n",
        "src/toy/util.py": "def public(): ...\ndef _hidden(): ...\n",
        "src/toy/fam/__init__.py": "from .inner import Pipe\n__all__ = ['Pipe']\n",
        "src/toy/fam/inner.py": "class Pipe:\n    def guide(self): ...\n",
        "src/toy/fam/probe.py": "def flops(): ...\n",
        "bench/good.py": ("import toy\nfrom toy import api\nfrom toy.api import run\nfrom toy.util import public\nfrom toy.fam import Pipe\n"
                          "from toy.fam.probe import flops\npipe = Pipe()\npipe.sampler = 'x'\n"),
        "bench/bad.py": ("import importlib\nfrom toy.api import helper\nfrom toy.util import _hidden\n"
                         "from toy.fam import inner\nfrom toy.fam.inner import Pipe\nimport toy.util as u\n"
                         "Pipe.guide = None\nsetattr(u, 'public', None)\nu.count += 1\ndel u.public\nu._cache\n"
                         "importlib.import_module('toy.fam.inner')\nfrom toy import util\n"),
    })
    return tmp_path


def test_the_top_layer_rule_finds_each_planted_violation(seams: Path) -> None:
    bench = seams / "bench"
    assert seam_violations([bench / "good.py"], seams / "src", "toy", ("toy.fam",)) == []
    assert seam_violations([bench / "bad.py"], seams / "src", "toy", ("toy.fam",)) == [
        "bench/bad.py:2: imports helper from toy.api, which does not export it (__all__)",
        "bench/bad.py:3: imports the private _hidden",
        "bench/bad.py:4: imports inner from toy.fam, which does not export it (__all__)",
        "bench/bad.py:5: reaches into toy.fam.inner: import the family through toy.fam (its __all__)",
        "bench/bad.py:7: rebinds Pipe.guide (an attribute of toy)",
        "bench/bad.py:8: setattr on u (of toy)",
        "bench/bad.py:9: rebinds u.count (an attribute of toy)",
        "bench/bad.py:10: rebinds u.public (an attribute of toy)",
        "bench/bad.py:11: reads the private u._cache",
        "bench/bad.py:12: reaches into toy.fam.inner: import the family through toy.fam (its __all__)",
        "bench/bad.py:13: imports util from toy, which does not export it (__all__)",
    ]
