"""Resolution without import, bounded reading, suppressions, the result's shapes, parallel scans."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from difforge.errors import InputError
from difforge.scan import SCHEMA_VERSION, ScanResult, engine, render_markdown, scan, to_json

from .helpers import lines, rules

SRC = Path(__file__).resolve().parents[2] / "src"


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")


# ---- suppressions ------------------------------------------------------------------------------------
def test_suppression_comments(run) -> None:
    found = run('''
        def f(x, y, z):
            a = x.cuda()  # difforge: ignore[DF102]
            b = y.cuda()  # difforge: ignore[DF105, DF111]
            c = z.cuda().to("cuda")  # difforge: ignore
            return a, b, c
    ''')
    assert lines(found, "DF102") == [4]
    assert "DF111" not in rules(found)


# ---- what is read ----------------------------------------------------------------------------------------
def test_a_folder_is_read_recursively_skipping_hidden_caches_and_environments(tmp_path: Path) -> None:
    _write(tmp_path / "proj", {
        "a.py": "x = 1\n",
        "pkg/b.py": "def f(t):\n    return t.cuda()\n",
        ".hidden/c.py": "def f(t):\n    return t.cuda()\n",
        "__pycache__/d.py": "def f(t):\n    return t.cuda()\n",
        ".venv-x/e.py": "def f(t):\n    return t.cuda()\n",
        "env/lib/site-packages/f.py": "def f(t):\n    return t.cuda()\n",
        "notes.txt": "t.cuda()\n",
    })
    result = scan(tmp_path / "proj")
    assert result.files == ("proj/a.py", "proj/pkg/b.py")
    assert [(f.path, f.rule) for f in result.findings] == [("proj/pkg/b.py", "DF102")]
    direct = scan(tmp_path / "proj" / "env" / "lib" / "site-packages")
    assert direct.files == ("site-packages/f.py",)


def test_a_module_name_is_resolved_on_disk_without_importing_it(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tmp_path, {
        "fakescanpkg/__init__.py": "raise RuntimeError('imported!')\n",
        "fakescanpkg/models/__init__.py": "raise RuntimeError('imported!')\n",
        "fakescanpkg/models/attn.py": "import flash_attn\n",
        "fakescanpkg/pipe.py": "import torch\ng = torch.Generator('cuda')\n",
    })
    monkeypatch.syspath_prepend(str(tmp_path))
    whole = scan("fakescanpkg")
    assert set(whole.files) == {"fakescanpkg/__init__.py", "fakescanpkg/models/__init__.py",
                                "fakescanpkg/models/attn.py", "fakescanpkg/pipe.py"}
    sub = scan("fakescanpkg.models")
    assert [(f.path, f.rule) for f in sub.findings] == [("fakescanpkg/models/attn.py", "DF104")]
    one = scan("fakescanpkg.pipe")
    assert one.files == ("fakescanpkg/pipe.py",) and rules(list(one.findings)) == ["DF107"]
    assert not any(m == "fakescanpkg" or m.startswith("fakescanpkg.") for m in sys.modules)


@pytest.mark.parametrize("target, needle", [
    ("no_such_module_for_difforge_scan", "no module"),
    ("json.nothing_here", "has no submodule"),
    ("./no/such/file.py", "no such file"),
])
def test_unknown_targets_are_one_line_input_errors(target: str, needle: str) -> None:
    with pytest.raises(InputError, match=needle) as info:
        scan(target)
    assert "\n" not in str(info.value)


def test_unknown_device_target_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="unknown scan target"):
        scan(tmp_path, "tpu")


def test_unreadable_files_are_skipped_with_a_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "latin.py").write_bytes(b"x = '\xe9'\n")
    (tmp_path / "broken.py").write_text("def f(:\n", encoding="utf-8")
    (tmp_path / "big.py").write_text("x = 1\n" * 100, encoding="utf-8")
    (tmp_path / "fine.py").write_text("def f(t):\n    return t.cuda()\n", encoding="utf-8")
    monkeypatch.setattr(engine, "MAX_BYTES", 200)
    result = scan(tmp_path)
    reasons = {s.path.rsplit("/", 1)[-1]: s.reason for s in result.skipped}
    assert set(reasons) == {"latin.py", "broken.py", "big.py"}
    assert "UTF-8" in reasons["latin.py"] and "not valid Python" in reasons["broken.py"]
    assert "larger than" in reasons["big.py"]
    assert [f.rule for f in result.findings] == ["DF102"]
    assert len(result.files) == 1


def test_many_files_on_several_workers_match_one_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(12):
        (tmp_path / f"m{i:02d}.py").write_text(f"import torch\n\ndef f(t):\n    return t.cuda({i})\n",
                                               encoding="utf-8")
    monkeypatch.setattr(engine, "PARALLEL_MIN_FILES", 4)
    assert scan(tmp_path, jobs=2).findings == scan(tmp_path, jobs=1).findings


def test_scanning_imports_no_torch(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text("import torch\nx = torch.zeros(1).cuda()\n", encoding="utf-8")
    code = ("import sys; from difforge.scan import scan; r = scan(sys.argv[1]); "
            "print(len(r.findings), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True,
                         env={"PYTHONPATH": str(SRC)}, timeout=120, check=True)
    assert out.stdout.split() == ["1", "False"]


# ---- what comes out --------------------------------------------------------------------------------------
def test_json_shape(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text("def f(t):\n    return t.cuda()\n", encoding="utf-8")
    data = json.loads(to_json(scan(tmp_path / "m.py", "xpu")))
    assert data["schema_version"] == SCHEMA_VERSION
    assert data["target"] == "xpu" and data["root"] == str((tmp_path / "m.py").resolve())
    assert data["files"] == ["m.py"] and data["files_scanned"] == 1 and data["skipped"] == []
    assert data["counts"] == {"error": 0, "warning": 1, "info": 0}
    assert isinstance(data["elapsed_s"], float)
    (finding,) = data["findings"]
    assert set(finding) == {"path", "line", "col", "rule", "severity", "message", "fix", "snippet"}
    assert (finding["path"], finding["line"], finding["col"], finding["rule"]) == ("m.py", 2, 12, "DF102")
    assert finding["snippet"] == "return t.cuda()"


def test_markdown_is_a_short_table(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text("import flash_attn\n\ndef f(t):\n    return t.cuda()\n", encoding="utf-8")
    text = render_markdown(scan(tmp_path / "m.py"), limit=1)
    assert "| where | rule | severity | finding |" in text
    assert "`m.py:1` | DF104 | error" in text  # worst first
    assert "and 1 more" in text
    assert "No findings." in render_markdown(ScanResult("npu", str(tmp_path), (), ("m.py",)))
