"""Read, parse once, walk once, filter suppressions: the scan of one file and of many.

Each file is read as bytes, decoded as UTF-8 and parsed with :func:`ast.parse` - never imported.
Files over :data:`MAX_BYTES`, files that are not UTF-8 or not valid Python, and trees too deep to
walk become :class:`~difforge.scan.result.Skipped` entries with the reason, never a traceback.
A large tree (all of diffusers) is spread over the machine's cores: the work per file is
independent, and a process pool avoids the interpreter lock.
"""

from __future__ import annotations

import ast
import functools
import gc
import os
import re
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from ..errors import DifforgeError, InputError
from .follow import FOLLOW_DEPTH, MAX_SOURCE_BYTES, Followed, follow, package_of, read_source
from .resolve import Resolved, resolve
from .result import SEVERITIES, TARGETS, Finding, ScanResult, Skipped
from .rules import RULES, hooks_for
from .walker import Walker

#: Files larger than this are skipped (generated tables, vendored blobs): 2 MiB.
MAX_BYTES = MAX_SOURCE_BYTES
#: Below this many files a scan runs in this process (starting workers costs more than it saves).
PARALLEL_MIN_FILES = 48
#: ``# difforge: ignore`` (every rule) or ``# difforge: ignore[DF105, DF111]`` on the finding's line.
SUPPRESS = re.compile(r"#\s*difforge:\s*ignore(?:\[([^\]]*)\])?", re.IGNORECASE)
_SNIPPET_CHARS = 160


def check_target(target_device: str) -> str:
    """The ``--target`` value, lower-cased; an unknown one is an InputError."""
    device = str(target_device).strip().lower()
    if device not in TARGETS:
        raise InputError(f"unknown scan target {target_device!r}; choose one of {', '.join(TARGETS)}.")
    return device


def check_fail_on(fail_on: str | None) -> str | None:
    """The ``--fail-on`` level (``warn`` spells ``warning``); an unknown one is an InputError."""
    if fail_on is None:
        return None
    level = fail_on.strip().lower()
    level = "warning" if level == "warn" else level
    if level not in SEVERITIES:
        raise InputError(f"unknown --fail-on level {fail_on!r}; choose one of {', '.join(SEVERITIES)}.")
    return level


def fail_on_exit_code(result: ScanResult, fail_on: str | None) -> int:
    """``--fail-on``: 1 when a finding is ``fail_on`` or worse, else 0."""
    level = check_fail_on(fail_on)
    return 1 if level is not None and result.at_least(level) else 0


def suppressions(text: str) -> dict[int, frozenset[str]]:
    """Line number -> rule ids silenced there (``"*"``: all)."""
    out: dict[int, frozenset[str]] = {}
    if "difforge:" not in text.lower():
        return out
    for number, line in enumerate(text.splitlines(), start=1):
        m = SUPPRESS.search(line)
        if m:
            ids = m.group(1)
            out[number] = frozenset(i.strip().upper() for i in ids.split(",") if i.strip()) if ids else frozenset("*")
    return out


@functools.cache
def _hooks(target: str) -> tuple[dict[type, list], list]:
    return hooks_for(target)


def scan_source(text: str, display: str, target: str = "npu") -> list[Finding]:
    """Findings of one module's source text (raises SyntaxError / RecursionError like ast.parse)."""
    hooks, finishers = _hooks(target)
    # A syntax tree holds no reference cycles, so the cyclic collector only burns time on its millions of
    # fresh nodes (about 40 % of the parse); it is back on before this returns.
    collecting = gc.isenabled()
    gc.disable()
    try:
        tree = ast.parse(text, filename=display)
        hits = Walker(hooks, finishers, target).run(tree)
    finally:
        if collecting:
            gc.enable()
    silenced = suppressions(text)
    lines = text.splitlines()
    seen: set[tuple[str, int]] = set()
    out: list[Finding] = []
    for rule_id, line, col, detail, severity in hits:
        if (rule_id, line) in seen:
            continue
        seen.add((rule_id, line))
        quiet = silenced.get(line)
        if quiet and ("*" in quiet or rule_id in quiet):
            continue
        rule = RULES[rule_id]
        snippet = lines[line - 1].strip() if 0 < line <= len(lines) else ""
        if len(snippet) > _SNIPPET_CHARS:
            snippet = snippet[: _SNIPPET_CHARS - 3] + "..."
        out.append(Finding(display, line, col + 1, rule_id, severity or rule.severity_for(target) or "info",
                           f"{detail}: {rule.why_for(target)}", rule.fix, snippet))
    return out


def scan_file(path: str, display: str, target: str) -> tuple[list[Finding], Skipped | None]:
    """One file: its findings, or why it was skipped."""
    try:
        data = read_source(path, MAX_BYTES)
    except DifforgeError as exc:  # not a regular file, too large, unreadable: the rule's one line says which
        return [], Skipped(display, str(exc).rstrip("."))
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        return [], Skipped(display, f"not UTF-8 (byte {exc.start})")
    try:
        return scan_source(text, display, target), None
    except SyntaxError as exc:
        return [], Skipped(display, f"not valid Python ({exc.msg}, line {exc.lineno})")
    except (ValueError, RecursionError, MemoryError) as exc:
        return [], Skipped(display, f"cannot be parsed ({exc.__class__.__name__})")


def _scan_batch(batch: Sequence[tuple[str, str]], target: str) -> list[tuple[list[Finding], Skipped | None]]:
    return [scan_file(path, display, target) for path, display in batch]


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def scan(target: str | Path, target_device: str = "npu", *, jobs: int | None = None,
         follow_depth: int = FOLLOW_DEPTH) -> ScanResult:
    """Scan a file, a folder or a module name (never imported) for what breaks or is slow on the target.

    ``jobs``: worker processes (default: the cores this process may use; 1 scans in this process).
    ``follow_depth``: levels of imports followed within the scanned code's own top-level package
    (:mod:`difforge.scan.follow`; 0 scans only what was named, and the result says so).
    """
    device = check_target(target_device)
    start = time.perf_counter()
    resolved = resolve(target)
    followed = _follow(resolved.root, resolved.files, follow_depth)
    base = resolved.base
    if followed.files and followed.package:
        pkg = package_of(resolved.root)
        base = pkg.parent if pkg else base
    shown = Resolved(resolved.root, resolved.files, base)
    tasks = [(str(p), shown.display(p)) for p in (*resolved.files, *followed.files)]
    workers = min(jobs or _cores(), 16)
    results: list[tuple[list[Finding], Skipped | None]] = []
    if workers > 1 and len(tasks) >= PARALLEL_MIN_FILES:
        # Interleave rather than slice, so big and small files of one subpackage spread over the workers.
        n = min(workers, len(tasks)) * 4
        batches = [tasks[i::n] for i in range(n)]
        try:
            with ProcessPoolExecutor(max_workers=min(workers, len(tasks))) as pool:
                for part in pool.map(_scan_batch, batches, [device] * len(batches)):
                    results.extend(part)
        except (OSError, BrokenProcessPool):  # no process support here (a sandbox, no /dev/shm): one core
            results = _scan_batch(tasks, device)
    else:
        results = _scan_batch(tasks, device)
    findings = [f for found, _ in results for f in found]
    findings.sort(key=lambda f: (f.path, f.line, f.col, f.rule))
    skipped = tuple(sorted((s for _, s in results if s is not None), key=lambda s: s.path))
    skipped_paths = {s.path for s in skipped}
    files = tuple(d for _, d in tasks if d not in skipped_paths)
    return ScanResult(device, str(resolved.root), tuple(findings), files, skipped, time.perf_counter() - start,
                      followed=tuple(shown.display(p) for p in followed.files), follow_note=followed.note)


def _follow(root: Path, files: tuple[Path, ...], depth: int) -> Followed:
    """The imports to follow from a scan of ``root`` (nothing when ``root`` is the whole package)."""
    pkg = package_of(root)
    if pkg is not None and root.is_dir() and root.resolve() == (pkg.parent / pkg.name).resolve():
        return Followed(pkg.name, note=f"the whole package {pkg.name} was scanned")
    if depth <= 0:
        return Followed(pkg.name if pkg else None, note="imports were not followed (follow depth 0)")
    return follow(files, pkg, depth)
