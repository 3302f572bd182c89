"""Run the difforge CLI with one planted fault: ``python -m tests.validate.fault_cli FAULT -- ARGS``.

Why a wrapper process and not ``op_overrides``: the fault harness must measure ``difforge validate``
as a user meets it, through the real command line and exit code, and without any hook inside
difforge (the lead changes validate's internals while this harness measures them).  The fault's
:class:`~tests.validate.faults.Fault` mode is entered for the whole process, around
``difforge.cli.main`` with ``sys.argv`` set to ``difforge ARGS``, so every bf16/fp16 call of that
torch function in the process is faulted - the device under test's, and any floor computed at the
device's dtype with the same kernels, exactly as when both ran on a broken device.

Exit code: the CLI's own (0 PASS/WARN, 1 FAIL, 2 usage error; 130/143 interrupted).  With
``DIFFORGE_FAULT_REPORT=PATH`` set, ``{"fault": NAME, "fired": N, "what": ..., "exit_code": ...}`` is
written there (also when the CLI failed), so a sweep can tell "caught" from "never reached".
``FAULT`` = ``none`` runs clean; ``--list`` prints the catalogue.
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import nullcontext
from pathlib import Path

from . import faults

USAGE = "usage: python -m tests.validate.fault_cli FAULT -- DIFFORGE_ARGS...   (FAULT: none, or see --list)"


def exit_code(value: object) -> int:
    """``SystemExit.code`` as an int (None is 0; a message string is 1, as Python itself exits)."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    return 1


def write_report(path: str, name: str, fired: int | None, what: str, code: int) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps({"fault": name, "fired": fired, "what": what, "exit_code": code}, indent=2))
    tmp.replace(target)


def run(name: str, args: list[str]) -> int:
    """Run ``difforge ARGS`` inside fault ``name``'s mode; returns the CLI's exit code."""
    fault = faults.get(name)
    code = 0
    saved = sys.argv
    sys.argv = ["difforge", *args]
    try:
        from difforge.cli import main

        with fault if fault is not None else nullcontext():
            main()
    except SystemExit as exc:
        code = exit_code(exc.code)
    except KeyboardInterrupt:
        code = 130
    finally:
        sys.argv = saved
        report = os.environ.get("DIFFORGE_FAULT_REPORT")
        if report:
            write_report(report, name, fault.fired if fault is not None else 0,
                         fault.what if fault is not None else "no fault (clean run)", code)
    return code


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--list"]:
        for key, f in faults.FAULTS.items():
            print(f"{key:20s} {f.family:12s} {f.what}")
        return 0
    if len(argv) < 2 or argv[1] != "--":
        print(USAGE, file=sys.stderr)
        return 2
    name, args = argv[0], argv[2:]
    if name != "none" and name not in faults.FAULTS:
        print(f"fault_cli: unknown fault {name!r}; known: none, {', '.join(faults.FAULTS)}", file=sys.stderr)
        return 2
    return run(name, args)


if __name__ == "__main__":
    sys.exit(main())
