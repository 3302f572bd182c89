"""sha256 of large files, read once: cached by path, size, modification time and inode.

Why: a sign-off names the weights it tested by their sha256 (the report, golden bundles), and a 20B
checkpoint is 40-80 GB - minutes of reading on every validation otherwise.  The cache lives in
``DIFFORGE_HOME/sha256-cache.json``; an entry is reused only while the file's size, ``mtime_ns`` and
inode are unchanged (any rewrite, copy-over or touch re-hashes it).  A cache that cannot be read or
written is ignored: the digest is then computed, never guessed.
"""

from __future__ import annotations

import json
import os
import posixpath
import stat
from pathlib import Path

from ..errors import CheckpointError, InputError
from .atomic import atomic_write_text
from .reading import check_file, read_bytes
from .record import sha256_file

CACHE_NAME = "sha256-cache.json"
#: Files smaller than this are hashed directly (caching them would cost more than it saves).
MIN_CACHED_BYTES = 1 << 20


def difforge_home() -> Path:
    """difforge's cache folder (``DIFFORGE_HOME``, default ``~/.cache/difforge``): built tiny models, hashes."""
    return Path(os.environ.get("DIFFORGE_HOME") or Path.home() / ".cache" / "difforge")


def _load(path: Path) -> dict[str, dict]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def file_sha256(path: str | Path) -> str:
    """The sha256 of ``path``, from the cache when the file is unchanged since it was last hashed."""
    target = Path(path).resolve()
    check_file(target, what=str(path), error=InputError)  # a FIFO or a device would block or never end
    st = target.stat()
    if st.st_size < MIN_CACHED_BYTES:
        return sha256_file(target)
    stamp = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino}
    cache_path = difforge_home() / CACHE_NAME
    cache = _load(cache_path)
    hit = cache.get(str(target))
    if isinstance(hit, dict) and all(hit.get(k) == v for k, v in stamp.items()) and isinstance(hit.get("sha256"), str):
        return hit["sha256"]
    digest = sha256_file(target)
    cache = _load(cache_path)  # re-read: another process may have added entries meanwhile
    cache[str(target)] = {**stamp, "sha256": digest}
    try:
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(cache_path, json.dumps(cache, indent=0) + "\n")
    except OSError:
        pass  # a read-only home: the digest is still right, only not remembered
    return digest


#: Folders of the tools that download models (``git clone``, ``hf download --local-dir``): their files
#: differ between two downloads of the same model (packs, timestamps), and no loader reads them, so
#: they are not part of a model's identity - except a file a shard index names there.
BOOKKEEPING = (".git", ".cache/huggingface")
#: The most bytes of a shard index read for the names it holds (the model loaders' config cap).
INDEX_LIMIT = 16 << 20
#: A model folder with more entries than this is refused by the loaders; the walk stops there too.
MAX_ENTRIES = 100_000


def _bookkeeping(rel: str) -> bool:
    return any(rel == b or rel.startswith(f"{b}/") for b in BOOKKEEPING)


def model_file_hashes(folder: str | Path) -> dict[str, str]:
    """The identity of a model folder: sha256 of every file in it, by its path relative to the folder.

    Every link is followed (a component folder or a weights file behind a link counts as what it
    points to, so swapping the file behind a link changes the identity), hidden files and folders
    count (a shard ``.h/w.safetensors`` is weights like any other), a folder reached by two paths
    counts under both (so which path a loader takes cannot matter), and a link back to a folder
    above ends there.  Only regular files are hashed (the loaders refuse anything else); a folder
    whose paths through its links number over :data:`MAX_ENTRIES` is refused, as the loaders
    refuse it.  Download bookkeeping (:data:`BOOKKEEPING`) is left out unless a shard index
    (``*.index.json``) names a file there.
    """
    root = Path(folder)
    out: dict[str, str] = {}
    indexes: list[tuple[Path, str]] = []
    stack: list[tuple[Path, str, frozenset[Path]]] = [(root, "", frozenset({root.resolve()}))]
    count = 0
    while stack:
        current, prefix, above = stack.pop()
        try:
            entries = sorted(os.scandir(current), key=lambda e: e.name)
        except OSError:
            continue  # an unreadable folder: the loaders refuse it by name
        for entry in entries:
            count += 1
            if count > MAX_ENTRIES:
                raise CheckpointError(f"{root} holds more than {MAX_ENTRIES} entries (counting every path through its"
                                      " links); it is not a model folder.")
            rel = f"{prefix}{entry.name}"
            try:
                st = os.stat(entry.path)
            except OSError:
                continue  # a dangling link or a loop: nothing to hash, the loaders refuse it
            if stat.S_ISDIR(st.st_mode):
                real = Path(entry.path).resolve()
                if real not in above:  # a link back to a folder above would never end
                    stack.append((Path(entry.path), f"{rel}/", above | {real}))
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            if entry.name.endswith(".index.json"):
                indexes.append((Path(entry.path), rel))
            if not _bookkeeping(rel):
                out[rel] = file_sha256(entry.path)
    for index, rel in indexes:
        for name in _index_names(index):
            named = posixpath.normpath(posixpath.join(posixpath.dirname(rel), name))
            path = root / named
            if named not in out and not named.startswith("../") and path.is_file():
                out[named] = file_sha256(path)
    return dict(sorted(out.items()))


def _index_names(index: Path) -> list[str]:
    """The file names a shard index's ``weight_map`` holds; none when it cannot be read (the loaders say why)."""
    try:
        data = json.loads(read_bytes(index, limit=INDEX_LIMIT, what=str(index)))
    except Exception:  # noqa: BLE001 - any unreadable index: the loaders refuse it with its reason
        return []
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    return sorted({v for v in weight_map.values() if isinstance(v, str)}) if isinstance(weight_map, dict) else []


__all__ = ["difforge_home", "file_sha256", "model_file_hashes"]
