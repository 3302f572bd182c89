"""Report rendering from a hand-built result: self-contained HTML, strict JSON, both languages."""

from __future__ import annotations

import json
import re
from pathlib import Path

from PIL import Image

from difforge.report import fmt, write_report
from difforge.validate.options import ValidationResult
from difforge.validate.verdict import Row, RungResult, Verdict


def _result(out: Path) -> tuple[ValidationResult, list[Path]]:
    img = out / "images" / "contact_sheet.png"
    img.parent.mkdir(parents=True)
    Image.new("RGB", (16, 16), (200, 10, 10)).save(img)
    row = Row("step 0")
    row.add("cosine", 0.9999, ">= 0.999", Verdict.PASS, "aws-nxdi")
    row.add("rel_l2", float("nan"))
    step = RungResult.from_rows("step", [row], "ok", {
        "seeds": [{"seed": 0, "steps": [{"step": 0, "cosine": 0.9999, "rel_l2": 0.01, "max_abs": 0.1}]}],
        "localisation": {"step": 0, "seed": 0, "threshold": 0.999, "first_divergent": "layers.0", "after_blocks": False,
                         "blocks": [{"block": "layers.0", "cosine": 0.5, "rel_l2": 1.0, "max_abs": 3.0,
                                     "floor_rel_l2": 0.01, "divergent": True, "calls": 1}]},
    })
    bench = RungResult("benchmark", Verdict.PASS, "fast", data={"step_times_s": [[0.1, 0.11], [0.1, 0.12]]})
    result = ValidationResult(Verdict.PASS, {"step": step, "benchmark": bench}, out, data={
        "options": {"model": "tiny-ursa"}, "family": "ursa", "device_label": "cpu bfloat16",
        "reference_label": "cpu float32", "environment": {"packages": {"torch": "2.x"}},
        "reproduce": ["difforge validate --model tiny-ursa --out r"], "adaptations": [
            {"what": "rms_norm", "choice": "fused", "exact": False, "detail": "d"}],
        "gallery": {"entries": [{"prompt": "a bear", "device": "contact_sheet.png"}],
                    "contact_sheet": "contact_sheet.png"},
        "notes": ["a note"],
    })
    return result, [img]


def test_write_report_en(tmp_path: Path) -> None:
    result, files = _result(tmp_path)
    paths = write_report(result, tmp_path, lang="en", files=files)
    html = paths["html"].read_text()
    srcs = re.findall(r'src="([^"]+)"', html)
    assert srcs and all(s.startswith("data:image/png;base64,") for s in srcs)  # self-contained
    assert len(srcs) == 4  # step error plot, step time plot, block plot, contact sheet
    data = json.loads(paths["json"].read_text())  # strict JSON: NaN became a string
    assert data["rungs"]["step"]["rows"][0]["measurements"][1]["value"] == "nan"
    md = paths["markdown"].read_text()
    assert r">= 0.999 \[AWS NxDI contrib ports\]" in md and "layers.0" in md and "approximate" in md  # md-escaped
    sums = paths["sha256"].read_text()
    assert "images/contact_sheet.png" in sums and "report.html" in sums
    assert not list(tmp_path.rglob("*.part*"))  # atomic writes left no temp file


def test_write_report_zh(tmp_path: Path) -> None:
    result, files = _result(tmp_path)
    md = write_report(result, tmp_path, lang="zh", files=files)["markdown"].read_text()
    assert "## 1. 各级结论" in md and "## 10. 交付件清单" in md and "近似" in md


def test_fmt() -> None:
    assert fmt(None) == "–" and fmt(True) == "yes" and fmt(0.0) == "0"
    assert fmt(1.23456789) == "1.23" and fmt(1e-7) == "1.00e-07" and fmt(float("inf")) == "inf"
    # rounded to what a value can show: 3 significant digits, a time in seconds, a large count
    assert fmt(0.0438206) == "0.0438" and fmt(27.345) == "27.3" and fmt(12345.6) == "12346" and fmt(3.0) == "3"
    # just below 1 (a cosine, an agreement): digits until the distance from 1 shows, never rounded to 1
    assert fmt(0.999873) == "0.99987" and fmt(0.99999991) == "0.99999991" and fmt(0.9912) == "0.9912"


def test_verdict_reasons_and_missing_floor_are_shown(tmp_path: Path) -> None:
    result, files = _result(tmp_path)
    result.verdict = Verdict.WARN
    result.data["verdict_reasons"] = ["the operator rung was skipped (the reference run recorded no step)"]
    result.rungs["trajectory"] = RungResult("trajectory", Verdict.WARN, "no noise floor",
                                            data={"floor": "none (cpu runs none of float16)", "floor_available": False})
    paths = write_report(result, tmp_path, lang="en", files=files)
    md = paths["markdown"].read_text()
    overview = md.split("## 2.")[0]
    assert "not a plain PASS" in overview and "operator rung was skipped" in overview
    assert "No noise floor (none (cpu runs none of float16))" in md
    assert "operator rung was skipped" in paths["html"].read_text()


def test_pictures_come_first_input_reference_device_difference(tmp_path: Path) -> None:
    from difforge.runtime.images import test_picture
    from difforge.validate.gallery import HEAT_MAX_LEVELS, difference_map, strip

    ref = test_picture(64)
    same = difference_map(ref, ref)
    assert max(same.convert("L").getextrema()) < 10  # identical pictures: a black map
    far = difference_map(Image.new("RGB", (64, 64), (255, 255, 255)), Image.new("RGB", (64, 64), (0, 0, 0)))
    assert min(far.convert("L").getextrema()) > 200 and HEAT_MAX_LEVELS < 255  # saturated: the brightest colour
    with_input = strip(ref, ref, "npu bfloat16", "cpu float32", input_img=ref)
    assert with_input.size[0] == 4 * strip(ref, ref, "d", "r").size[0] // 3
    result, files = _result(tmp_path)
    s_path = tmp_path / "images" / "gallery_0_strip.png"
    with_input.save(s_path)
    result.data["gallery"]["entries"][0]["strip"] = s_path.name
    paths = write_report(result, tmp_path, lang="en", files=[*files, s_path])
    md = paths["markdown"].read_text()
    # pictures under the verdict, then the rung table, then the performance table, details after
    assert md.index("## 1. Device against reference") < md.index("gallery_0_strip.png") < md.index(
        "## 2. Verdict by rung") < md.index("## 3. Performance") < md.index("## 4. Accuracy")
    html = paths["html"].read_text()
    assert html.index('class="strip"') < html.index("<h2>2. Verdict by rung</h2>") < html.index("<h2>3. Performance")


def test_signoff_block_names_the_weights_inputs_and_a_local_reproduce(tmp_path: Path) -> None:
    result, files = _result(tmp_path)
    result.data["signoff"] = {"model": "m_*x*", "folder": "/models/m_*x*", "weights": {"vae/w.safetensors": "ab" * 32},
                              "inputs": ["images/input_0.png"],
                              "reproduce_here": "difforge validate --image images/input_0.png --out ../r_1-again"}
    paths = write_report(result, tmp_path, lang="en", files=files)
    md = paths["markdown"].read_text()
    assert "## 9. Sign-off" in md and "ab" * 32 in md and "| Reviewer | Date | Subjective evaluation |" in md
    assert "difforge validate --image images/input_0.png --out ../r_1-again" in md  # verbatim inside its fence
    assert r"m\_\*x\*" in md or r"m_\*x\*" in md  # a user's name is escaped in prose
    zh = write_report(result, tmp_path, lang="zh", files=files)["markdown"].read_text()
    assert "主观评价" in zh and "评审人" in zh


def _speed(result) -> None:  # type: ignore[no-untyped-def]
    from difforge.validate.verdict import RungResult, Verdict

    rows = [{"kind": "baseline", "name": "--disable a,b", "validated": False, "s_per_it": 0.5, "it_per_s": 2.0,
             "end_to_end_s": 2.2, "memory_after_load_bytes": 3 * 2**30, "peak_bytes": 5 * 2**30,
             "memory_kind": "device", "speedup_step": 1.0, "speedup_end_to_end": 1.0, "rounds": 3, "warmup": 1,
             "spread": 1.1, "unsteady": False},
            {"kind": "exact", "name": "defaults", "validated": True, "s_per_it": 0.25, "it_per_s": 4.0,
             "end_to_end_s": 1.1, "memory_after_load_bytes": 3 * 2**30, "peak_bytes": 4 * 2**30,
             "memory_kind": "device", "speedup_step": 2.0, "speedup_end_to_end": 2.0, "rounds": 3, "warmup": 1,
             "spread": 1.0, "unsteady": False},
            {"kind": "approximate", "name": "--fast taylorseer", "validated": False, "error": "out of memory"}]
    header = {"device": "Ascend 910B3", "dtype": "bfloat16", "height": 1024, "width": 1024, "steps": 20, "batch": 1,
              "rounds": 3, "warmup": 1, "variant_rounds": 3, "variant_warmup": 1}
    result.rungs["benchmark"] = RungResult("benchmark", Verdict.PASS, "fast",
                                           data={"step_times_s": [[0.1]], "speed": {"header": header, "rows": rows}})


def test_performance_table_is_the_modelzoo_shape(tmp_path: Path) -> None:
    result, files = _result(tmp_path)
    _speed(result)
    paths = write_report(result, tmp_path, lang="en", files=files)
    md = paths["markdown"].read_text()
    assert "Ascend 910B3, 1024×1024, 20 steps, batch 1, bfloat16" in md
    assert "| Configuration | Options | s/it | it/s | End to end (s) | Speed-up | Memory after load | Peak memory |" in md
    assert "| baseline | `--disable a,b` | 0.5 | 2 | 2.2 | 1.00× | 3.00 GiB | 5.00 GiB |" in md
    # every row states how it was measured and what judged its accuracy
    assert ("| exact optimisations | `defaults` | 0.25 | 4 | 1.1 | 2.00× | 3.00 GiB | 4.00 GiB | 3 after 1 warm-up; "
            "spread 1.0× | judged by this report: PASS | ✓ |") in md
    assert "| 3 after 1 warm-up; spread 1.1× | exact optimisations: not judged separately by this report |  |" in md
    assert "did not run: out of memory" in md
    html = paths["html"].read_text()
    assert html.index("2. Performance") < html.index("2.00×") < html.index("3. Accuracy")
    zh = write_report(result, tmp_path, lang="zh", files=files)["markdown"].read_text()
    assert "| 基线 | `--disable a,b` |" in zh and "| 等价优化 | `默认` |" in zh and "| 近似优化 | `--fast taylorseer` |" in zh
    assert "加速比" in zh and "加载后内存" in zh and "峰值内存" in zh


def test_a_wide_rung_table_becomes_a_wrapped_list_with_a_threshold_legend(tmp_path: Path) -> None:
    from difforge.report.render import WIDE_COLUMNS

    result, files = _result(tmp_path)
    row = Row("seed 0")
    for i in range(WIDE_COLUMNS + 1):
        row.add(f"metric_{i}", 0.5 + i, "<= 9" if i == 0 else "", Verdict.PASS if i == 0 else None)
    result.rungs["trajectory"] = RungResult.from_rows("trajectory", [row], "ok", {})
    html = write_report(result, tmp_path, lang="en", files=files)["html"].read_text()
    section = html[html.index("Trajectory</h3>"):]
    assert '<table class="wide">' in section[:2000] and "<b>metric 0</b> 0.5 ✓" in section
    assert "<b>metric 0</b> &lt;= 9" in section  # the threshold as a legend under the table


def _ranks(mode: str) -> dict:
    """A --parallel device-under-test record's ``extra.parallel`` as runtime/parallel.py writes it."""
    def run(steps: list[float], load: float, denoise: float, peak: int | None) -> dict:
        return {"phases_s": {"load": load, "encode": 0.01, "denoise": denoise, "decode": 0.2},
                "peak_device_bytes": peak, "step_times_s": steps}

    base = {"mode": mode, "world_size": 2, "dist_backend": "hccl", "local_rank": 0}
    if mode == "cfg":
        ranks = [{**base, "rank": 0, "host": "node-a", "device": "npu:0", **run([0.04, 0.05, 0.06], 1.5, 0.15, 3 * 2**30)},
                 {**base, "rank": 1, "local_rank": 1, "host": "node-a", "device": "npu:1",
                  **run([0.03, 0.035, 0.2], 1.25, 0.27, 2**30)}]
    else:
        ranks = [{**base, "rank": 0, "host": "node-a", "device": "npu:0", "wall_s": 9.5,
                  "runs": [run([0.1, 0.3], 2.0, 0.4, None), run([0.2, 0.5], 0.0, 0.7, 2**29)]},
                 {**base, "rank": 1, "host": "node-b", "device": "npu:0", "wall_s": 8.25, "runs": []}]
    return {"mode": mode, "world_size": 2, "dist_backend": "hccl", "ranks": ranks}


def test_per_rank_timings_table(tmp_path: Path) -> None:
    """A --parallel device-under-test record gets one row per rank in the performance section (md and html)."""
    from tests.report.zh_check import english_left, visible_html

    result, files = _result(tmp_path)
    result.data["dut_record"] = {"extra": {"parallel": _ranks("cfg")}}
    paths = write_report(result, tmp_path, lang="en", files=files)
    md, html = paths["markdown"].read_text(), paths["html"].read_text()
    assert "The device under test ran as 2 ranks (--parallel cfg, hccl process group)" in md
    assert "| Rank | Host | Device | Runs | Steps | Median step (ms) | Load (s) | Denoise (s) | Wall (s) | Peak memory |" in md
    assert "| 0 | node-a | npu:0 | 1 | 3 | 50 | 1.5 | 0.15 | 1.86 | 3.00 GiB |" in md
    assert "| 1 | node-a | npu:1 | 1 | 3 | 35 | 1.25 | 0.27 | 1.73 | 1.00 GiB |" in md
    section = html[html.index("Per-rank timings</h3>"):html.index("Per-phase detail</h3>")]
    assert section.count("<tr>") == 3 and '<td class="num">35</td>' in section and "<td>npu:1</td>" in section
    assert html.index("2. Performance") < html.index("Per-rank timings") < html.index("3. Accuracy")

    result.data["dut_record"] = {"extra": {"parallel": _ranks("data")}}
    md = write_report(result, tmp_path, lang="en", files=files)["markdown"].read_text()
    assert "| 0 | node-a | npu:0 | 2 | 4 | 300 | 2 | 1.1 | 9.5 | 512 MiB |" in md  # two runs: steps pooled, phases summed
    assert "| 1 | node-b | npu:0 | 0 | 0 | – | 0 | 0 | 8.25 | – |" in md  # a rank whose shard was empty

    zh = write_report(result, tmp_path, lang="zh", files=files)
    zh_html, zh_md = zh["html"].read_text(), zh["markdown"].read_text()
    assert "各 rank 耗时" in zh_html and "被测设备以 2 个 rank 运行（--parallel data，hccl 进程组）" in zh_md
    assert "| rank | 主机 | 设备 | 运行次数 | 步数 | 单步中位耗时 (ms) | 加载耗时 (s) | 去噪耗时 (s) | 总耗时 (s) | 峰值内存 |" in zh_md
    visible = visible_html(zh_html)
    section = visible[visible.index("各 rank 耗时"):visible.index("各阶段明细")]
    assert english_left(section) == []

    for record in ({"extra": {"parallel": {"mode": "data", "rank": 1}}}, {"extra": {}}, None):  # a per-image record
        result.data["dut_record"] = record
        html = write_report(result, tmp_path, lang="en", files=files)["html"].read_text()
        assert "Per-rank timings" not in html


def test_speed_rows_state_rounds_and_accuracy_and_flag_an_unsteady_row(tmp_path: Path) -> None:
    """Issue 28.3: the resolved size (never None×None), each row's rounds and warm-up, an approximate row's
    missing accuracy evidence said beside it, and a > 2× spread between rounds flagged."""
    from difforge.runtime.record import PhaseStat, RunRecord
    from difforge.validate.bench import SPREAD_FLAG, speed_row, speed_table

    def rec(step_s: float) -> RunRecord:
        r = RunRecord(kind="generate")
        r.step_times_s = [step_s] * 4
        r.phases = {"denoise": PhaseStat("denoise", step_s * 4, None, 2**30)}
        return r

    steady = speed_row("exact", "defaults", [rec(0.1), rec(0.11)], None, True, warmup=1)
    wobbly = speed_row("approximate", "--fast taylorseer", [rec(0.1), rec(0.5)], None, False, warmup=1)
    assert steady["rounds"] == 2 and steady["warmup"] == 1 and not steady["unsteady"]
    assert wobbly["spread"] > SPREAD_FLAG and wobbly["unsteady"]
    result, files = _result(tmp_path)
    header = {"device": "cpu", "dtype": "bfloat16", "height": None, "width": None, "steps": 4, "batch": 1,
              "rounds": 2, "warmup": 1}
    result.rungs["benchmark"] = RungResult("benchmark", Verdict.PASS, "fast", data={
        "step_times_s": [[0.1]], "speed": {"header": header, "rows": speed_table([steady, wobbly])}})
    paths = write_report(result, tmp_path, lang="en", files=files)
    md, html = paths["markdown"].read_text(), paths["html"].read_text()
    assert "None×None" not in md and "cpu, the model's default size, 4 steps" in md
    assert "none measured (timed only): validate with --fast taylorseer to judge it" in md
    assert "spread 5.0× (over 2×: unsteady)" in md and "its median is not a steady figure" in md
    assert html.count("2 after 1 warm-up") == 2 and 'class="rounds v WARN"' in html
    zh = write_report(result, tmp_path, lang="zh", files=files)["markdown"].read_text()
    assert "预热 1 轮后 2 轮" in zh and "仅计时，未验证精度：需用 --fast taylorseer 另行验证" in zh


def _quick_strip(tmp_path: Path, lowered: bool, semantic: bool = True):  # type: ignore[no-untyped-def]
    from difforge.validate.gallery import picture_steps

    result, files = _result(tmp_path)
    s_path = tmp_path / "images" / "gallery_0_strip.png"
    Image.new("RGB", (48, 16), (10, 200, 10)).save(s_path)
    result.data["gallery"]["entries"][0]["strip"] = s_path.name
    result.data["gallery"].update(picture_steps(4, 25, lowered))
    if semantic:
        result.rungs["semantic"] = RungResult("semantic", Verdict.PASS, "ok", data={"contact_sheet": "sem.png"})
    return result, [*files, s_path]


def test_a_quick_picture_says_beside_it_that_it_was_made_with_fewer_steps(tmp_path: Path) -> None:
    """Issue 28.1: a --quick picture (4 of the model's 25 steps) never stands without saying so beside it,
    and points to the default-step pictures (the semantic rung's sheet)."""
    from html.parser import HTMLParser

    result, files = _quick_strip(tmp_path, lowered=True)
    paths = write_report(result, tmp_path, lang="en", files=files)
    html = paths["html"].read_text()

    class Figures(HTMLParser):
        """The text of each <figure> that holds the strip picture."""

        def __init__(self) -> None:
            super().__init__()
            self.depth, self.text, self.found = 0, "", []

        def handle_starttag(self, tag: str, attrs: list) -> None:  # type: ignore[override]
            if tag == "figure" and ("class", "strip") in attrs:
                self.depth, self.text = 1, ""

        def handle_endtag(self, tag: str) -> None:
            if tag == "figure" and self.depth:
                self.found.append(self.text)
                self.depth = 0

        def handle_data(self, data: str) -> None:
            if self.depth:
                self.text += data

    parser = Figures()
    parser.feed(html)
    assert parser.found, "no strip figure"
    for caption in parser.found:  # the note is inside the picture's own figure, not in a later section
        assert "Made with 4 denoising steps (--quick); the model draws with 25" in caption, caption
        assert "4.5 Semantic" in caption
    assert html.index("Made with 4 denoising steps") < html.index("<h2>2. Verdict by rung</h2>")
    md = paths["markdown"].read_text()
    assert md.index("gallery_0_strip.png") < md.index("Made with 4 denoising steps") < md.index("## 2. Verdict")
    zh = write_report(result, tmp_path, lang="zh", files=files)["html"].read_text()
    assert "此图仅用 4 步去噪（--quick），模型默认为 25 步" in zh
    # made at the default steps: nothing is said
    result, files = _quick_strip(tmp_path / "d", lowered=False)
    assert "denoising steps" not in write_report(result, tmp_path / "d", lang="en", files=files)["html"].read_text()
