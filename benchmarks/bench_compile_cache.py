"""How much Inductor's on-disk caches under ``DIFFORGE_HOME`` shorten a second process's compile.

Runs ``benchmarks/compile_cache_child.py`` (tiny-ursa's transformer, regional compile, CPU float32) in a cold
process and then in a second process with the same, now filled, ``DIFFORGE_HOME``, and prints both compile
times and their ratio as JSON.  Issue 27 asks for >= 5x at the medium size; the number goes to
``benchmarks/RESULTS.md`` with the load it was measured under (a loaded machine stretches both runs).

    python -m benchmarks.bench_compile_cache [--rounds N]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from difforge.devices.compile import CACHE_ENV, CACHE_SWITCH_ENV

ROOT = Path(__file__).resolve().parents[1]


def compile_seconds(home: Path) -> float:
    """One fresh process's compile seconds with ``home`` as DIFFORGE_HOME (no user cache variable in the way)."""
    env = {k: v for k, v in os.environ.items() if k not in (*CACHE_ENV, *CACHE_SWITCH_ENV)}
    env.update(DIFFORGE_HOME=str(home), PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
    out = subprocess.run([sys.executable, "-m", "benchmarks.compile_cache_child"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=900, check=True)
    return float(json.loads(out.stdout.strip().splitlines()[-1])["compile_s"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1, help="cold/warm pairs, each in a fresh DIFFORGE_HOME")
    args = parser.parse_args(argv)
    rows = []
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="difforge-compile-cache-") as home:
            cold = compile_seconds(Path(home))
            warm = compile_seconds(Path(home))
        rows.append({"cold_s": round(cold, 2), "warm_s": round(warm, 2), "ratio": round(cold / warm, 2)})
    print(json.dumps({"rounds": rows, "load_average": os.getloadavg()[0]}))


if __name__ == "__main__":
    main()
