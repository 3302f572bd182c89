"""The msprobe view (``--msprobe``): the device's and the floor's dumps in msprobe's own layout, and
``msprobe compare``'s per-call table beside difforge's verdicts.

msprobe (PyPI ``mindstudio-probe``) is the Ascend ecosystem's accuracy tool: engineers dump a model's
API calls on the NPU and on a golden device, then ``msprobe compare`` and ``msprobe graph_visualize``
the two dumps.  With the optional extra installed (``pip install 'difforge[msprobe]'``), validate
writes both dumps for one unit both sides run on the same inputs - **the teacher-forced step 0 of the
first seed** (the probe's ``forward_step`` on the reference run's recorded step-0 inputs, the step
rung's first row) - runs ``msprobe compare`` on them and keeps its per-call table (worst rows first)
with difforge's verdict for the same place: the block verdict of the step rung's localisation (or
step 0's verdict) and the operator rung's verdict for the op type.

**What the device is compared with.**  msprobe compares two runs at the same dtype: a bfloat16 dump
against a float32 one is ``error: dtype inconsistent`` on every tensor row (measured on tiny-ursa and
tiny-qwen-edit: every row).  The rungs' emulated floor (:mod:`.floor`) computes in float32 (weights and
module outputs rounded to the device's dtype, stored in float32), so its dump shows float32 too.  So
the golden side of the msprobe view is, by the floor validate built:

* emulated floor (the default): the *operator rung's* emulation applied to the whole step - the model
  loaded once more on the reference device in the device's dtypes (each submodule as the device holds
  it), run under :class:`~difforge.models.probing.LowPrecisionOnFloat32`: every call whose floating
  inputs are all in the device's dtype computes with the reference's float32 kernel and is rounded to
  that dtype, so the dump carries the device's dtypes, every value is one a correctly rounded kernel
  could give, and no low-precision kernel (the device's or the CPU's) runs;
* ``--floor DEVICE[:DTYPE]``: that second device, as it is (msprobe's own NPU-vs-GPU method);
* a device at the reference's dtype: the reference itself; no floor at all: the reference, and the
  view says msprobe will call every row dtype-inconsistent.

**Process-wide patching.**  msprobe's ``PrecisionDebugger`` is a process-wide singleton that replaces
torch's functions with wrappers (and hooks modules, jit, dynamo) from the moment it is built.  So the
view runs last, after every rung and the gallery, with a fresh debugger, and afterwards puts back the
torch functions (msprobe's own restore) and removes the module hooks and ``forward`` wrappers it added
to the pipelines; its other patches (jit/dynamo/triton start-up hooks) stay in the process.  Its
messages go to ``msprobe/msprobe.log``, not to difforge's stdout.

**The CANN line.**  Every ``msprobe`` command prints ``[ERROR] Please verify that the CANN environment is
properly configured.`` on a machine without CANN: its offline-model (OM) comparison imports CANN's
``acl`` when the CLI starts.  Comparing dumps never uses it, so the line is dropped from the compare log
and the report explains it instead of showing it as an error.

Nothing here imports msprobe at module level: without the extra, ``--msprobe`` is refused with one line
(:func:`require`) and the report says how to get the view (:func:`how_to`).
"""

from __future__ import annotations

import contextlib
import csv
import gc
import importlib.metadata
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import InputError
from .floor import module_dtypes

#: The one line that says how to get the view.
INSTALL = "pip install 'difforge[msprobe]'"
PACKAGE = "mindstudio-probe"
#: msprobe's dump task and level: per-call statistics (bounded size on a 20B model; ``tensor`` dumps every
#: input and output whole) of every API call and every module (``mix``: modules name where a call ran).
TASK = "statistics"
LEVEL = "mix"
#: Rows of msprobe's table the report shows (worst first); the whole CSV is in the report folder.
TOP_ROWS = 15
#: What msprobe's CLI prints on a machine without CANN (see the module docstring).
CANN_LINE = "Please verify that the CANN environment is properly configured."
CANN_NOTE = ("msprobe's CLI prints \"[ERROR] Please verify that the CANN environment is properly configured.\" "
             "on a machine without CANN (its offline-model comparison imports CANN's acl at start-up); comparing "
             "dumps does not use CANN, so difforge drops that line from the compare log: it is not an error here")
#: Where the view's files go inside the report folder.
FOLDER = "msprobe"
COMPARE_TIMEOUT_S = 3600
_SEVERITY = {"error": 2, "warning": 1}


# ---- availability --------------------------------------------------------------------------------
def available() -> bool:
    """msprobe (the ``mindstudio-probe`` wheel) can be imported here."""
    try:
        return importlib.util.find_spec("msprobe") is not None
    except (ImportError, ValueError):
        return False


def version() -> str | None:
    try:
        return importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return None


def require() -> None:
    """``--msprobe`` without msprobe installed: one line, exit 2 (before anything runs)."""
    if not available():
        raise InputError(f"--msprobe needs msprobe (the {PACKAGE} package), which is not installed here: {INSTALL}")


def check_golden(golden: Any, where: Any) -> None:
    """``validate --golden G --msprobe`` needs a bundle made with ``difforge golden --msprobe`` (exit 2)."""
    from .bundle import GoldenError

    if not (golden.bundle.manifest.get("msprobe") or {}).get("floor"):
        raise GoldenError(f"--golden {where} holds no msprobe dump; make the bundle with 'difforge golden --msprobe' "
                          "to use --msprobe with it.")


def how_to() -> dict[str, Any]:
    """What the report says when the view was not asked for."""
    return {"requested": False, "available": available(), "install": INSTALL}


# ---- quiet msprobe ----------------------------------------------------------------------------------
@contextlib.contextmanager
def _logged(log: Path) -> Iterator[None]:
    """msprobe prints its log to stdout (and progress bars to stderr): into ``log`` instead."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a", encoding="utf-8") as fh, contextlib.redirect_stdout(fh), contextlib.redirect_stderr(fh):
        yield


class _Undo:
    """Put back what msprobe's module dump adds to a network: hooks, ``forward`` wrappers, marker attributes."""

    def __init__(self, roots: list[nn.Module]) -> None:
        self.saved: list[tuple[nn.Module, dict[str, set[int]], Any, set[str]]] = []
        for root in roots:
            for m in root.modules():
                hooks = {name: set(getattr(m, name).keys()) for name in _HOOK_DICTS if hasattr(m, name)}
                self.saved.append((m, hooks, m.__dict__.get("forward", _MISSING), set(m.__dict__)))

    def restore(self) -> None:
        for m, hooks, forward, attrs in self.saved:
            for name, keys in hooks.items():
                d = getattr(m, name)
                for key in [k for k in d if k not in keys]:
                    del d[key]
            if forward is _MISSING:
                m.__dict__.pop("forward", None)
            else:
                m.__dict__["forward"] = forward
            for attr in [a for a in m.__dict__ if a not in attrs and a.startswith("msprobe")]:
                del m.__dict__[attr]


_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
               "_forward_hooks_with_kwargs", "_forward_pre_hooks_with_kwargs", "_forward_hooks_always_called")
_MISSING = object()


def _network(probe: Any) -> Any:
    """What msprobe's module dump hooks: the transformer (its module names then match the probe's block
    names), else every network of the probe."""
    modules = probe.modules()
    return modules["transformer"] if "transformer" in modules else list(modules.values())


def _roots(network: Any) -> list[nn.Module]:
    return list(network) if isinstance(network, list | tuple) else [network]


@contextlib.contextmanager
def _eager() -> Iterator[None]:
    """Compiled regions run eagerly while dumping (msprobe sees torch calls, not a compiled graph)."""
    if hasattr(torch.compiler, "set_stance"):
        with torch.compiler.set_stance("force_eager"):
            yield
    else:
        yield


# ---- dumping ------------------------------------------------------------------------------------------
class Side:
    """One side of the view: a probe, the context its step runs in, and what to call it."""

    def __init__(self, name: str, probe: Any, label: str, context: Callable[[], Any] = contextlib.nullcontext
                 ) -> None:
        self.name, self.probe, self.label, self.context = name, probe, label, context


def write_config(root: Path) -> Path:
    """The msprobe config the dumps run with (kept in the report: re-dump with ``"task": "tensor"``)."""
    path = root / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    config = {"task": TASK, "level": LEVEL, "dump_path": str(root / "_raw"), "rank": [], "step": [],
              "statistics": {"scope": [], "list": [], "data_mode": ["all"]}}
    path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return path


def dump(root: Path, sides: list[Side], cfg: Any, inputs: dict[str, torch.Tensor]) -> dict[str, dict[str, Any]]:
    """Dump step 0 of each side with one fresh msprobe debugger; each lands in ``root/<name>/step0``.

    Each side first runs the step once undumped, so one-off preparation (prompt encoding, encoding the
    reference pictures, a compile) is in neither dump and both dumps hold the same sequence of calls."""
    config = write_config(root)
    log = root / "msprobe.log"
    out: dict[str, dict[str, Any]] = {}
    networks = {s.name: _network(s.probe) for s in sides}
    undo = _Undo([m for net in networks.values() for m in _roots(net)])
    debugger: Any = None
    try:
        with _logged(log):
            from msprobe.pytorch import PrecisionDebugger

            PrecisionDebugger._instance = None  # a process-wide singleton: one fresh debugger per validation
            debugger = PrecisionDebugger(config_path=str(config))
            for k, side in enumerate(sides):
                t0 = time.perf_counter()
                with torch.no_grad(), _eager(), side.context():
                    side.probe.forward_step(cfg, 0, inputs)
                    t1 = time.perf_counter()
                    debugger.start(model=networks[side.name])
                    try:
                        side.probe.forward_step(cfg, 0, inputs)
                    finally:
                        debugger.stop()
                        debugger.step()
                t2 = time.perf_counter()
                target = root / side.name / "step0"
                shutil.rmtree(target, ignore_errors=True)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(str(root / "_raw" / f"step{k}"), str(target))
                out[side.name] = {"path": target, "label": side.label, "calls": _calls(target),
                                  "warmup_s": t1 - t0, "dump_s": t2 - t1}
    finally:
        if debugger is not None:
            register = getattr(getattr(debugger, "service", None), "api_register", None)
            if register is not None and hasattr(register, "restore_all_api"):
                with _logged(log):
                    register.restore_all_api()
        undo.restore()
        shutil.rmtree(root / "_raw", ignore_errors=True)
    return out


def _rank_dir(step: Path) -> Path:
    """The one rank/process folder of a step folder (``rank0`` or ``procPID``)."""
    found = sorted(p for p in step.iterdir() if p.is_dir())
    if not found:
        raise FileNotFoundError(f"no msprobe dump under {step}")
    return found[0]


def _calls(step: Path) -> int:
    data = json.loads((_rank_dir(step) / "dump.json").read_text(encoding="utf-8"))
    return len(data.get("data", {}))


def files(root: Path) -> list[Path]:
    """Every file of the view (for the deliverables list)."""
    return sorted(p for p in root.rglob("*") if p.is_file())


# ---- comparing ------------------------------------------------------------------------------------------
def compare(target: Path, golden: Path, out: Path, log: Path) -> Path:
    """``msprobe compare -tp target -gp golden -o out`` in a child process; returns its CSV."""
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "msprobe.msprobe", "compare", "-tp", str(target), "-gp", str(golden), "-o", str(out)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=COMPARE_TIMEOUT_S, env=env,
                         stdin=subprocess.DEVNULL)
    text = "\n".join(line for line in (res.stdout + res.stderr).splitlines() if CANN_LINE not in line)
    with open(log, "a", encoding="utf-8") as fh:
        fh.write(f"$ msprobe compare -tp {target} -gp {golden} -o {out}\n{text}\n")
    found = sorted(out.glob("compare_result_*.csv"))
    if res.returncode != 0 or not found:
        tail = " ".join(text.split())[-300:]
        raise RuntimeError(f"msprobe compare exited {res.returncode} without a result ({tail})")
    return found[-1]


def _percent(value: str) -> float | None:
    text = str(value).strip().rstrip("%").strip()
    try:
        x = float(text)
    except ValueError:
        return None
    return x if math.isfinite(x) else float("inf")


def _number(value: str) -> float | None:
    try:
        return float(str(value).strip())
    except ValueError:
        return None


def _call_key(name: str) -> str:
    """``Functional.linear.0.forward.input.0`` -> ``Functional.linear.0.forward``; a module row keeps its
    call number (``Module.x.Linear.forward.0``)."""
    head, sep, tail = name.partition(".forward")
    if not sep:
        head, sep, tail = name.partition(".backward")
    if not sep:
        return name
    if head.startswith("Module."):
        index = tail.lstrip(".").split(".", 1)[0]
        return f"{head}{sep}.{index}"
    return head + sep


def _module_name(key: str | None) -> str | None:
    """``Module.model.layers.0.input_layernorm.RMSNorm.forward.0`` -> ``model.layers.0.input_layernorm``."""
    if not key or not key.startswith("Module."):
        return None
    parts = key[len("Module."):].split(".")
    return ".".join(parts[:-3]) if len(parts) > 3 else None


def _op_name(name: str) -> str:
    """``Functional.layer_norm.3.forward.output.0`` -> ``layer_norm`` (the torch function's name)."""
    parts = name.split(".")
    return parts[1].strip("_") if len(parts) > 1 else name


def read_table(csv_path: Path, construct: dict[str, Any], blocks: list[str]) -> list[dict[str, Any]]:
    """msprobe's CSV as rows, tensor rows only (scalar arguments are always equal), in execution order,
    each with the module it ran in and the transformer block (the probe's names) that holds it."""
    ordered = sorted(blocks, key=len, reverse=True)
    rows: list[dict[str, Any]] = []
    with open(csv_path, newline="", encoding="utf-8") as fh:
        for k, r in enumerate(csv.DictReader(fh)):
            if not str(r.get("NPU Dtype", "")).startswith("torch."):
                continue
            name = r.get("NPU Name", "")
            key = _call_key(name)
            module = _module_name(key) or _module_name(construct.get(key))
            block = next((b for b in ordered if module and (module == b or module.startswith(b + "."))), None)
            err = r.get("Err_message", "")
            try:
                messages = [str(m) for m in json.loads(err)] if err.startswith("[") else ([err] if err else [])
            except ValueError:
                messages = [err]
            rows.append({
                "index": k, "name": name, "module": module, "block": block,
                "dtype": r.get("NPU Dtype", ""), "bench_dtype": r.get("Bench Dtype", ""),
                "shape": r.get("NPU Tensor Shape", ""),
                "max_diff": _number(r.get("Max diff", "")), "l2norm_diff": _number(r.get("L2norm diff", "")),
                "max_rel": _percent(r.get("MaxRelativeErr", "")), "norm_rel": _percent(r.get("NormRelativeErr", "")),
                "result": (r.get("Result") or "").strip() or "pass", "messages": messages,
            })
    return rows


def _rank(row: dict[str, Any]) -> tuple[float, float, float]:
    def num(x: float | None) -> float:
        return -1.0 if x is None else x

    return (_SEVERITY.get(row["result"], 0), num(row["norm_rel"]), num(row["max_rel"]))


def _difforge_verdicts(rows: list[dict[str, Any]], rungs: dict[str, Any]) -> None:
    """Beside each row: the step rung's verdict for its block (the localisation's, else step 0's), and the
    operator rung's verdict for its op type."""
    step = rungs.get("step")
    loc = (step.data or {}).get("localisation") if step is not None else None
    by_block = {b["block"]: b for b in (loc or {}).get("blocks", [])} if loc else {}
    first = loc.get("first_divergent") if loc else None
    step0 = str(step.rows[0].verdict) if step is not None and step.rows else None
    op_rung = rungs.get("operator")
    ops: dict[str, str] = {}
    for r in (op_rung.rows if op_rung is not None else []):
        op = r.subject.split("/")[0].split(" ")[0]
        if str(r.verdict) == "FAIL" or op not in ops:
            ops[op] = str(r.verdict)
    for row in rows:
        b = by_block.get(row["block"]) if row["block"] else None
        if b is not None:
            row["difforge_block"] = f"{row['block']}: {b['verdict']}" + (" (first divergent)" if row["block"] == first
                                                                        else "")
        elif step0 is not None:
            row["difforge_block"] = f"step 0: {step0}"
        else:
            row["difforge_block"] = None
        op = _op_name(row["name"]) if not row["name"].startswith("Module.") else None
        row["difforge_op"] = f"{op}: {ops[op]}" if op in ops else None


def summarise(rows: list[dict[str, Any]], rungs: dict[str, Any], top: int = TOP_ROWS) -> dict[str, Any]:
    """Counts, msprobe's first flagged row (execution order) and the worst rows, difforge's verdicts beside."""
    _difforge_verdicts(rows, rungs)
    counts = Counter(r["result"] for r in rows)
    flagged = next((r for r in rows if r["result"] in _SEVERITY), None)
    dtype_mismatch = sum(1 for r in rows if r["dtype"] != r["bench_dtype"])
    worst = sorted(rows, key=_rank, reverse=True)[:top]
    return {"rows_total": len(rows), "counts": dict(counts), "dtype_mismatch": dtype_mismatch,
            "first_flagged": flagged, "worst": worst}


# ---- the view, as validate runs it --------------------------------------------------------------------
def _align_dtypes(pipe_probe: Any, plan: dict[str, dict[str, torch.dtype]]) -> int:
    """Hold each submodule's own parameters and buffers in the dtype the device holds them in; how many moved."""
    moved = 0
    with torch.no_grad():
        for name, root in pipe_probe.modules().items():
            want = plan.get(name, {})
            for sub, module in root.named_modules():
                dtype = want.get(sub)
                if dtype is None:
                    continue
                for t in [*module.parameters(recurse=False), *module.buffers(recurse=False)]:
                    if t.is_floating_point() and t.dtype != dtype:
                        t.data = t.data.to(dtype)
                        moved += 1
    return moved


def _floor_side(climb: Any) -> tuple[Side, dict[str, Any]]:
    """The golden side of the view for the floor validate built (see the module docstring)."""
    from ..devices import dtype_name
    from ..models.probing import LowPrecisionOnFloat32

    lad = climb.lad
    dut_dtype = lad.dut_dtype
    if lad.emulation is not None and lad.floor_pipe is not None:
        # The rungs' float32 floor is done with: free it before loading the device-dtype copy.
        lad._probes.pop(id(lad.floor_pipe), None)
        climb.floor = lad.floor_pipe = lad.emulation = None
        gc.collect()
        pipe, _ = lad.load(lad.ref_backend, dut_dtype)
        probe = lad.probe(pipe)
        plan = {name: module_dtypes(m, dut_dtype) for name, m in lad.probe(climb.dut.pipe).modules().items()}
        moved = _align_dtypes(probe, plan)
        label = (f"emulated {dtype_name(dut_dtype)} on {lad.ref_label} kernels: every {dtype_name(dut_dtype)} call "
                 "computed in float32 and rounded (the operator rung's emulation, over the whole step)")
        info = {"kind": "emulated", "label": label, "aligned_tensors": moved}
        return Side("floor", probe, label, lambda: LowPrecisionOnFloat32(dut_dtype)), info
    ref_pipe = climb.ref.pipe
    if climb.floor is not None and climb.floor is not ref_pipe:
        return Side("floor", lad.probe(climb.floor), lad.floor_label), {"kind": "device", "label": lad.floor_label}
    if ref_pipe is None:
        raise RuntimeError("neither a floor nor the reference is loaded")
    same = climb.floor is ref_pipe
    label = lad.ref_label if same else f"{lad.ref_label} (no floor: msprobe marks every row dtype-inconsistent)"
    return Side("floor", lad.probe(ref_pipe), label), {"kind": "reference" if same else "reference-no-floor",
                                                      "label": label}


def _commands(device: Path, golden: Path) -> list[str]:
    import shlex

    return [f"msprobe compare -tp {shlex.quote(str(device))} -gp {shlex.quote(str(golden))} -o msprobe_compare",
            f"msprobe graph_visualize -tp {shlex.quote(str(device))} -gp {shlex.quote(str(golden))} -o msprobe_graph",
            "pip install tb-graph-ascend && tensorboard --logdir msprobe_graph"]


def view(climb: Any, runs: Any) -> dict[str, Any]:
    """Validate's msprobe stage (``_Climb`` after the gallery): dumps, compare, the table for the report."""
    lad = climb.lad
    root = lad.work / FOLDER
    t_start = time.perf_counter()
    out: dict[str, Any] = {"requested": True, "available": True, "install": INSTALL, "msprobe": version(),
                           "task": TASK, "level": LEVEL, "notes": [CANN_NOTE]}
    try:
        if climb.dut.pipe is None or not runs.step_runs or not runs.step_runs[0][1].inputs:
            raise RuntimeError(runs.error or "the reference run recorded no step to dump")
        cfg, trace = runs.step_runs[0]
        inputs = trace.inputs[0]
        out["unit"] = f"teacher-forced step 0 (seed {cfg.seed}) on the reference's recorded inputs"
        dut_probe = lad.probe(climb.dut.pipe)
        sides = [Side("device", dut_probe, lad.dut_label)]
        if climb.golden is not None:
            golden_info = climb.golden.bundle.manifest.get("msprobe") or {}
            src = climb.golden.bundle.path(golden_info["floor"])
            dst = root / "floor" / "step0"
            shutil.copytree(src, dst)
            out["golden"] = {"kind": golden_info.get("kind"), "label": f"{golden_info.get('label')} (golden bundle)",
                             "calls": _calls(dst), "from_bundle": True}
        else:
            side, out["golden"] = _floor_side(climb)
            sides.append(side)
        dumped = dump(root, sides, cfg, inputs)
        out["device"] = {k: v for k, v in dumped["device"].items() if k != "path"}
        if "floor" in dumped:
            out["golden"].update({k: v for k, v in dumped["floor"].items() if k not in ("path", "label")})
        device_dir, golden_dir = root / "device" / "step0", root / "floor" / "step0"
        t0 = time.perf_counter()
        csv_path = compare(device_dir, golden_dir, root / "compare", root / "msprobe.log")
        out["compare_s"] = time.perf_counter() - t0
        construct = json.loads((_rank_dir(device_dir) / "construct.json").read_text(encoding="utf-8"))
        blocks = [name for name, _ in dut_probe.transformer_blocks()]
        out.update(summarise(read_table(csv_path, construct, blocks), climb.rungs))
        out["csv"] = csv_path.relative_to(lad.work).as_posix()
        out["device_dump"] = device_dir.relative_to(lad.work).as_posix()
        out["golden_dump"] = golden_dir.relative_to(lad.work).as_posix()
        final = Path(lad.out).resolve() / FOLDER  # where the report is published
        out["commands"] = _commands(final / "device" / "step0", final / "floor" / "step0")
        if out["dtype_mismatch"]:
            out["notes"].append(f"{out['dtype_mismatch']} of {out['rows_total']} tensor rows hold another dtype on "
                                "the golden side: msprobe marks them 'dtype inconsistent' whatever their values")
    except Exception as exc:  # the view is lost, not the report
        out["error"] = f"{exc.__class__.__name__}: {' '.join(str(exc).split())[:300]}"
        lad.caveats.append(f"the msprobe view failed ({out['error']})")
    finally:
        if root.is_dir():
            lad.files.extend(files(root))
    out["seconds"] = time.perf_counter() - t_start
    return out


# ---- golden: the floor's dump inside the bundle ------------------------------------------------------------
def golden_dump(lad: Any, folder: Path, cfg: Any, inputs: dict[str, torch.Tensor], emulated: bool, floor_pipe: Any,
                ref_pipe: Any, plan_modules: dict[str, dict[str, torch.dtype]]) -> tuple[dict[str, Any], list[Path]]:
    """``difforge golden --msprobe``: the msprobe view's golden side (as :func:`_floor_side` picks it), dumped into
    ``folder/msprobe/floor/step0``; returns its manifest entry and files."""
    from ..devices import dtype_name
    from ..models.probing import LowPrecisionOnFloat32

    root = folder / FOLDER
    dut_dtype = lad.dut_dtype
    if emulated:
        pipe, _ = lad.load(lad.ref_backend, dut_dtype)
        probe = lad.probe(pipe)
        _align_dtypes(probe, plan_modules)
        label = (f"emulated {dtype_name(dut_dtype)} on {lad.ref_label} kernels: every {dtype_name(dut_dtype)} call "
                 "computed in float32 and rounded (the operator rung's emulation, over the whole step)")
        side, kind = Side("floor", probe, label, lambda: LowPrecisionOnFloat32(dut_dtype)), "emulated"
    elif floor_pipe is not None and floor_pipe is not ref_pipe:
        side, kind = Side("floor", lad.probe(floor_pipe), lad.floor_label), "device"
    else:
        side, kind = Side("floor", lad.probe(ref_pipe), lad.ref_label), "reference"
    dumped = dump(root, [side], cfg, inputs)["floor"]
    (root / "msprobe.log").unlink(missing_ok=True)  # a log of this machine's run, not part of what is compared
    entry = {"floor": f"{FOLDER}/floor/step0", "kind": kind, "label": side.label, "msprobe": version(),
             "task": TASK, "level": LEVEL, "calls": dumped["calls"], "dump_s": dumped["dump_s"]}
    return entry, files(root)


__all__ = ["INSTALL", "available", "dump", "compare", "golden_dump", "how_to", "read_table", "require",
           "summarise", "view"]
