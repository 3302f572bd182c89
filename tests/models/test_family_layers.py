"""Inside a family package the imports run one way: building blocks -> memory -> loader -> pipeline -> probe.

The graph is the one tests/test_architecture.py reads (every import statement, lazy and TYPE_CHECKING
ones included); the box-level direction and the cycle check live there, this adds the order inside
each family that docs/architecture.md describes.
"""

from __future__ import annotations

import pytest

from tests.test_architecture import SRC, import_graph

#: The family's layers, lowest first; every other module of a family is a building block that imports
#: none of these.
LAYERS = {"memory": 1, "loader": 2, "pipeline": 3, "probe": 4}
FAMILIES = ("difforge.models.ursa", "difforge.models.qwen_edit")


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(SRC, "difforge")


def allowed(package: str, module: str, target: str) -> bool:
    short = module.removeprefix(package).lstrip(".") or "__init__"
    other = target.removeprefix(package + ".")
    if short == "__init__":  # the package exports the pipeline, never the probe
        return other != "probe"
    if short in LAYERS:
        return LAYERS.get(other, 0) <= LAYERS[short]
    return other not in LAYERS


@pytest.mark.parametrize("package", FAMILIES)
def test_layers_inside_the_family(graph: dict[str, set[str]], package: str) -> None:
    family = [m for m in graph if m == package or m.startswith(package + ".")]
    assert {f"{package}.{name}" for name in LAYERS} <= set(family)
    assert f"{package}.pipeline" in graph[f"{package}.probe"]  # the walk sees the edges it judges
    bad = [f"{m} imports {t}" for m in sorted(family) for t in sorted(graph[m])
           if t.startswith(package + ".") and not allowed(package, m, t)]
    assert bad == []


def test_the_rule_catches_an_upward_import() -> None:
    pkg = "difforge.models.ursa"
    assert not allowed(pkg, f"{pkg}.memory", f"{pkg}.pipeline")
    assert not allowed(pkg, f"{pkg}.transformer", f"{pkg}.loader")
    assert not allowed(pkg, pkg, f"{pkg}.probe")
    assert allowed(pkg, f"{pkg}.probe", f"{pkg}.pipeline") and allowed(pkg, f"{pkg}.loader", f"{pkg}.vae")
