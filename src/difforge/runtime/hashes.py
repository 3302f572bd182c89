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
from pathlib import Path

from .atomic import atomic_write_text
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


__all__ = ["difforge_home", "file_sha256"]
