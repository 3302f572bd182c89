"""Deterministic tiny checkpoints in the real layouts, built on demand into ``DIFFORGE_HOME``.

Same builder version -> same bytes.  Builds go to a temporary folder that is renamed into place,
so parallel test workers never see a half-built model, and a build that fails (``DIFFORGE_HOME``
read-only, a file, or on a full disk) leaves nothing behind and is one
:class:`~difforge.errors.OutputError` sentence.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from safetensors import SafetensorError

from ..errors import CheckpointError, OutputError
from ..runtime.atomic import atomic_write_text
from ..runtime.hashes import difforge_home, model_file_hashes
from .families import QWEN_EDIT, QWEN_EDIT_PLUS, URSA

#: The built-in models: name -> family.
TINY_MODELS = {
    "tiny-ursa": URSA,
    "tiny-ursa-video": URSA,
    "tiny-qwen-edit": QWEN_EDIT,
    "tiny-qwen-edit-plus": QWEN_EDIT_PLUS,
}

#: Bump a builder's version whenever its output bytes change, so caches rebuild.
#: Qwen v2: processor/ in the published layout (preprocessor + video preprocessor configs).
TINY_VERSIONS = {"tiny-ursa": "v1", "tiny-ursa-video": "v1", "tiny-qwen-edit": "v2", "tiny-qwen-edit-plus": "v2"}


def _builder(name: str) -> Callable[[Path], None]:
    """Import only the family the name needs (one family's import cost or failure stays its own)."""
    if name == "tiny-ursa":
        from .ursa.tiny import build_tiny_ursa

        return build_tiny_ursa
    if name == "tiny-ursa-video":
        from .ursa.tiny import build_tiny_ursa_video

        return build_tiny_ursa_video
    from .qwen_edit.tiny import build_tiny_qwen_edit

    plus = name == "tiny-qwen-edit-plus"
    return lambda folder: build_tiny_qwen_edit(folder, plus=plus)


def tiny_path(name: str) -> Path:
    return difforge_home() / "models" / f"{name}-{TINY_VERSIONS[name]}"


def manifest_path(name: str) -> Path:
    """Where the sha256 of every file of a built tiny model is kept: beside its folder, not in it (the folder's
    own files are its identity in golden bundles)."""
    final = tiny_path(name)
    return final.parent / f"{final.name}.sha256.json"


def check_intact(name: str) -> None:
    """Refuse a built tiny model whose files changed since it was built (a damaged cache), with the way out.

    Without this a truncated or edited cached file surfaces as a checkpoint error about a folder the
    user never made, with no hint that deleting it makes difforge build it again.  Caches built
    before manifests existed have none and are not checked.
    """
    final, manifest = tiny_path(name), manifest_path(name)
    try:
        want = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if not isinstance(want, dict):
        return
    have = model_file_hashes(final)
    for rel in sorted(set(want) | set(have)):
        if want.get(rel) != have.get(rel):
            change = "is missing" if rel not in have else "was added" if rel not in want else "changed"
            raise CheckpointError(
                f"The built-in model {name} in {final} is damaged ({rel} {change} since it was built); delete that"
                " folder and difforge builds it again."
            )


def ensure_tiny(name: str) -> Path:
    """Return the folder of built-in tiny model ``name``, building it first if needed (and checking an
    existing build is intact: :func:`check_intact`)."""
    final = tiny_path(name)
    if (final / "model_index.json").is_file():
        check_intact(name)
        return final
    builder = _builder(name)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=final.parent))
    except OSError as exc:
        raise OutputError(_cannot_build(name, exc)) from None
    try:
        builder(tmp)
        _check_complete(name, tmp)
        hashes = model_file_hashes(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "model_index.json").is_file():  # not a lost race: a real failure
                raise
        else:
            atomic_write_text(manifest_path(name), json.dumps(hashes, indent=1) + "\n")
    except (OSError, SafetensorError) as exc:  # safetensors reports a full disk as its own error type
        raise OutputError(_cannot_build(name, exc)) from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _check_complete(name: str, folder: Path) -> None:
    """Refuse to publish a build with an empty component folder: every later run would trip over it, and
    it is what a save on a torch.distributed rank other than 0 leaves (transformers writes on rank 0 only)."""
    empty = sorted(d.name for d in folder.iterdir() if d.is_dir() and not any(d.iterdir()))
    if empty:
        raise OutputError(f"Building the built-in model {name} wrote an empty {empty[0]}/ folder (was it built on a "
                          "torch.distributed rank other than 0?); nothing was published, run again.")


def _cannot_build(name: str, exc: BaseException) -> str:
    reason = os.strerror(exc.errno) if isinstance(exc, OSError) and exc.errno else " ".join(str(exc).split())[:200]
    return (
        f"Cannot build the built-in model {name} in DIFFORGE_HOME={difforge_home()} ({reason}); point DIFFORGE_HOME"
        " at a writable folder with free space."
    )
