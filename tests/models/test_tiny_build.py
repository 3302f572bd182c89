"""Building a built-in tiny model: a build that left a component empty is never published."""

from __future__ import annotations

from pathlib import Path

import pytest

from difforge.errors import OutputError
from difforge.models import tiny


def test_a_build_with_an_empty_component_is_not_published(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a save on a torch.distributed rank other than 0 leaves (transformers writes on rank 0 only): the
    text encoder's folder made, nothing in it.  ensure_tiny refuses it in one line and publishes nothing, so
    no later run loads a broken built-in model; the next build (a good one) is published."""
    monkeypatch.setenv("DIFFORGE_HOME", str(tmp_path / "home"))

    def half_written(folder: Path) -> None:
        (folder / "model_index.json").write_text("{}")
        (folder / "text_encoder").mkdir()
        (folder / "vae").mkdir()
        (folder / "vae" / "config.json").write_text("{}")

    monkeypatch.setattr(tiny, "_builder", lambda name: half_written)
    with pytest.raises(OutputError, match=r"empty text_encoder/ folder"):
        tiny.ensure_tiny("tiny-qwen-edit")
    models = tmp_path / "home" / "models"
    assert sorted(p.name for p in models.iterdir()) == []  # neither the folder nor a temporary one

    def whole(folder: Path) -> None:
        half_written(folder)
        (folder / "text_encoder" / "config.json").write_text("{}")

    monkeypatch.setattr(tiny, "_builder", lambda name: whole)
    assert (tiny.ensure_tiny("tiny-qwen-edit") / "text_encoder" / "config.json").is_file()


def test_parallel_runs_build_builtin_models_before_the_group_opens(monkeypatch: pytest.MonkeyPatch) -> None:
    """guarded() runs the build hook before init_process_group (inside the group a rank 1 would build an empty
    text encoder); api passes the model's build as that hook."""
    from difforge.runtime import parallel

    order: list[str] = []
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")

    def start(*args: object, **kwargs: object) -> object:
        order.append("group")
        raise parallel.RankFailed("stop here")

    monkeypatch.setattr(parallel, "_start", start)
    with pytest.raises(parallel.RankFailed):
        parallel.guarded("data", "generate", "cpu", lambda group: None, before=lambda: order.append("build"))
    assert order == ["build", "group"]

    from difforge import api

    built: list[str] = []
    monkeypatch.setattr(tiny, "ensure_tiny", lambda name: built.append(name))
    api._build_builtin("tiny-qwen-edit-plus")
    api._build_builtin("/some/user/folder")
    assert built == ["tiny-qwen-edit-plus"]
