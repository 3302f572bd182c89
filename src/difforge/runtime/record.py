"""RunRecord: the single account of one generation or edit.

Pipelines fill it while they run (phases, per-step times, peak memory, adaptations chosen);
validation and reports only *read* records, they never re-time anything themselves.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from .atomic import atomic_write_text

if TYPE_CHECKING:
    from ..devices import Backend

SCHEMA_VERSION = 1


@dataclass
class Adaptation:
    """One device-specific substitution, so a reader sees exactly what ran."""

    what: str  # e.g. "rms_norm", "attention", "transformer weights"
    choice: str  # e.g. "torch_npu.npu_rms_norm", "sdpa", "fp8 e4m3fn storage"
    exact: bool = True  # False for approximations (step caching, fp8, unguided tail ...)
    detail: str = ""


@dataclass
class PhaseStat:
    name: str
    wall_s: float
    peak_device_bytes: int | None
    peak_host_rss_bytes: int


class _RSSSampler:
    """Samples this process's RSS in a background thread to find a phase's host-memory peak."""

    def __init__(self, interval_s: float = 0.02) -> None:
        self._proc = psutil.Process()
        self.peak = self._proc.memory_info().rss
        self._stop = threading.Event()
        self._interval = interval_s
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.peak = max(self.peak, self._proc.memory_info().rss)

    def __enter__(self) -> _RSSSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._proc.memory_info().rss)


@dataclass
class RunRecord:
    """Config, environment, adaptations, per-phase timing and memory, outputs of one run."""

    kind: str  # "generate" | "edit"
    config: dict[str, Any] = field(default_factory=dict)
    backend: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    adaptations: list[Adaptation] = field(default_factory=list)
    phases: dict[str, PhaseStat] = field(default_factory=dict)
    step_times_s: list[float] = field(default_factory=list)
    outputs: list[dict[str, Any]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    # ---- filling ----------------------------------------------------------------------------
    def adapt(self, what: str, choice: str, exact: bool = True, detail: str = "") -> None:
        """Log a device-specific choice once (re-logging the same `what` replaces it)."""
        self.adaptations = [a for a in self.adaptations if a.what != what]
        self.adaptations.append(Adaptation(what, choice, exact, detail))

    @contextmanager
    def phase(self, name: str, backend: Backend | None = None) -> Iterator[None]:
        """Time a phase with device syncs at both ends; record peak device memory and host RSS."""
        if backend is not None:
            backend.synchronize()
            backend.reset_peak_memory()
        with _RSSSampler() as rss:
            start = time.perf_counter()
            try:
                yield
            finally:
                if backend is not None:
                    backend.synchronize()
                wall = time.perf_counter() - start
        peak_dev = backend.peak_memory_bytes() if backend is not None else None
        prev = self.phases.get(name)
        if prev is not None:  # a phase entered twice (e.g. encode per prompt) accumulates
            wall += prev.wall_s
            peak_dev = max(x for x in (peak_dev, prev.peak_device_bytes) if x is not None) if (
                peak_dev is not None or prev.peak_device_bytes is not None
            ) else None
            rss.peak = max(rss.peak, prev.peak_host_rss_bytes)
        self.phases[name] = PhaseStat(name, wall, peak_dev, rss.peak)

    def add_output(self, path: str | Path) -> dict[str, Any]:
        path = Path(path)
        entry = {"path": str(path), "sha256": sha256_file(path), "bytes": path.stat().st_size}
        self.outputs.append(entry)
        return entry

    # ---- reading ----------------------------------------------------------------------------
    @property
    def total_wall_s(self) -> float:
        return sum(p.wall_s for p in self.phases.values())

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False, default=_json_default)

    def save(self, path: str | Path) -> Path:
        return atomic_write_text(Path(path), self.to_json() + "\n")

    def perf_dump(self) -> dict[str, Any]:
        """The run's timings in SGLang-Diffusion's ``--perf-dump-path`` shape, so the tools people already
        point at SGLang dumps read difforge's too: ``total_duration_ms``, per-stage ``steps``,
        ``denoise_steps_ms`` and ``memory_checkpoints`` (plus what ran: device, dtype, difforge version)."""
        from ..version import __version__

        mib = 1 << 20
        stages = [{"name": name, "duration_ms": round(p.wall_s * 1000, 3)} for name, p in self.phases.items()]
        memory = {f"after_{name}": {
            "peak_allocated_mb": round(p.peak_device_bytes / mib, 1) if p.peak_device_bytes is not None else None,
            "peak_host_rss_mb": round(p.peak_host_rss_bytes / mib, 1)} for name, p in self.phases.items()}
        return {
            "total_duration_ms": round(sum(st["duration_ms"] for st in stages), 3),  # the stages' sum, as shown
            "steps": stages,
            "denoise_steps_ms": [{"step": i, "duration_ms": round(t * 1000, 3)} for i, t in enumerate(self.step_times_s)],
            "memory_checkpoints": memory,
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "difforge_version": __version__,
            "device": self.backend.get("device"),
            "dtype": self.backend.get("dtype"),
        }

    def save_perf_dump(self, path: str | Path) -> Path:
        return atomic_write_text(Path(path), json.dumps(self.perf_dump(), indent=2) + "\n")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunRecord:
        data = dict(data)
        data["adaptations"] = [Adaptation(**a) for a in data.get("adaptations", [])]
        data["phases"] = {k: PhaseStat(**v) for k, v in data.get("phases", {}).items()}
        return cls(**data)

    @classmethod
    def load(cls, path: str | Path) -> RunRecord:
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _json_default(obj: Any) -> Any:
    import torch

    from ..devices import dtype_name

    if isinstance(obj, torch.dtype):
        return dtype_name(obj)
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, set | frozenset | tuple):
        return list(obj)
    return str(obj)
