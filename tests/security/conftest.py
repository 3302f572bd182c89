"""The security tests' shared golden bundle: one ``difforge golden`` run serves every module that reads it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from difforge.cli import app
from tests.security.test_bundle_identity import SIZE


@pytest.fixture(scope="session")
def golden(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A tiny-ursa golden bundle and the digest ``difforge golden`` printed for it (tests copy it before any
    change: it is shared by test_bundle_identity.py and test_bundle_malformed.py)."""
    out = tmp_path_factory.mktemp("identity") / "G"
    result = CliRunner().invoke(app, ["golden", "--model", "tiny-ursa", "--dtype", "bfloat16", *SIZE, "--quiet",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    printed = re.search(r"^digest: ([0-9a-f]{64}) ", result.stdout, re.M)
    assert printed, result.stdout
    return out, printed.group(1)
