"""Report prose in English and Chinese (``--lang``); numbers and identifiers stay as they are."""

from __future__ import annotations

TEXT: dict[str, dict[str, str]] = {
    "en": {
        "title": "{model} on {device}: port validation report",
        "semantic": "Semantic: prompts drawn correctly",
        "semantic_text": ("Each prompt of a set with expected attributes (shape, colour, background ...) on the device, "
                          "the reference and the floor; a rule-based checker (colour segmentation and image moments, no "
                          "learned weights) scores every picture. The device may lose (get wrong where the reference "
                          "is right) at most what the floor loses plus 10 % of the prompts (at least one) to PASS, "
                          "twice that to WARN."),
        "semantic_sheet": "The device's pictures of the prompt set",
        "scan": "Porting hazards in the model's source",
        "scan_text": ("difforge scan read {files} Python files of {root} for {device} (statically, nothing was run) in "
                      "{seconds} s: {errors} errors, {warnings} warnings, {infos} notes. The rule texts are "
                      "docs/scan.md's."),
        "scan_where": "Where", "scan_rule": "Rule", "scan_severity": "Severity", "scan_message": "Why",
        "scan_fix": "Fix", "scan_none": "nothing found",
        "subject": "Subject", "measurements": "Measurements", "yes": "yes", "no": "no", "divergent": "diverges",
        "contact_sheet": "contact sheet", "device_link": "device", "pair_link": "reference | device",
        "see_sums": "see SHA256SUMS",
        "env_dut": "device under test", "env_memory": "device memory", "env_ref": "reference device",
        "env_driver": "driver / CANN", "env_commit": "difforge commit", "env_platform": "platform",
        "env_threads": "CPU threads", "env_threads_value": "{cores} cores, torch uses {threads}",
        "env_count": "count", "env_vars": "environment variables set", "env_presets": "presets applied",
        "env_config_hash": "config hash (sha256)",
        "perf_table_text": ("{device}, {size}, {steps} steps, batch {batch}, {dtype}. Every row is measured the same "
                            "way: medians of its timed rounds after its warm-up (the Rounds column). Speed-up is end "
                            "to end against the baseline row; the row marked ✓ is the configuration this report "
                            "validates; the Accuracy column says what judged each row's accuracy."),
        "perf_default_size": "the model's default size",
        "perf_rounds": "Rounds", "perf_rounds_cell": "{rounds} after {warmup} warm-up",
        "perf_spread": "spread {spread}×", "perf_spread_flag": "spread {spread}× (over 2×: unsteady)",
        "perf_accuracy": "Accuracy", "perf_acc_validated": "judged by this report: {verdict}",
        "perf_acc_none": "none measured (timed only): validate with {name} to judge it",
        "perf_acc_exact": "exact optimisations: not judged separately by this report",
        "perf_acc_identical": "exact on this device: with {names} off the picture is bitwise the same (off-identity)",
        "perf_acc_differs": "approximate on this device: {names} change the picture against their off state "
                            "(off-identity; see the notes)",
        "perf_unsteady": ("A row's slowest round took more than 2× its fastest: its median is not a steady figure; "
                          "time it again on an idle machine before comparing it."),
        "pictures_steps": ("Made with {steps} denoising steps (--quick); the model draws with {default}: a half-formed "
                           "picture here comes from the steps, not from the port."),
        "pictures_steps_semantic": "Pictures made at the default steps: {section}.",
        "perf_config": "Configuration", "perf_options": "Options", "perf_s_it": "s/it", "perf_it_s": "it/s",
        "perf_e2e": "End to end (s)", "perf_speedup": "Speed-up", "perf_mem_load": "Memory after load",
        "perf_mem_peak": "Peak memory", "perf_validated": "Validated",
        "perf_baseline": "baseline", "perf_exact": "exact optimisations", "perf_validated_row": "as validated",
        "perf_approximate": "approximate optimisation", "perf_failed": "did not run: {error}",
        "perf_no_table": "Only the validated options were timed (--no-speed-table).",
        "perf_host": "host RSS", "perf_defaults": "defaults",
        "perf_details": "Per-phase detail",
        "ranks": "Per-rank timings",
        "ranks_text": ("The device under test ran as {world} ranks (--parallel {mode}, {backend} process group); "
                       "each rank's own timings, from its run record:"),
        "rank": "Rank", "rank_host": "Host", "rank_device": "Device", "rank_runs": "Runs", "rank_steps": "Steps",
        "rank_step_ms": "Median step (ms)", "rank_load": "Load (s)", "rank_denoise": "Denoise (s)",
        "rank_wall": "Wall (s)",

        "verdict": "Verdict",
        "overview": "Verdict by rung",
        "overview_text": ("{model} ({family}) was run on the device under test ({device}) and compared with the "
                          "reference ({reference}) rung by rung. Overall verdict: **{verdict}**."),
        "rung": "Rung", "summary": "Finding", "seconds": "Time (s)",
        "environment": "Environment",
        "component": "Component", "version": "Version", "item": "Item", "value": "Value",
        "configuration": "Configuration",
        "config_text": ("The options this validation ran with. Every side: the device under test, the reference and "
                        "the floor all run them (the same weights, guidance, prompts and size), so the comparison "
                        "measures the port. Device under test only: how the device runs (speed, memory); the "
                        "reference and the floor run the plain path."),
        "option": "Option", "applies_to": "Applies to", "every_side": "every side",
        "device_only": "device under test only", "default": "default",
        "quick_reductions": "--quick lowered these (a fast sanity pass: the values given were not validated):",
        "reproduce": "How to reproduce",
        "reproduce_text": "Install difforge, set the recommended environment variables, then run:",
        "adaptations": "Adaptations applied",
        "adaptations_text": ("Every device-specific substitution chosen at load time. *Exact* means bit-identical "
                             "to the portable path; *approximate* may change results."),
        "what": "What", "choice": "Choice", "kind": "Kind", "detail": "Detail",
        "exact": "exact", "approximate": "approximate", "none": "none",
        "smoke": "Smoke test",
        "smoke_text": "One cold run: every phase must complete and the output must be finite and not blank.",
        "determinism": "Determinism",
        "performance": "Performance",
        "perf_text": ("Warm-up rounds are excluded; per-phase times are medians over the timed rounds. "
                      "Normalised figures use the pipeline's own FLOP count."),
        "accuracy": "Accuracy",
        "accuracy_text": ("Each rung compares the device with the reference; the threshold and its source are "
                          "printed beside every measurement (✓ pass, ! warning, ✗ fail)."),
        "operator": "Operators", "component_rung": "Components", "step": "Teacher-forced steps",
        "trajectory": "Trajectory", "benchmark": "Benchmark",
        "signoff": "Sign-off",
        "signoff_model": "Model tested",
        "signoff_inputs": "Input pictures (copied into this folder, hashed in SHA256SUMS)",
        "signoff_reproduce_here": "Reproduce from this folder (on the copied inputs):",
        "signoff_reviewer": "Reviewer", "signoff_date": "Date", "signoff_subjective": "Subjective evaluation",
        "pictures": "Device against reference",
        "pictures_text": ("Per prompt: the reference, the device under test and where they differ (a heat map of the "
                          "per-pixel difference); edits show the input first. Judge these before the tables."),
        "localisation": "First divergent layer",
        "localisation_text": ("Step {step} (seed {seed}) replayed on both sides with hooks on every transformer "
                              "block; first block {rule}: **{first}**."),
        "localisation_text_worst": ("Every step passed; the worst one, step {step} (seed {seed}), was still replayed "
                                    "with hooks on every transformer block (informative: it does not change the "
                                    "verdict); first block {rule}: **{first}**."),
        "localisation_rule_floor": "whose output error exceeds {ratio}x the floor's at that block (or cosine < 0.99)",
        "localisation_rule_cosine": "with cosine below {threshold} (no floor)",
        "no_block_diverges": "none (every block within the floor rule)",
        "after_blocks": "none of the blocks (the divergence is after them: final norm / head / guidance)",
        "block": "Block",
        "floor_text": ("Noise floor: {floor}, i.e. what the device's precision alone costs on a trusted "
                       "implementation that shares none of the device's kernels; every rung judges the device's "
                       "error against it (ratio <= 2 PASS, <= 3 WARN, beyond FAIL)."),
        "no_floor_text": ("No noise floor ({floor}): precision is not judged; each image is only held to diffusers' "
                          "absolute fp16-vs-fp32 bound, so the trajectory is at best a WARN."),
        "verdict_reasons": "Why the verdict is not a plain PASS:",
        "gallery": "Gallery",
        "gallery_text": "Sample prompts on the device; pairs show reference (left) and device (right).",
        "prompt": "Prompt",
        "notes": "Notes",
        "deliverables": "Deliverables",
        "file": "File", "bytes": "Bytes",
        "sources": "Threshold sources",
        "threshold": "threshold",
        "plot_steps": "Per-step error", "plot_times": "Per-step time", "plot_blocks": "Per-block error",
        "generated": "Generated {date} by difforge {version}.",
        "skipped": "skipped",
        "msprobe": "msprobe view",
        "msprobe_how": ("msprobe (the Ascend accuracy tool) can show this validation as its own dumps and per-call "
                        "table: install it with \"{install}\" and rerun with --msprobe; validate then dumps the "
                        "device's and the floor's teacher-forced step 0, runs msprobe compare on them and shows its "
                        "table here, with the commands to reproduce it and to open msprobe graph_visualize."),
        "msprobe_text": ("msprobe {version} (task {task}, level {level}) dumped {unit}: on the device under test "
                         "({device_calls} calls and modules) and on {golden} ({golden_calls}). msprobe compare matched "
                         "{rows} tensor rows ({counts}); the worst are below, msprobe's Result beside difforge's "
                         "verdict for the same transformer block and op type."),
        "msprobe_first": "msprobe's first flagged row (execution order): {name} in {module} (block {block}): {result}.",
        "msprobe_none_flagged": "msprobe flagged no row: its Result is pass on every row.",
        "msprobe_error": "The msprobe view failed: {error}.",
        "msprobe_reproduce": ("The dumps (msprobe's own layout), the dump config (config.json: \"task\": \"tensor\" "
                              "dumps whole tensors) and msprobe's CSV are in this report's msprobe/ folder. Reproduce "
                              "the comparison and open msprobe's graph view:"),
        "msprobe_row": "msprobe row", "msprobe_module": "module", "msprobe_dtype": "dtype (device / golden)",
        "msprobe_result": "msprobe Result", "difforge_block": "difforge (block)", "difforge_op": "difforge (op)",
    },
    "zh": {
        "title": "{model} 在 {device} 上的适配验证报告",
        "semantic": "语义：提示词正确率",
        "semantic_text": ("在被测设备、参考与噪声基线上逐一运行带预期属性（形状、颜色、背景等）的提示词集；由基于规则的检查器"
                          "（颜色分割与图像矩，无学习权重）为每张图打分。被测设备“丢失”（参考正确而设备错误）的提示词数"
                          "不超过噪声基线的丢失数加提示词总数的 10 %（至少 1 个）为通过，不超过两倍余量为警告。"),
        "semantic_sheet": "被测设备在提示词集上生成的图片",
        "scan": "模型源码中的适配风险",
        "scan_text": ("difforge scan 针对 {device} 静态读取了 {root} 的 {files} 个 Python 文件（未执行任何代码），耗时 {seconds} 秒："
                      "错误 {errors} 项，警告 {warnings} 项，提示 {infos} 项。规则说明为英文，见 docs/scan.md。"),
        "scan_where": "位置", "scan_rule": "规则", "scan_severity": "级别", "scan_message": "原因",
        "scan_fix": "修改建议", "scan_none": "未发现问题",
        "subject": "对象", "measurements": "测量值", "yes": "是", "no": "否", "divergent": "分叉",
        "contact_sheet": "样例总览", "device_link": "被测设备", "pair_link": "参考 | 被测设备",
        "see_sums": "见 SHA256SUMS",
        "env_dut": "被测设备", "env_memory": "设备内存", "env_ref": "参考设备",
        "env_driver": "驱动 / CANN", "env_commit": "difforge 提交", "env_platform": "平台",
        "env_threads": "CPU 线程", "env_threads_value": "{cores} 核，torch 使用 {threads} 个线程",
        "env_count": "数量", "env_vars": "已设置的环境变量", "env_presets": "已应用的预设",
        "env_config_hash": "配置哈希（sha256）",
        "perf_table_text": ("{device}，{size}，{steps} 步，batch {batch}，{dtype}。每行测法相同：取预热后各计时轮次的中位数"
                            "（见“轮次”列）。加速比为相对基线行的端到端加速；标 ✓ 的行即本报告验证的配置；"
                            "“精度依据”列说明各行精度由何验证。"),
        "perf_default_size": "模型默认尺寸",
        "perf_rounds": "轮次", "perf_rounds_cell": "预热 {warmup} 轮后 {rounds} 轮",
        "perf_spread": "最慢/最快 {spread}×", "perf_spread_flag": "最慢/最快 {spread}×（超过 2×：变化过大）",
        "perf_accuracy": "精度依据", "perf_acc_validated": "本报告结论：{verdict}",
        "perf_acc_none": "仅计时，未验证精度：需用 {name} 另行验证",
        "perf_acc_exact": "等价优化：本报告未另行验证其精度",
        "perf_acc_identical": "本设备上确为等价：关闭 {names} 后图像逐位相同（关闭一致性检查）",
        "perf_acc_differs": "本设备上为近似优化：{names} 与关闭时相比改变了图像（关闭一致性检查，见备注）",
        "perf_unsteady": "有行各轮最慢与最快之比超过 2×：其中位数不可比较，请在无其他负载的机器上重新测量。",
        "pictures_steps": "此图仅用 {steps} 步去噪（--quick），模型默认为 {default} 步：画面未成形是步数所致，不代表移植有误。",
        "pictures_steps_semantic": "用默认步数生成的图片见 {section}。",
        "perf_config": "配置", "perf_options": "选项", "perf_s_it": "s/it", "perf_it_s": "it/s",
        "perf_e2e": "端到端耗时 (s)", "perf_speedup": "加速比", "perf_mem_load": "加载后内存",
        "perf_mem_peak": "峰值内存", "perf_validated": "已验证",
        "perf_baseline": "基线", "perf_exact": "等价优化", "perf_validated_row": "本次验证配置",
        "perf_approximate": "近似优化", "perf_failed": "未能运行：{error}",
        "perf_no_table": "仅对本次验证的选项计时（--no-speed-table）。",
        "perf_host": "主机 RSS", "perf_defaults": "默认",
        "perf_details": "各阶段明细",
        "ranks": "各 rank 耗时",
        "ranks_text": "被测设备以 {world} 个 rank 运行（--parallel {mode}，{backend} 进程组）；各 rank 自身的耗时，取自其运行记录：",
        "rank": "rank", "rank_host": "主机", "rank_device": "设备", "rank_runs": "运行次数", "rank_steps": "步数",
        "rank_step_ms": "单步中位耗时 (ms)", "rank_load": "加载耗时 (s)", "rank_denoise": "去噪耗时 (s)",
        "rank_wall": "总耗时 (s)",

        "verdict": "结论",
        "overview": "各级结论",
        "overview_text": ("在被测设备（{device}）上运行 {model}（{family}），并逐级与参考（{reference}）比对。"
                          "总体结论：**{verdict}**。"),
        "rung": "验证层级", "summary": "结果", "seconds": "耗时 (s)",
        "environment": "验证环境",
        "component": "组件", "version": "版本", "item": "项目", "value": "值",
        "configuration": "运行配置",
        "config_text": ("本次验证所用的选项。“各方”：被测设备、参考与噪声基线均按此运行（相同权重、引导、提示词与尺寸），"
                        "因此比对衡量的是适配本身。“仅被测设备”：只改变被测设备的运行方式（速度、内存），参考与基线走默认路径。"),
        "option": "选项", "applies_to": "作用范围", "every_side": "各方", "device_only": "仅被测设备",
        "default": "默认",
        "quick_reductions": "--quick 降低了以下设置（快速检查：并未按给定值验证）：",
        "reproduce": "如何复现",
        "reproduce_text": "安装 difforge，设置建议环境变量，然后执行：",
        "adaptations": "适配项",
        "adaptations_text": "加载时选定的全部设备相关替换。“等价”表示与通用实现逐位一致；“近似”可能改变结果。",
        "what": "对象", "choice": "实现", "kind": "类型", "detail": "说明",
        "exact": "等价", "approximate": "近似", "none": "无",
        "smoke": "基本运行检查",
        "smoke_text": "一次冷启动运行：各阶段须全部完成，输出须无 NaN/Inf、非空白。",
        "determinism": "确定性",
        "performance": "性能参考",
        "perf_text": "剔除预热轮次；各阶段耗时取计时轮次的中位数。归一化指标采用流水线自身的 FLOP 计数。",
        "accuracy": "精度评测",
        "accuracy_text": "每一级都将被测设备与参考比对；每项指标旁列出阈值及其来源（✓ 通过，! 警告，✗ 失败）。",
        "operator": "算子级", "component_rung": "组件级", "step": "逐步教师强制",
        "trajectory": "完整轨迹", "benchmark": "性能基准",
        "signoff": "签核",
        "signoff_model": "被测模型",
        "signoff_inputs": "输入图片（已复制到本目录，哈希见 SHA256SUMS）",
        "signoff_reproduce_here": "在本目录复现（使用复制的输入）：",
        "signoff_reviewer": "评审人", "signoff_date": "日期", "signoff_subjective": "主观评价",
        "pictures": "被测设备与参考对比",
        "pictures_text": "每个提示词：参考、被测设备，以及二者的差异（逐像素差异热力图）；编辑任务先列出输入图。请先看图，再看表格。",
        "localisation": "首个分叉层",
        "localisation_text": ("在两侧以钩子重放第 {step} 步（seed {seed}），逐个比较 transformer block 输出；"
                              "首个{rule}的层：**{first}**。"),
        "localisation_text_worst": ("所有步均通过；仍以钩子重放误差最大的第 {step} 步（seed {seed}）（仅供参考，不影响结论）；"
                                    "首个{rule}的层：**{first}**。"),
        "localisation_rule_floor": "输出误差超过该层噪声基线 {ratio} 倍（或余弦 < 0.99）",
        "localisation_rule_cosine": "余弦相似度低于 {threshold}（无噪声基线）",
        "no_block_diverges": "无（所有 block 均在噪声基线规则之内）",
        "after_blocks": "所有 block 均未分叉（分叉发生在其后：最终归一化 / 输出头 / 引导）",
        "block": "层",
        "floor_text": "噪声基线：{floor}，即在不与被测设备共享任何算子的可信实现上，仅由该精度带来的误差；各级检查以被测设备误差与该基线之比判定（≤2 通过，≤3 警告，否则失败）。",
        "no_floor_text": "无噪声基线（{floor}）：不做精度判定，仅按 diffusers fp16 对 fp32 的绝对界检查图像，轨迹最多为 WARN。",
        "verdict_reasons": "结论并非直接 PASS 的原因：",
        "gallery": "生成样例",
        "gallery_text": "被测设备上的示例 prompt；对比图左为参考、右为被测设备。",
        "prompt": "提示词",
        "notes": "注意事项",
        "deliverables": "交付件清单",
        "file": "文件", "bytes": "字节", "sources": "阈值来源", "threshold": "阈值",
        "plot_steps": "逐步误差", "plot_times": "逐步耗时", "plot_blocks": "逐层误差",
        "generated": "报告生成时间：{date}，difforge {version}。",
        "skipped": "跳过",
        "msprobe": "msprobe 视图",
        "msprobe_how": ("msprobe（昇腾精度工具）可将本次验证呈现为其自身的 dump 与逐 API 比对表：执行 \"{install}\" 安装后"
                        "加 --msprobe 重新运行；validate 将 dump 被测设备与噪声基线的教师强制第 0 步，对其运行 msprobe "
                        "compare 并在此列出比对表，同时给出复现命令及打开 msprobe graph_visualize 的命令。"),
        "msprobe_text": ("msprobe {version}（task {task}，level {level}）dump 了{unit}：被测设备（{device_calls} 个 API 与模块）"
                         "与 {golden}（{golden_calls} 个）。msprobe compare 匹配了 {rows} 行张量（{counts}）；下表列出最差的行，"
                         "msprobe 的 Result 旁为 difforge 对同一 transformer block 与算子类型的结论。"),
        "msprobe_first": "msprobe 首个标记的行（按执行顺序）：{name}，位于 {module}（block {block}）：{result}。",
        "msprobe_none_flagged": "msprobe 未标记任何行：每行 Result 均为 pass。",
        "msprobe_error": "msprobe 视图失败：{error}。",
        "msprobe_reproduce": ("dump（msprobe 原生目录结构）、dump 配置（config.json；改为 \"task\": \"tensor\" 可 dump 完整张量）"
                              "与 msprobe 的 CSV 位于本报告的 msprobe/ 目录。复现比对并打开 msprobe 图可视化："),
        "msprobe_row": "msprobe 行", "msprobe_module": "模块", "msprobe_dtype": "dtype（设备 / 基准）",
        "msprobe_result": "msprobe Result", "difforge_block": "difforge（block）", "difforge_op": "difforge（算子）",
    },
}

RUNG_TITLES = {
    "en": {"smoke": "smoke", "determinism": "determinism", "benchmark": "benchmark", "operator": "operator",
           "component": "component", "step": "teacher-forced step", "trajectory": "trajectory",
           "semantic": "semantic"},
    "zh": {"smoke": "基本运行", "determinism": "确定性", "benchmark": "性能基准", "operator": "算子级",
           "component": "组件级", "step": "逐步教师强制", "trajectory": "完整轨迹",
           "semantic": "语义"},
}


def texts(lang: str) -> dict[str, str]:
    return TEXT.get(lang, TEXT["en"])
