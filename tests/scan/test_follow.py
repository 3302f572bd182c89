"""A scan of a pipeline follows what it imports from its own package (issue 28.5), statically and bounded."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path

import pytest

from difforge.scan import scan, summary_line
from difforge.scan.follow import MAX_REEXPORT_HOPS


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, code in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(code), encoding="utf-8")


#: A diffusers-shaped package: the pipeline folder is clean, the model it imports through two
#: re-exporting ``__init__`` files (one behind TYPE_CHECKING) has a complex RoPE, and that model's own
#: import (one level deeper) has a hard-coded CUDA generator.
PACKAGE = {
    "pkg/__init__.py": "",
    "pkg/pipelines/__init__.py": "",
    "pkg/pipelines/flow/__init__.py": "from .pipe import Pipe\n",
    "pkg/pipelines/flow/pipe.py": """
        import torch
        from ...models import Net
        from ...lazy import Lazy

        class Pipe:
            def __call__(self, x):
                return Net()(x) + Lazy()(x)
        """,
    "pkg/models/__init__.py": """
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            from .transformers import Net
        """,
    "pkg/models/transformers/__init__.py": "from .net import Net\n",
    "pkg/models/transformers/net.py": """
        import torch
        from ..deep import helper

        class Net:
            def __call__(self, x):
                return torch.view_as_real(torch.view_as_complex(x))
        """,
    "pkg/models/deep.py": """
        import torch

        def helper():
            return torch.Generator("cuda")
        """,
    "pkg/lazy/__init__.py": """
        _import_structure = {}
        _import_structure["impl"] = ["Lazy"]
        """,
    "pkg/lazy/impl.py": """
        class Lazy:
            def __call__(self, x):
                return x.cuda()
        """,
}


def test_a_pipeline_scan_reaches_the_model_it_imports_through_reexports(tmp_path: Path) -> None:
    _write(tmp_path, PACKAGE)
    result = scan(tmp_path / "pkg/pipelines/flow", "npu", jobs=1)
    by_file = {(f.path, f.rule) for f in result.findings}
    assert ("pkg/models/transformers/net.py", "DF106") in by_file  # through TYPE_CHECKING re-exports
    assert ("pkg/lazy/impl.py", "DF102") in by_file  # through a lazy _import_structure table
    assert set(result.followed) == {"pkg/models/transformers/net.py", "pkg/lazy/impl.py"}
    # The re-exporting __init__ files are passed through, not scanned; the deeper import is counted, not read.
    assert not any(f.endswith("__init__.py") and "models" in f for f in result.files)
    assert not any(f.path == "pkg/models/deep.py" for f in result.findings)
    assert "followed 1 level: 2 files added, 1 more imported deeper not followed" in summary_line(result)
    data = result.to_dict()["followed_imports"]
    assert sorted(data["files"]) == sorted(result.followed) and "1 more" in data["note"]


def test_follow_depth_two_reads_the_deeper_import_and_depth_zero_says_it_did_not(tmp_path: Path) -> None:
    _write(tmp_path, PACKAGE)
    deeper = scan(tmp_path / "pkg/pipelines/flow", "npu", jobs=1, follow_depth=2)
    assert ("pkg/models/deep.py", "DF107") in {(f.path, f.rule) for f in deeper.findings}
    none = scan(tmp_path / "pkg/pipelines/flow", "npu", jobs=1, follow_depth=0)
    assert none.findings == () and none.followed == ()
    assert "imports were not followed" in summary_line(none)


def test_the_whole_package_and_a_lone_file_say_how_far_they_looked(tmp_path: Path) -> None:
    _write(tmp_path, PACKAGE)
    whole = scan(tmp_path / "pkg", "npu", jobs=1)
    assert whole.followed == () and "the whole package pkg was scanned" in summary_line(whole)
    lone = tmp_path / "lone.py"
    lone.write_text("from pkg.models import Net\n", encoding="utf-8")
    assert "not inside a package: imports were not followed" in summary_line(scan(lone, "npu", jobs=1))


def test_a_reexport_cycle_ends(tmp_path: Path) -> None:
    """Two ``__init__`` files re-exporting a name from each other: bounded by the hop limit, no recursion error."""
    _write(tmp_path, {
        "cyc/__init__.py": "",
        "cyc/a/__init__.py": "from ..b import Thing\n",
        "cyc/b/__init__.py": "from ..a import Thing\n",
        "cyc/user/__init__.py": "",
        "cyc/user/use.py": "from ..a import Thing\n",
    })
    assert MAX_REEXPORT_HOPS < 50
    result = scan(tmp_path / "cyc/user", "npu", jobs=1)
    assert result.followed == () and not result.skipped


@pytest.mark.skipif(importlib.util.find_spec("diffusers") is None, reason="diffusers is not installed")
def test_the_documented_qwenimage_example_finds_the_transformers_complex_rope() -> None:
    """``scan diffusers.pipelines.qwenimage`` gave 0 findings while the transformer it uses has 4 errors."""
    result = scan("diffusers.pipelines.qwenimage", "npu")
    rope = sorted(f.line for f in result.findings
                  if f.path == "diffusers/models/transformers/transformer_qwenimage.py" and f.rule == "DF106")
    direct = scan("diffusers.models.transformers.transformer_qwenimage", "npu", follow_depth=0)
    assert len(rope) == 4 and rope == sorted(f.line for f in direct.findings if f.rule == "DF106")
    assert "diffusers/models/transformers/transformer_qwenimage.py" in result.followed


def test_the_file_cap_is_said_apart_from_the_depth(tmp_path: Path) -> None:
    _write(tmp_path, PACKAGE)
    result = scan(tmp_path / "pkg/pipelines/flow", "npu", jobs=1, follow_depth=2)
    from difforge.scan import follow as follow_module

    capped = follow_module.follow([tmp_path / "pkg/pipelines/flow/pipe.py"],
                                  follow_module.package_of(tmp_path / "pkg/pipelines/flow"), depth=1, limit=1)
    # lazy/impl.py is taken (path order), net.py is cut by the cap: said as the cap, not as depth
    assert [p.name for p in capped.files] == ["impl.py"] and capped.not_followed == 1
    assert capped.note.endswith("1 file added, 1 more left out by the 1-file cap")
    assert "cap" not in result.follow_note
