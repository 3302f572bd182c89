"""Today's rules, replayed on what a real accelerator measured: the H200 run of 2026-12-04.

``tests/fixtures/h200-2026-12-04/validate-shapes-ursa-cuda.json`` is the report.json of a clean bf16
port of shapes-ursa validated on an NVIDIA H200 (commit c89ec28; see the folder's README).  Its rules
then FAILed the operator rung on ``conv2d`` and ``group_norm``.  Here every rung's recorded values go
through that rung's own judge function of today (no tensors, no model): each rung and the overall
verdict must PASS.  The same rows carrying a planted fault's numbers must FAIL, so this test can fail.

Values the old report does not hold are derived from what it holds:

* elements compared: from the row's shape and what the tracer kept (its note), capped at the 64 Ki
  output elements a traced call compares (``tracing.Caps.outputs``); a probe case compares its whole
  output (the first input's shape);
* the floor's max rel and small-value errors: the device's divided by the recorded ratio (an ``inf``
  ratio: a floor of 0) - except on the two op types whose floor model changed since that commit
  (``tracing.FLOOR_RUNS``: a convolution is rounded before its bias, a group norm's statistics are
  rounded).  There the recorded floor is not today's, so :data:`TODAY_FLOOR` holds today's floor on the
  same calls, as lower bounds ``tests/validate/test_operators.py`` checks by replaying them (the conv's
  input is the quantised latent, the same on every device: reproduced exactly; the group norm's is the
  CPU's activation at the same layer);
* the rel-L2s: only their ratio is recorded.  The floor's is set to the RMSE allowance and the device's
  to ratio x that, which reproduces the recorded ratio; today's rule raises the floor to the allowance,
  so with the true (unrecorded) values its ratio can only be lower - the replay is conservative;
* the share of errors above 0.01 %, which only a float32 op reads: no row ran in float32;
* the step rung's floor rel-L2: the device's over the recorded ratio.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from difforge.devices import DTYPES
from difforge.validate.components import judge_floor
from difforge.validate.operators import decide
from difforge.validate.semantic import judge_lost
from difforge.validate.steps import judge_step, token_disagreement_ratio
from difforge.validate.thresholds import FLOOR_MIN_RMSE_LEVELS, op_allowance
from difforge.validate.tracing import CAPS
from difforge.validate.trajectory import judge_ratio
from difforge.validate.verdict import Row, RungResult, Verdict, overall

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "h200-2026-12-04" / "validate-shapes-ursa-cuda.json"
REPORT: dict[str, Any] = json.loads(FIXTURE.read_text())
RUNGS: dict[str, Any] = REPORT["rungs"]


#: Today's floor on the calls whose floor model changed (lower bounds; see the module docstring).
TODAY_FLOOR: dict[str, dict[str, float]] = {
    "conv2d": {"max_rel": 0.085, "small_value_errors": 40},  # replayed: 0.0909 and 44 (the H200: 0.0909, 44)
    "group_norm": {"max_rel": 0.4, "small_value_errors": 100},  # replayed on the CPU's input: 0.79 and 183
}


def _values(row: dict[str, Any]) -> dict[str, Any]:
    return {m["name"]: m["value"] for m in row["measurements"]}


def _num(v: Any) -> float:
    return float(v)  # report.json writes infinities as the string 'inf'


def _prod(dims: str) -> int:
    return math.prod(int(d) for d in dims.split("x"))


def _elements(row: dict[str, Any]) -> int:
    """How many output elements the row compared (derived: see the module docstring)."""
    v = _values(row)
    shape, note = v["shape"], row["note"]
    if "worst of" not in note:  # a probe case: its whole output, the first input's shape
        return _prod(shape.split(",")[0].strip())
    kept = note.split("; kept ", 1)[1]
    patterns = [
        (r"(\d+) of \d+ rows x (\d+) of \d+ outputs", lambda g: g[0] * g[1]),  # linear
        (r"(\d+) of \d+ matrices, (\d+) of \d+ rows x (\d+) of \d+ columns", lambda g: g[0] * g[1] * g[2]),
        (r"sample 0, (\d+) of \d+ channels, window ([\dx]+) of", lambda g: g[0] * _prod(g[1])),  # conv
        (r"(\d+) of \d+ \(sample, group\) blocks of (\d+)", lambda g: g[0] * g[1]),  # group norm
        (r"(\d+) of \d+ elements", lambda g: g[0]),  # pointwise
        (r"(\d+) of \d+ rows of (\d+)", lambda g: g[0] * g[1]),  # softmax, normalize
        (r"(\d+) of \d+ heads x (\d+) of \d+ queries", lambda g: g[0] * g[1] * int(shape.split("x")[-1])),
        (r"(\d+) of \d+ ids", lambda g: g[0] * int(shape.split("x")[-1])),  # embedding: ids x width
        (r"(\d+) of \d+ \(sample, channel\) planes", lambda g: g[0]),  # interpolate: a lower bound
    ]
    for pattern, count in patterns:
        hit = re.search(pattern, kept)
        if hit:
            groups = [g if "x" in g else int(g) for g in hit.groups()]
            return min(int(count(groups)), CAPS.outputs)
    raise AssertionError(f"cannot derive the elements of {row['subject']}: {kept}")


def _dtype(row: dict[str, Any]) -> torch.dtype:
    v = _values(row)
    return DTYPES[v["dtype"]] if "dtype" in v else DTYPES[REPORT["dut_record"]["config"]["dtype"]]


def operator_values(row: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None, torch.dtype]:
    """The device's and the floor's values ``operators.decide`` reads, from an old report row."""
    v = _values(row)
    dtype = _dtype(row)
    assert dtype != torch.float32  # the one value not derivable (share > 0.01 %) is read by float32 ops only
    n = _elements(row)
    m = {"nonfinite_dut": 1 if v["NaN/Inf only on device"] else 0, "nonfinite_ref": 0, "cosine": v["cosine"],
         "max_abs": v["max_abs_err"], "rel_gt_0.1%": v["share rel err > 0.1%"], "rel_gt_1%": v["share rel err > 1%"],
         "rel_gt_0.01%": v["share rel err > 0.1%"], "max_rel": v["max_rel_err"],
         "small_value_errors": v["small-value errors"], "elements": n}
    if "rmse / floor" not in v:  # decided before the ratio rule: no floor values were needed or recorded
        m["rel_l2"] = 0.0
        return m, None, dtype
    allow = op_allowance(dtype)
    rmse, rel, small = (_num(v[k]) for k in ("rmse / floor", "max_rel / floor", "small errors / floor"))
    m["rel_l2"] = rmse * allow.rmse
    fl = {"rel_l2": allow.rmse, "max_rel": m["max_rel"] / rel if math.isfinite(rel) and rel > 0 else 0.0,
          "small_value_errors": m["small_value_errors"] / small if math.isfinite(small) and small > 0 else 0,
          "elements": n}
    fl.update(TODAY_FLOOR.get(row["subject"], {}))
    return m, fl, dtype


def replay_operator(row: dict[str, Any], **planted: Any) -> Verdict:
    m, fl, dtype = operator_values(row)
    m.update(planted)
    if "rmse_ratio" in planted:
        m.pop("rmse_ratio")
        m["rel_l2"] = planted["rmse_ratio"] * (fl["rel_l2"] if fl else op_allowance(dtype).rmse)
    return decide(m, fl, dtype).verdict


def replay_component(row: dict[str, Any], **planted: Any) -> Verdict:
    v = {**_values(row), **planted}
    return judge_floor(v["cosine"], v["rel_l2"], v["floor rel_l2"])[0]


def replay_step(row: dict[str, Any], **planted: Any) -> Verdict:
    v = {**_values(row), **planted}
    floor_rel = _values(row)["logits rel_l2"] / _values(row)["rel_l2 / floor"]
    return judge_step(v["logits cosine"], v["logits rel_l2"], v["floor cosine"], floor_rel)


def replay_trajectory(row: dict[str, Any], **planted: Any) -> Verdict:
    v = {**_values(row), **planted}
    if "rmse_levels" in v:
        return judge_ratio(v["rmse_levels"] / max(v["floor_rmse_levels"], FLOOR_MIN_RMSE_LEVELS))
    # final tokens (64x64 shapes-ursa: a 16x16 token grid).  Today a free run's final tokens are only reported
    # (the trajectory judges tokens step by step along the device's path, which this report predates); they
    # go through the same token rule here, which is stricter than reporting them
    n = 256
    return judge_ratio(token_disagreement_ratio(1 - v["token_agreement"], 1 - v["floor token_agreement"], n))


def replay_semantic(data: dict[str, Any], **planted: Any) -> Verdict:
    d = {**data, **planted}
    return judge_lost(d["n"], d["reference_correct"], d["device_lost"], d["floor_lost"])[0]


REPLAY = {"operator": replay_operator, "component": replay_component, "step": replay_step,
          "trajectory": replay_trajectory}


def _replayed_rung(key: str) -> RungResult:
    rung = RUNGS[key]
    if key == "semantic":
        verdict = replay_semantic(rung["data"])
        return RungResult(key, verdict, rung["summary"], [], {"warn_band": None})
    if key not in REPLAY:  # smoke, determinism, benchmark: rules unchanged, recorded verdicts stand
        return RungResult(key, Verdict(rung["verdict"]), rung["summary"])
    rows = []
    for r in rung["rows"]:
        row = Row(r["subject"], note=r["note"])
        row.verdict = REPLAY[key](r)
        rows.append(row)
    return RungResult(key, max((r.verdict for r in rows), key=["PASS", "WARN", "FAIL"].index), rung["summary"], rows)


def test_the_fixture_is_the_h200_run_that_failed_a_clean_port() -> None:
    assert REPORT["verdict"] == "FAIL" and REPORT["device_label"] == "cuda bfloat16"
    failing = {r["subject"] for r in RUNGS["operator"]["rows"] if r["verdict"] == "FAIL"}
    assert failing == {"conv2d", "group_norm"}
    assert {k for k, r in RUNGS.items() if r["verdict"] != "PASS"} == {"operator"}


@pytest.mark.parametrize("key", ["operator", "component", "step", "trajectory"])
def test_every_recorded_row_passes_today(key: str) -> None:
    for row in RUNGS[key]["rows"]:
        assert REPLAY[key](row) is Verdict.PASS, (key, row["subject"])


def test_the_two_rows_that_failed_pass_against_todays_floor() -> None:
    rows = {r["subject"]: r for r in RUNGS["operator"]["rows"]}
    conv_m, conv_f, dt = operator_values(rows["conv2d"])
    assert conv_m["elements"] == 8192 and conv_f is not None
    d = decide(conv_m, conv_f, dt)
    assert d.verdict is Verdict.PASS
    assert d.ratios["max_rel / floor"] < 1.1 and d.ratios["small errors / floor"] < 1.2
    gn_m, gn_f, dt = operator_values(rows["group_norm"])
    assert gn_m["elements"] == CAPS.outputs  # 16 blocks of 8192, capped at 64 Ki
    d = decide(gn_m, gn_f, dt)
    assert d.verdict is Verdict.PASS and d.ratios["max_rel / floor"] < 3
    # against the recorded (old, one-rounding) floor they still fail: the allowances alone do not carry them
    for row in (rows["conv2d"], rows["group_norm"]):
        m, fl, dt = operator_values(row)
        v = _values(row)
        old = {**fl, "max_rel": m["max_rel"] / _num(v["max_rel / floor"]), "small_value_errors": 0}
        assert decide(m, old, dt).verdict is Verdict.FAIL


def test_the_semantic_counts_pass_today() -> None:
    assert replay_semantic(RUNGS["semantic"]["data"]) is Verdict.PASS


def test_the_whole_replay_passes() -> None:
    rungs = {key: _replayed_rung(key) for key in RUNGS}
    verdict, reasons = overall(rungs)
    assert {k: str(r.verdict) for k, r in rungs.items()} == dict.fromkeys(RUNGS, "PASS")
    assert verdict is Verdict.PASS and reasons == []


# ---- the same rows with a planted fault's numbers must FAIL -----------------------------------------------
def _row(key: str, subject: str) -> dict[str, Any]:
    return next(r for r in RUNGS[key]["rows"] if r["subject"] == subject)


@pytest.mark.parametrize(("subject", "planted"), [
    ("conv2d", {"rmse_ratio": 3.5}),  # a dropped bias or an offset: RMSE 3.5x the floor's
    ("conv2d", {"small_value_errors": int(0.3 * 8192)}),  # 30 % of the elements wrong near zero
    ("conv2d", {"max_rel": 2.0}),  # a sign flip somewhere in the normal-value domain
    ("group_norm", {"max_rel": 5.0}),  # today's floor itself reaches 0.4-0.8 on this call
    ("group_norm", {"cosine": 0.98}),
    ("silu", {"rmse_ratio": 3.5, "rel_gt_1%": 0.05}),  # a slope error: RMSE and the dual-100 share
    ("linear", {"nonfinite_dut": 3}),
])
def test_an_operator_row_with_a_faults_numbers_fails(subject: str, planted: dict[str, Any]) -> None:
    assert replay_operator(_row("operator", subject), **planted) is Verdict.FAIL


def test_a_zero_floor_leaves_the_operator_rule_finite_and_able_to_fail() -> None:
    """A floor whose error is exactly 0 (an exactly representable output) is raised to one rounding: a
    correctly rounded kernel PASSes, a real error still FAILs - msprobe would put 10000 there either way."""
    m, fl, dt = operator_values(_row("operator", "silu"))
    assert fl is not None
    zero = {"rel_l2": 0.0, "max_rel": 0.0, "small_value_errors": 0, "elements": fl["elements"]}
    d = decide(m, zero, dt)
    assert d.verdict is Verdict.PASS and all(math.isfinite(r) for r in d.ratios.values())
    assert decide({**m, "rel_l2": 0.02, "rel_gt_1%": 0.05}, zero, dt).verdict is Verdict.FAIL
    assert decide({**m, "small_value_errors": 30}, zero, dt).verdict is not Verdict.PASS  # 0.18 % of 16384


def test_component_step_trajectory_and_semantic_rows_with_a_faults_numbers_fail() -> None:
    comp = _row("component", "transformer")
    floor_rel = _values(comp)["floor rel_l2"]
    assert replay_component(comp, rel_l2=3.5 * floor_rel) is Verdict.FAIL
    assert replay_component(comp, cosine=0.98) is Verdict.FAIL
    step = _row("step", "step 3")
    assert replay_step(step, **{"logits rel_l2": 3.5 * _values(step)["logits rel_l2"]}) is Verdict.FAIL
    image = _row("trajectory", "image 0")
    assert replay_trajectory(image, rmse_levels=3.5 * _values(image)["floor_rmse_levels"]) is Verdict.FAIL
    tokens = _row("trajectory", "final tokens")
    assert replay_trajectory(tokens, token_agreement=0.5) is Verdict.FAIL
    assert replay_semantic(RUNGS["semantic"]["data"], device_lost=4) is Verdict.FAIL


def test_a_rung_in_the_warn_band_fails_the_sign_off_unless_accepted() -> None:
    rungs = {key: _replayed_rung(key) for key in RUNGS}
    comp = _row("component", "transformer")
    row = Row("transformer")
    row.add("rel_l2 / floor", 2.55 * 1.0)
    row.verdict = replay_component(comp, rel_l2=2.55 * _values(comp)["floor rel_l2"])
    assert row.verdict is Verdict.WARN
    rungs["component"] = RungResult("component", Verdict.WARN, "", [row])
    verdict, reasons = overall(rungs)
    assert verdict is Verdict.FAIL and "component" in reasons[0] and "2.55" in reasons[0]
    verdict, reasons = overall(rungs, accepted={"component": "known bf16 softmax in the text encoder"})
    assert verdict is Verdict.WARN and "known bf16 softmax" in reasons[0]


def test_an_operator_warn_of_the_ratio_rule_fails_the_sign_off() -> None:
    """A dual-1000 miss the ratio rule cannot explain stays WARN (msprobe's tree): in the WARN band, so the
    sign-off fails on it unless the user accepts it."""
    silu = _row("operator", "silu")
    assert replay_operator(silu, rmse_ratio=3.5) is Verdict.WARN
    row = Row("silu")
    row.add("rmse / floor", 3.5)
    row.verdict = Verdict.WARN
    rungs = {key: _replayed_rung(key) for key in RUNGS}
    rungs["operator"] = RungResult("operator", Verdict.WARN, "", [row])
    verdict, reasons = overall(rungs)
    assert verdict is Verdict.FAIL and "operator" in reasons[0] and "silu" in reasons[0]
