"""Chinese for the sentences validate writes while it runs (rung findings, row notes, thresholds, notes).

The static prose of the report lives in :mod:`difforge.report.i18n`; these are the texts the rungs build
from numbers and names at run time, in English.  ``translate`` maps each known sentence shape to its
Chinese form, keeping every number, name and code fragment as it was.  Text it does not know is
returned unchanged (a test renders zh reports of passing, failing and skipped validations and fails on
any English sentence left, so a new sentence shape without a translation is caught there).
"""

from __future__ import annotations

import re
from collections.abc import Callable

Convert = Callable[[str], str]

#: A number as the rungs format it (``1.30``, ``1.5e-05``, ``-8``, ``nan``, ``inf``).
NUM = r"[-+]?(?:\d+(?:\.\d*)?(?:e[-+]?\d+)?|nan|inf)"
#: A device as torch names it (``cpu``, ``cuda:0``, ``npu:1``) and a dtype name.
DEV = r"[\w:.-]+"
DT = r"\w+"

#: The rungs by key, as the verdict reasons name them.
RUNGS = {"smoke": "基本运行检查", "determinism": "确定性验证", "benchmark": "性能基准", "operator": "算子级验证",
         "component": "组件级验证", "step": "逐步教师强制验证", "trajectory": "完整轨迹验证", "semantic": "语义验证"}
#: The shapes world's words (difforge.shapes.world), as the semantic rung's checker names what it found.
SHAPE_WORDS = {"circle": "圆形", "square": "正方形", "triangle": "三角形", "cross": "十字", "shape": "图形",
               "red": "红色", "green": "绿色", "blue": "蓝色", "yellow": "黄色", "white": "白色", "black": "黑色",
               "left": "左侧", "right": "右侧", "top": "上方", "bottom": "下方", "centre": "中央"}
#: The checks it makes (a device miss names the failed ones).
SHAPE_CHECKS = {"background": "背景", "count": "数量", "shape": "形状", "colour": "颜色", "position": "位置"}

#: Whole strings with a fixed translation (measurement names, subjects, fixed notes).
EXACT: dict[str, str] = {
    # ---- measurement names (table columns) -------------------------------------------------------------
    # smoke
    "status": "状态",
    "wall_s": "耗时 (s)",
    "peak_device_mib": "设备内存峰值 (MiB)",
    "peak_host_rss_mib": "主机内存峰值 RSS (MiB)",
    "nonfinite": "NaN/Inf 个数",
    "std_levels": "标准差（灰度级）",
    "saturated_share": "饱和像素占比",
    "images": "图像数",
    # determinism
    "same size": "尺寸相同",
    "bitwise_identical": "逐位一致",
    "rmse_levels": "RMSE（灰度级）",
    "max_abs_levels": "最大绝对差（灰度级）",
    "pixels_differing": "不同像素占比",
    # benchmark
    "median_s": "中位耗时 (s)",
    "min_s": "最短耗时 (s)",
    "max_s": "最长耗时 (s)",
    "steps_per_s": "每秒步数 (it/s)",
    "forwards_per_step": "每步前向次数",
    "tokens_per_forward": "每次前向 token 数",
    "flops_per_step": "每步 FLOPs",
    "achieved_tflops": "实测算力 (TFLOP/s)",
    "peak_tflops": "峰值算力 (TFLOP/s)",
    "mfu": "算力利用率 (MFU)",
    # operator
    "impl": "实现",
    "shape": "形状",
    "NaN/Inf only on device": "仅被测设备出现 NaN/Inf",
    "cosine": "余弦相似度",
    "max_abs_err": "最大绝对误差 (MaxAbsErr)",
    "max_rel_err": "最大相对误差 (MaxRelErr)",
    "share rel err > 0.1%": "相对误差 > 0.1% 的占比",
    "share rel err > 1%": "相对误差 > 1% 的占比",
    "small-value errors": "小值误差数",
    "share rel err > 0.01%": "相对误差 > 0.01% 的占比",
    "elements compared": "比对元素数",
    "floor max_rel_err": "噪声基线最大相对误差",
    "floor small-value errors": "噪声基线小值误差数",
    "rmse / floor": "RMSE / 噪声基线",
    "max_rel / floor": "最大相对误差 / 噪声基线",
    "small errors / floor": "小值误差 / 噪声基线",
    "decision": "判定依据",
    "where": "位置",
    "rel-L2 / floor": "rel-L2 / 噪声基线",
    "calls judged": "已判定调用数",
    "calls": "调用数",
    # component and step
    "rel_l2": "相对 L2 误差 (rel_l2)",
    "floor rel_l2": "噪声基线 rel_l2",
    "rel_l2 / floor": "rel_l2 / 噪声基线",
    "max_abs": "最大绝对误差",
    "nonfinite_only_device": "仅被测设备的 NaN/Inf 个数",
    "floor cosine": "噪声基线余弦相似度",
    "argmax agreement": "argmax 一致率",
    "floor argmax agreement": "噪声基线 argmax 一致率",
    "sampled-token agreement": "采样 token 一致率",
    "floor sampled agreement": "噪声基线采样 token 一致率",
    "replay self-check cosine": "重放自检余弦相似度",
    # trajectory
    "mse": "均方误差 (MSE)",
    "mae": "平均绝对误差 (MAE)",
    "psnr_db": "PSNR (dB)",
    "ssim": "SSIM",
    "within_1": "±1 级内像素占比",
    "within_4": "±4 级内像素占比",
    "within_16": "±16 级内像素占比",
    "floor_rmse_levels": "噪声基线 RMSE（灰度级）",
    "floor_psnr_db": "噪声基线 PSNR (dB)",
    "floor_ssim": "噪声基线 SSIM",
    "cos distance (no floor)": "余弦距离（无噪声基线）",
    "token_agreement": "token 一致率",
    # URSA's sampler step and tokens (issue 25)
    "sampler x1 agreement": "采样器目标码 x1 一致率",
    "sampler token disagreement": "采样器 token 不一致率",
    "sampler floor token disagreement": "噪声基线采样器 token 不一致率",
    "sampler tokens / (floor + allowance)": "采样器 token 不一致率 / (噪声基线 + 容许量)",
    "tokens / (floor + allowance)": "token 不一致率 / (噪声基线 + 容许量)",
    "token-steps compared": "比对的 token 步数",
    "device flips": "被测设备翻转数",
    "floor flips": "噪声基线翻转数",
    "one-step disagreement": "单步 token 不一致率",
    "floor one-step disagreement": "噪声基线单步 token 不一致率",
    "one-step disagreement (no floor)": "单步 token 不一致率（无噪声基线）",
    "tokens not judged: no noise floor": "token 未判定：没有噪声基线",
    "end-to-end rmse / floor": "端到端 RMSE / 噪声基线",
    "informative on a shared stream: the picture's tokens are judged step by step and its pixels from the device's "
    "own tokens (the rows below)":
        "共享随机流上仅供参考：图像的 token 按步判定，像素按被测设备自身的 token 判定（见下方各行）",
    "informative: one early near-boundary draw changes every later step of a free run, so the final tokens are "
    "judged step by step (the row 'tokens step by step')":
        "仅供参考：自由运行中早期一次落在边界附近的抽样会改变之后每一步，因此 token 按步判定（见“逐步 token”一行）",
    "tokens not judged: the sides drew from the reference's CPU stream, which falls out of step between them "
    "(judged on the portable Philox stream: --fast philox-rng)":
        "token 未判定：各方从参考的 CPU 随机流抽样，彼此会失去同步（在可移植的 Philox 流上判定：--fast philox-rng）",
    # ---- row subjects ------------------------------------------------------------------------------------
    "load": "加载",
    "encode": "编码",
    "denoise": "去噪",
    "decode": "解码",
    "save": "保存",
    "run": "运行",
    "output": "输出",
    "denoising step": "单步去噪",
    "end to end (without load)": "端到端（不含加载）",
    "normalised": "归一化指标",
    "joint attention (block 0)": "联合注意力（block 0）",
    # ---- thresholds --------------------------------------------------------------------------------------
    "floor rule": "噪声基线规则",
    "msprobe pre-check tree, then ratio rule": "msprobe 预检决策树，再按比值规则",
    "msprobe pre-check tree, then ratio rule (floors raised to allowances)":
        "msprobe 预检决策树，再按比值规则（噪声基线抬升到容许值）",
    # ---- rung findings and reasons -----------------------------------------------------------------------
    "all phases completed; output finite and not blank": "各阶段均已完成；输出无 NaN/Inf 且非空白",
    "the run returned no image": "运行未返回任何图像",
    "only one run with this seed": "该 seed 只有一次运行",
    "1 grey level (no floor)": "1 个灰度级（无噪声基线）",
    "no timed rounds": "没有计时轮次",
    "no op calls captured": "未捕获到任何算子调用",
    "NaN/Inf or cosine": "NaN/Inf 或余弦相似度",
    "whole call": "整个调用",
    "whole attention sub-module (projections, q/k norm, RoPE, kernel)":
        "整个注意力子模块（投影、q/k 归一化、RoPE、内核）",
    "NaN in the comparison": "比对中出现 NaN",
    "after the last block (final norm / head)": "最后一个 block 之后（最终归一化 / 输出头）",
    "no noise floor: precision not judged, only diffusers' absolute fp16 bound":
        "无噪声基线：不做精度判定，仅按 diffusers 的 fp16 绝对界检查",
    "no image to judge: the device and the reference produced no comparable image":
        "没有可判定的图像：被测设备与参考未产生可比较的图像",
    "every rung was skipped, so nothing was judged": "所有验证层级均被跳过，未做任何判定",
    "no reason given": "未给出原因",
    "skipped: the smoke run failed": "已跳过：基本运行失败",
    "the reference run recorded no step": "参考运行未记录任何步",
    "the reference runs": "参考运行",
    "the gallery": "生成样例",
    "the msprobe view": "msprobe 视图",
    "the validation stopped before it": "验证在此之前已停止",
    "the reference could not be loaded": "参考无法加载",
    "the family default": "模型族默认值",
    # ---- semantic rung ----------------------------------------------------------------------------------
    "prompt": "提示词",
    "device correct": "被测设备正确",
    "reference correct": "参考正确",
    "floor correct": "噪声基线正确",
    "device checks failed": "被测设备未通过的检查",
    "no prompt with expected attributes": "没有带预期属性的提示词",
    "no prompt set with expected attributes for this model (--prompt-set)": "该模型没有带预期属性的提示词集（--prompt-set）",
    "a golden bundle holds no reference runs of the prompt set; validate without --golden to judge meaning":
        "标杆数据包中没有该提示词集的参考运行；要判定语义，请不带 --golden 运行 validate",
    # ---- floor labels and notes --------------------------------------------------------------------------
    "none (self-comparison: not a port test)": "无（自比对：不是适配测试）",
    "no --image given: edits use a synthetic test picture (input_synthetic.png)":
        "未给出 --image：编辑任务使用合成测试图（input_synthetic.png）",
    "no --image given: edits use the model's own held-out source picture (input_synthetic.png)":
        "未给出 --image：编辑任务使用模型自带的输入图（input_synthetic.png）",
    "no --image given: edits use the golden bundle's synthetic test picture":
        "未给出 --image：编辑任务使用标杆数据包中的合成测试图",
    "no --image given to the capture: edits use the capture's synthetic test picture":
        "未给出 --image：编辑任务使用捕获数据包中的合成测试图",
    # ---- msprobe view ------------------------------------------------------------------------------------
    ("msprobe's CLI prints \"[ERROR] Please verify that the CANN environment is properly configured.\" on a "
     "machine without CANN (its offline-model comparison imports CANN's acl at start-up); comparing dumps does "
     "not use CANN, so difforge drops that line from the compare log: it is not an error here"):
        ("在没有 CANN 的机器上，msprobe 的命令行会打印 \"[ERROR] Please verify that the CANN environment is "
         "properly configured.\"（其离线模型比对在启动时导入 CANN 的 acl）；比对 dump 并不使用 CANN，因此 "
         "difforge 从比对日志中删去这一行：此处它不是错误"),
    "neither a floor nor the reference is loaded": "噪声基线与参考均未加载",
    "the reference run recorded no step to dump": "参考运行未记录可供 dump 的步",
    # ---- adaptations: what -------------------------------------------------------------------------------
    "weights": "权重",
    "transformer weights": "transformer 权重",
    "vae decoder dtype": "VAE 解码器 dtype",
    "lm_head rows": "lm_head 计算行",
    "first forward": "首次前向",
    "rope table": "RoPE 表",
    "host draws": "主机端采样",
    "unguided tail": "无引导尾段",
    "compile": "编译",
    "random stream": "随机数流",
    "offload": "卸载",
    "denoise loop": "去噪循环",
    "step cache": "步缓存",
    "vae convs": "VAE 卷积",
    # ---- adaptations: choice -----------------------------------------------------------------------------
    "torch (fp32 rsqrt factor)": "torch（fp32 rsqrt 因子）",
    "torch (fp32 g*u/(1+exp(-g)))": "torch（fp32 g*u/(1+exp(-g))）",
    "torch (interleaved pairs)": "torch（交错成对）",
    "safetensors, strict state-dict load": "safetensors，严格 state-dict 加载",
    "static pickle walk (never unpickled)": "静态遍历 pickle（从不反序列化）",
    "sampler rows only": "仅采样器所需的行",
    "all positions (reference)": "全部位置（参考）",
    "shared by steps 0 and 1": "第 0 步与第 1 步共用",
    "one forward per step (reference)": "每步一次前向（参考）",
    "built once per call": "每次调用构建一次",
    "built every forward (reference)": "每次前向都构建（参考）",
    "pinned memory, asynchronous copy": "锁页内存，异步拷贝",
    "pageable memory (blocking copy)": "可分页内存（阻塞拷贝）",
    "cond-only forward when t >= guidance_trunc": "t >= guidance_trunc 时仅做条件前向",
    "eager (compile requested)": "eager（已请求编译）",
    "reference: CPU torch.Generator, host draws": "参考：CPU torch.Generator，主机端采样",
    "diffusers RMSNorm": "diffusers RMSNorm",
    "diffusers processor": "diffusers 处理器",
    "real-valued RoPE: (cos, sin) float32 tables cached on the device": "实值 RoPE：(cos, sin) float32 表缓存在设备上",
    "diffusers complex64 RoPE (torch.polar / view_as_complex)": "diffusers complex64 RoPE（torch.polar / view_as_complex）",
    "one batch-2 transformer call per step (prompt + negative prompt)":
        "每步一次 batch-2 的 transformer 调用（提示词 + 负向提示词）",
    "two batch-1 transformer calls per step (diffusers' true CFG)":
        "每步两次 batch-1 的 transformer 调用（diffusers 的 true CFG）",
    "static shapes; a host sync in each transformer call (first-block-cache)":
        "静态形状；每次 transformer 调用有一次主机同步（first-block-cache）",
    "no host syncs, static shapes": "无主机同步，静态形状",
    "tiled decode/encode": "分块解码/编码",
    "diffusers' causal 3-D convolutions": "diffusers 的因果 3-D 卷积",
    # ---- adaptations: detail -----------------------------------------------------------------------------
    "torch.nn.functional.scaled_dot_product_attention, no mask":
        "torch.nn.functional.scaled_dot_product_attention，无掩码",
    "ids cast to int64 before embedding lookups": "嵌入查表前将 ids 转为 int64",
    "fused kernel; rounding differs from fp32-rsqrt path": "融合算子；舍入方式与 fp32-rsqrt 路径不同",
    "on a packed [gate, up] weight built at load time": "作用于加载时打包的 [gate, up] 权重",
    "rotate-half layout (same attention, other reduction order)": "rotate-half 布局（注意力相同，归约顺序不同）",
    "BSND layout, GQA native, no mask": "BSND 布局，原生 GQA，无掩码",
    "injected by the caller": "由调用方注入",
    "transformer and VAE; scheduler codebook kept float16 like the reference":
        "transformer 与 VAE；调度器码本与参考一致，保持 float16",
    "u + (c - u) differs from c by an ulp": "u + (c - u) 与 c 相差一个 ulp",
    "VAE kept on cpu between calls": "两次调用之间 VAE 留在 cpu 上",
    "opt-in preset asked for with --preset": "经 --preset 要求启用的可选预设",
    "preset applied because it was unset": "该变量未设置，因此应用了预设",
    "--preset asked for it, but the user's exported value was kept": "--preset 要求设置该变量，但保留了用户已导出的值",
    "the NPU fused kernel needs bf16/fp16": "NPU 融合算子需要 bf16/fp16",
    ("a one-frame causal conv3d is the conv2d of its last temporal tap: the same products in another order, float "
     "rounding only (2.5-5x faster VAE on a CPU); disable with 'vae-2d'"):
        "单帧输入的因果 conv3d 等于用其最后一个时间维权重做的 conv2d：乘积相同，仅求和顺序不同，只有浮点舍入差异（CPU 上 VAE 快 "
        "2.5-5 倍）；用 'vae-2d' 关闭",
    "QwenImage's rotary embedding as shipped; devices without complex kernels need a real-valued form":
        "QwenImage 原版的旋转位置编码；不支持复数内核的设备需要实值形式",
    ("diffusers' First-Block-Cache reads block 0's residual change with .item() (every call after the first) to "
     "decide whether to skip the other blocks; nothing else syncs except a step_hook's CPU copies"):
        ("diffusers 的 First-Block-Cache 用 .item() 读取 block 0 的残差变化（首次之后的每次调用），以决定是否跳过"
         "其余 block；除 step_hook 的 CPU 拷贝外没有其他同步"),
    "timesteps stay on the device, texts padded once per run; a step_hook's CPU copies are the only syncs":
        "时间步留在设备上，文本每次运行只补齐一次；唯一的同步是 step_hook 的 CPU 拷贝",
    "diffusers FirstBlockCacheConfig: later blocks are skipped when block 0's residual barely changes":
        "diffusers FirstBlockCacheConfig：block 0 的残差几乎不变时跳过后续 block",
    "diffusers TaylorSeerCacheConfig: block outputs predicted by a Taylor expansion between refreshes":
        "diffusers TaylorSeerCacheConfig：两次刷新之间用泰勒展开预测 block 输出",
    "accelerate hooks move one whole component to the device when it runs": "accelerate 钩子在组件运行时将整个组件移到设备上",
    "accelerate hooks stream every layer's weights to the device (slow, least memory)":
        "accelerate 钩子将每一层的权重流式传到设备上（慢，内存占用最少）",
    "transformer and text encoder move to the host before VAE decode": "VAE 解码前将 transformer 与文本编码器移到主机",
    "diffusers AutoencoderKLQwenImage tiling": "diffusers AutoencoderKLQwenImage 分块",
    "unquantized single-file transformer": "未量化的单文件 transformer",
    # compile policies (the detail of a compile entry)
    "default mode": "默认模式",
    "this torch has no torch.compile": "当前 torch 没有 torch.compile",
    "torchair is not importable": "无法导入 torchair",
    "no C++ compiler on PATH (Inductor's CPU backend needs one)": "PATH 上没有 C++ 编译器（Inductor 的 CPU 后端需要）",
    "ATEN_CPU_CAPABILITY=default: Inductor's CPU kernels need a vector kernel family (avx2, avx512, neon ...)":
        "ATEN_CPU_CAPABILITY=default：Inductor 的 CPU 内核需要向量指令族（avx2、avx512、neon ...）",
    # random stream (why it is the one in force)
    "named by the run": "由本次运行指定",
}

#: The threshold sources (:data:`difforge.validate.thresholds.SOURCES`) by key: (label, where it is written).
SOURCES_ZH: dict[str, tuple[str, str]] = {
    "msprobe-precheck": (
        "msprobe 预检",
        "昇腾 msprobe docs/en/accuracy_checker/pytorch_accuracy_checker_instruct.md：先要求 Cosine > 0.99，再要求 "
        "MaxAbsErr < 0.001，再看双百分之一（fp16/bf16）/ 双千分之一（fp32）指标；小值按绝对误差判定",
    ),
    "cann-compare": (
        "CANN 精度比对",
        "CANN 7.0 PyTorch 精度比对（hiascend canncommercial/700 AImpug_000197）：Cosine > 0.99 且 MaxAbsErr < 0.001 "
        "为可接受；Cosine < 0.9 或 MaxAbsErr > 1 为未达标",
    ),
    "msprobe-nan": (
        "msprobe 比对",
        "昇腾 msprobe docs/en/accuracy_compare/pytorch_accuracy_compare_instruct.md：仅设备侧出现 NaN/Inf 即为错误",
    ),
    "msprobe-ratio": (
        "msprobe 新标准",
        "msprobe NPU 对 GPU 的结果比对：误差比（设备对 CPU）/（第二台设备对 CPU）<= 2（RMSE，L0 级）；"
        "最大相对误差比 <= 10",
    ),
    "aws-nxdi": (
        "AWS NxDI 社区移植",
        "aws-neuron 社区移植 #159/#154/#151：每个组件对 CPU fp32 的余弦相似度 >= 0.999",
    ),
    "mindie-gate": (
        "MindIE-SD 精度门禁",
        "MindIE-SD .agents/skills/accuracy-gate：L1 = 相同配置重跑逐位一致；噪声基线不是容差",
    ),
    "difforge-step": (
        "difforge（推导）",
        "教师强制步沿用组件级门限（余弦相似度 >= 0.999 PASS，>= 0.99 WARN，msprobe/AWS）；没有公开工具提供逐步验证"
        "框架（acceptance.md c.2）",
    ),
    "difforge-image": (
        "difforge（推导）",
        "8 位图像：输出空白或饱和（标准差 < 2 个灰度级，或 > 98 % 的像素为 0/255）说明解码或去噪器已崩溃",
    ),
    "difforge-ratio": (
        "difforge（推导）",
        "对 fp32 参考的误差除以噪声基线在相同输入上的误差：<= 2 PASS（msprobe L0 比值），<= 3 WARN，> 3 FAIL；"
        "余弦相似度 < 0.99 直接判为失败（msprobe/CANN）；噪声基线从不使用被测设备的内核（模拟或第二台设备）",
    ),
    "difforge-floor": (
        "difforge（推导）",
        "完整轨迹误差对照噪声基线判定（即仅由被测设备 dtype 带来的误差，从不用被测设备的内核计算），采用噪声基线"
        "规则（比值 2 PASS / 3 WARN）；低于 1 个灰度级（0-255）的基线提高到 1 个灰度级，即所保存图像的量化步长",
    ),
    "difforge-tokens": (
        "difforge（推导）",
        "各方从相同的 Philox 随机字抽取离散 token：被测设备与参考不同的 token 占比，除以（噪声基线的占比 + 容许量 "
        "max(0.5 %, 3 个 token)），<= 2 PASS，<= 3 WARN（噪声基线规则）；容许量覆盖落在累积和边界舍入范围内的抽样（与被测设备"
        "不共享任何内核的噪声基线未必遇到），以及少数此类事件的计数噪声",
    ),
    "diffusers-fp16": (
        "diffusers fp16 测试",
        "diffusers tests/pipelines/test_pipelines_common.py test_float16_inference：numpy_cosine_similarity_distance("
        "fp16 输出, fp32 输出) < 5e-2（acceptance.md c.2）；仅在没有噪声基线时使用，且最多为 WARN：绝对界无法证明"
        "适配正确",
    ),
    "msprobe-benchmark": (
        "msprobe 标杆比对法",
        "昇腾 mstt debug/accuracy_tools/msprobe/pytorch/api_accuracy_checker：precision_standard/"
        "benchmark_compare.py 与 compare/algorithm.py（标杆比对法：最大相对误差只在正常值域内统计，小值超过 "
        "small_value_atol 计为错误，RMSE 不含小值；calc_ratio 在两侧误差都约为 0 时返回 1，仅标杆误差为 0 时返回 "
        "DEFAULT_RATIO_VALUE 10000，即对零误差标杆的任何误差都判为失败）；precision_standard/standard_config.py"
        "（比值错误阈值：小值域 2、RMSE 2、最大相对误差 10、平均相对误差 2）",
    ),
    "msprobe-dual-n": (
        "msprobe 双 N 占比",
        "昇腾 msprobe docs/en/accuracy_checker/pytorch_accuracy_checker_instruct.md 与 "
        "precision_standard/standard_config.py（_fp16_ulp_err_proportion 0.001）：低精度内核可以在低于 1/N 的元素"
        "占比上出错（bf16/fp16 双百分之一，fp32 双千分之一）",
    ),
    "difforge-allowance": (
        "difforge（推导）",
        "噪声基线自身误差约为 0 时让比值保持有限的绝对容许值（msprobe 在此给出默认值 10000）：算子级的噪声基线抬升到该 "
        "dtype 一次舍入的代价——RMSE 0.42 * 2^-p（对数均匀尾数下的 RMS），最大相对误差 2^-p（float32 两者均乘 32，即 "
        "msprobe ULP 标准的 32 ULP 阈值），小值误差为元素数的 1/warn-N（bf16/fp16 为 0.1 %，即 msprobe 的 ULP 占比 "
        "0.001）；组件级/逐步验证的 rel-L2 基线抬升到 1e-4，图像基线抬升到 1 个灰度级，token 基线抬升到 2 %（至少一个 "
        "token），语义基线抬升到 N 的 10 %（至少一个提示词）",
    ),
    "peak-table": (
        "厂商数据手册",
        "各 dtype 的稠密（非稀疏）峰值 TFLOP/s，见 difforge.validate.bench.KNOWN_PEAKS",
    ),
}


def _add_sources() -> None:
    """The sources' English label and text (as thresholds.py words them now) -> their Chinese."""
    from ..validate.thresholds import SOURCES

    for key, (label, where) in SOURCES.items():
        if key in SOURCES_ZH:
            EXACT.setdefault(label, SOURCES_ZH[key][0])
            EXACT.setdefault(where, SOURCES_ZH[key][1])


_add_sources()

#: (pattern, template) pairs tried in order on a string; the template uses the pattern's named groups
#: (``{name}``; an optional group that did not match is empty).  A group listed in ``CONVERT`` for its
#: pattern is converted first (most are themselves translated: an embedded label, error or phrase);
#: every other group (numbers, names, code) is kept as it is.
PATTERNS: list[tuple[re.Pattern[str], str]] = []
CONVERT: dict[re.Pattern[str], dict[str, Convert]] = {}


def translate(text: str, lang: str) -> str:
    """``text`` in ``lang``: unchanged for English (and for anything not in the catalogue)."""
    if lang != "zh" or not text:
        return text
    return _zh(text)


def translator(lang: str) -> Callable[[str], str]:
    """``translate`` bound to one language, for the report's context builder."""
    return lambda text: translate(text, lang) if isinstance(text, str) else text


def _zh(text: str) -> str:
    if text in EXACT:
        return EXACT[text]
    for pattern, template in PATTERNS:
        m = pattern.fullmatch(text)
        if m:
            convert = CONVERT.get(pattern, {})
            groups = {k: "" if v is None else convert[k](v) if k in convert else v for k, v in m.groupdict().items()}
            return _spaced(template.format(**groups))
    return text


_CJK_THEN_LATIN = re.compile(r"([\u4e00-\u9fff])([A-Za-z0-9])|([A-Za-z0-9])([\u4e00-\u9fff])")


def _spaced(text: str) -> str:
    """A space between a Chinese character and a Latin letter or digit that meet where a group was filled in
    (``加载噪声基线 cuda bfloat16 失败``), as the zh prose of :mod:`.i18n` writes them."""
    return _CJK_THEN_LATIN.sub(lambda m: f"{m[1]} {m[2]}" if m[1] else f"{m[3]} {m[4]}", text)


# ---- converters for groups ----------------------------------------------------------------------------------
def _t(text: str) -> str:
    """The group as a sentence of its own (an embedded label, phrase or error)."""
    return _zh(text)


def _items(sep: str, joiner: str, item: Convert = _t) -> Convert:
    """A ``sep``-separated list, each item converted, joined with ``joiner``."""
    return lambda text: joiner.join(item(x) for x in text.split(sep))


def _word(mapping: dict[str, str]) -> Convert:
    return lambda text: mapping.get(text, text)


def _named(text: str) -> str:
    """``subject: finding`` (a component rung's decided rows): the subject kept, the finding translated."""
    subject, sep, how = text.partition(": ")
    return f"{_t(subject)}：{_t(how)}" if sep else _t(text)


def _prefixed(prefix: str, template: str) -> Convert:
    """An optional tail that starts with ``prefix``: ``template`` filled with what follows it."""
    return lambda text: template.format(text.removeprefix(prefix))


_SCENE = re.compile(r"(?P<things>.+) on (?P<bg>a \w+|any|no clear) background")
_ITEM = re.compile(r"a (?:(?P<colour>\w+) )?(?P<shape>\w+)(?: \((?P<position>\w+)\))?")


def _shape_word(word: str) -> str:
    return SHAPE_WORDS.get(word, word)


def _scene(text: str) -> str:
    """What the shapes checker expected or found (``a red circle (left) and a blue square on a green
    background``) as ``绿色背景，红色圆形（左侧）和蓝色正方形``; anything else is kept."""
    m = _SCENE.fullmatch(text)
    if m is None:
        return text
    bg = m["bg"]
    background = {"any": "任意背景", "no clear": "背景不明确"}.get(bg) or f"{_shape_word(bg[2:])}背景"
    items = []
    for thing in m["things"].split(" and "):
        item = _ITEM.fullmatch(thing)
        if thing == "nothing":
            items.append("无图形")
        elif item is None:
            items.append(thing)
        else:
            where = f"（{_shape_word(item['position'])}）" if item["position"] else ""
            items.append(f"{_shape_word(item['colour'] or '')}{_shape_word(item['shape'])}{where}")
    return f"{background}，{'和'.join(items)}"


def rule(regex: str, template: str, **convert: Convert) -> re.Pattern[str]:
    """Add one sentence shape (``regex`` must match the whole string) and how its groups convert."""
    pattern = re.compile(regex.replace("NUM", NUM).replace("DEV", DEV).replace("DT", DT))
    PATTERNS.append((pattern, template))
    if convert:
        CONVERT[pattern] = convert
    return pattern


_EXACT_KIND = _word({"exact": "等价", "approximate": "近似"})
rule(r"2-D convolutions on single pictures \((?P<n>\d+) causal convs\)", "单张图片上的 2-D 卷积（{n} 个因果卷积）")
_QUICK = _word({"steps": "步数", "prompts": "提示词数", "rounds": "计时轮数", "warmup": "预热轮数",
               "semantic prompts": "语义验证提示词数"})
_FP8_FORM = _word({"plain": "普通", "scaled": "带缩放"})

# ---- errors: the class name kept, a known message translated ---------------------------------------------------
rule(r"(?P<cls>[A-Z]\w*(?:Error|Exception)): (?P<msg>.+)", "{cls}: {msg}", msg=_t)
rule(r"the golden bundle has no run for seed (?P<s>\d+)", "标杆数据包中没有 seed {s} 的运行")
rule(r"the golden bundle has no step (?P<i>\d+) for seed (?P<s>\d+)", "标杆数据包中没有 seed {s} 的第 {i} 步")

# ---- a prompt outside the model's prompt domain (shapes/domain.py PromptDomain.warning), a report note ----------
def _domain_why(text: str) -> str:
    """The reasons a prompt leaves the domain, joined by '; ' - one reason ("it names 2 items; ... of 1 item")
    holds a '; ' itself, so two neighbours that translate as one are taken together."""
    parts, out, i = text.split("; "), [], 0
    while i < len(parts):
        two = "; ".join(parts[i:i + 2])
        if i + 1 < len(parts) and _t(two) != two:
            out.append(_t(two))
            i += 2
        else:
            out.append(_t(parts[i]))
            i += 1
    return "；".join(out)


rule(r"the prompt (?P<p>'.*') leaves what (?P<m>\S+) was trained on: (?P<why>.+); expect a picture that does not "
     r"follow it\.", "提示词 {p} 超出 {m} 所学范围：{why}；生成的图片可能与之不一致。", why=_domain_why)
rule(r"(?P<w>.+) (?:is|are) outside (?P<m>\S+)'s vocabulary of (?P<n>\d+) words", "{w} 不在 {m} 的 {n} 词词表中")
rule(r"it is not a caption of the shapes world (?P<m>\S+) was trained on \('a <colour> <shape> on a <colour> "
     r"background'\)", "它不是 {m} 所学的 shapes 图形说明（“a <colour> <shape> on a <colour> background”）")
rule(r"it names (?P<k>\d+) items; (?P<m>\S+) was trained on captions of (?P<j>\d+) items?",
     "它含 {k} 个图形；{m} 只学过含 {j} 个图形的说明")

# ---- out of memory (difforge.errors.out_of_memory_message) ------------------------------------------------------
rule(r"(?P<dev>DEV) ran out of memory; offloading cannot help on the CPU \(the weights already live in host memory\): "
     r"reduce --height/--width(?P<tiling>, use --vae-tiling)? or use --dtype bfloat16\.",
     "{dev} 内存不足；在 CPU 上卸载无济于事（权重本就在主机内存中）：请减小 --height/--width{tiling} 或使用 --dtype "
     "bfloat16。", tiling=lambda _s: "、使用 --vae-tiling")
rule(r"(?P<dev>DEV) ran out of memory with --offload (?P<plan>[\w-]+); (?P<hint>.+)\.",
     "{dev} 在 --offload {plan} 下内存不足；{hint}。", hint=_t)
rule(r"retry with --offload (?P<plan>[\w-]+)(?P<tiling> and --vae-tiling)?", "请改用 --offload {plan}{tiling} 重试",
     tiling=lambda _s: " 并加 --vae-tiling")
rule(r"reduce --height/--width or use (?P<what>a smaller --dtype|--vae-tiling)", "请减小 --height/--width 或{what}",
     what=_word({"a smaller --dtype": "使用更小的 --dtype", "--vae-tiling": "使用 --vae-tiling"}))

# ---- labels: the reference, the floor ------------------------------------------------------------------------
rule(r"(?P<x>.+) \(golden bundle\)", "{x}（标杆数据包）", x=_t)
rule(r"emulated (?P<d>[\w, ]+) on (?P<ref>.+) kernels", "{ref} 内核模拟的 {d}", ref=_t)
rule(r"(?P<ref>.+) \(the reference itself\)", "{ref}（参考本身）", ref=_t)
rule(r"(?P<dev>DEV) (?P<d>DT), nearest to (?P<want>DT)", "{dev} {d}（最接近 {want}）")
rule(r"(?P<dev>DEV) (?P<d>DT) \(--floor\)", "{dev} {d}（--floor）")
rule(r"none \((?P<why>.+)\)", "无（{why}）", why=_t)
rule(r"the floor's RMSE \((?P<label>.+)\)", "噪声基线的 RMSE（{label}）", label=_t)

# ---- verdict reasons and caveats -------------------------------------------------------------------------------
rule(r"the (?P<key>\w+) rung did not run", "{key}未运行", key=_word(RUNGS))
rule(r"the (?P<key>\w+) rung was skipped \((?P<why>.+)\)", "{key}被跳过（{why}）", key=_word(RUNGS), why=_t)
rule(r"the (?P<key>\w+) rung WARNs on a floor ratio between PASS and FAIL \((?P<where>.+)\), accepted by the user: "
     r"(?P<why>.+)", "{key}因噪声基线比值位于 PASS 与 FAIL 之间而为 WARN（{where}），已由用户接受：{why}",
     key=_word(RUNGS), where=_items("; ", "；", _named))
rule(r"the (?P<key>\w+) rung WARNs on a floor ratio between PASS and FAIL \((?P<where>.+)\): a sign-off fails on it "
     r"unless accepted with --accept-warn (?P<flag>\w+=REASON)",
     "{key}因噪声基线比值位于 PASS 与 FAIL 之间而为 WARN（{where}）：除非用 --accept-warn {flag} 明确接受，否则签收判为"
     "失败", key=_word(RUNGS), where=_items("; ", "；", _named))
rule(r"the trajectory rung WARNs on a free run's picture between PASS and FAIL \((?P<where>.+)\), explained: every "
     r"teacher-forced step and every component PASS, so the free run's picture is the chaotic growth of in-floor "
     r"per-step errors",
     "轨迹级验证中自由运行的图像比值位于 PASS 与 FAIL 之间（{where}），已有解释：每个教师强制步骤和每个组件均为 PASS，"
     "自由运行图像的偏差是基线内逐步误差的混沌放大", where=_items("; ", "；", _named))
rule(r"(?P<name>.+ / floor) (?P<v>NUM)", "{name} {v}", name=_t)

# ---- runner: crashes, stages, the golden bundle ----------------------------------------------------------------
rule(r"out of memory: (?P<err>.+)", "内存不足：{err}", err=_t)
rule(r"not available for this pipeline: (?P<err>.*)", "该流水线不支持：{err}", err=_t)
rule(r"error: (?P<err>.+)", "错误：{err}", err=_t)
rule(r"not run: (?P<why>.+)", "未运行：{why}", why=_t)
rule(r"the reference could not be loaded \((?P<err>.+)\)", "参考无法加载（{err}）", err=_t)
rule(r"the reference \((?P<ref>.+?)\) could not be loaded: (?P<err>.+)", "参考（{ref}）无法加载：{err}",
     ref=_t, err=_t)
rule(r"the emulated floor failed to load \((?P<err>.+)\)", "模拟噪声基线加载失败（{err}）", err=_t)
rule(r"(?P<stage>.+?) failed \((?P<err>.+)\)", "{stage}失败（{err}）", stage=_t, err=_t)
rule(r"the device run \(seed (?P<s>\d+)\)", "被测设备运行（seed {s}）")
rule(r"the reference run \(seed (?P<s>\d+)\)", "参考运行（seed {s}）")
rule(r"reading the golden run \(seed (?P<s>\d+)\)", "读取标杆数据包中的运行（seed {s}）")
rule(r"the floor run \((?P<label>.+), seed (?P<s>\d+)\)", "噪声基线运行（{label}，seed {s}）", label=_t)
rule(r"loading the floor (?P<dev>DEV) (?P<d>DT)", "加载噪声基线 {dev} {d}")
rule(r"(?P<dev>DEV) runs none of (?P<list>.+)", "{dev} 不支持 {list} 中的任何一种")
rule(r"reference and floor read from the golden bundle (?P<path>.+) \(made (?P<created>.+) by difforge "
     r"(?P<ver>\S+)\): nothing of them ran here; the operator rung replays the device's captured calls on this "
     r"host's float32 kernels",
     "参考与噪声基线读取自标杆数据包 {path}（由 difforge {ver} 于 {created} 生成）：二者均未在本机运行；"
     "算子级验证在本机的 float32 内核上重放被测设备捕获的调用")

rule(r"the (?P<kind>golden bundle|capture) (?P<path>.+) was not checked against an external digest \(no "
     r"(?P<flag>--golden-digest|--capture-digest)\): its SHA256SUMS shows only that its files agree with one another, "
     r"and a bundle changed with its sums recomputed would pass too; its digest is (?P<d>[0-9a-f]+)",
     "{kind} {path} 未经外部核对（未给出 {flag}）：其 SHA256SUMS 只表示其中各文件之间一致，改动后重新计算 SHA256SUMS "
     "的数据包同样能通过；其 sha256 为 {d}", kind=_word({"golden bundle": "标杆数据包", "capture": "捕获数据包"}))
rule(r"the device under test \((?P<dut>.+?), (?P<name>.+?)\) ran elsewhere: its half of this validation is the "
     r"capture (?P<path>.+) \(made (?P<created>.+) by difforge (?P<ver>\S+), digest (?P<d>[0-9a-f]+)\); the reference "
     r"and the floor ran here, teacher-forced on the device's own recorded states",
     "被测设备（{dut}，{name}）在别处运行：本次验证中属于它的部分来自捕获数据包 {path}（由 difforge {ver} 于 {created} "
     "生成，sha256 {d}）；参考与噪声基线在本机运行，在被测设备记录的状态上进行教师强制")
rule(r"the capture was made under --max-bytes (?P<n>\d+) \(level (?P<lv>\d+): (?P<c>\d+) operator calls per op type "
     r"and component, (?P<b>\d+) B per call, (?P<o>\d+) output elements per call, block outputs sampled to "
     r"(?P<s>\d+)\); the operator rung judges those calls and samples, the other rungs what validate keeps",
     "捕获数据包在 --max-bytes {n} 下生成（第 {lv} 级：每个组件每种算子保留 {c} 次调用，每次调用 {b} B，比较 {o} 个输出元素，"
     "各块输出采样 {s} 个元素）；算子级验证判定所保留的调用与采样，其余各级验证判定 validate 保留的全部内容")
rule(r"on the device: (?P<err>.+)", "在被测设备上：{err}", err=_t)

# ---- ladder: --quick, the floor's notes ------------------------------------------------------------------------
rule(r"(?P<what>steps|prompts|rounds|warmup|semantic prompts) (?P<asked>.+) -> (?P<ran>\d+)", "{what} {asked} -> {ran}",
     what=_QUICK, asked=_t)
rule(r"no precision floor: (?P<why>.+); the trajectory is judged only by an absolute bound, at best WARN",
     "无精度噪声基线：{why}；完整轨迹仅按绝对界判定，最多为 WARN", why=_t)
rule(r"self-comparison asked for \(--allow-self-compare\): (?P<dut>.+) is the reference itself, so this report "
     r"is not a port test", "按要求进行自比对（--allow-self-compare）：{dut} 即参考本身，因此本报告不是适配测试")
rule(r"device and reference share (?P<d>DT): the floor is the reference itself \(zero\), raised to the 1-level "
     r"quantisation step", "被测设备与参考同为 {d}：噪声基线即参考本身（为零），提高到 1 个灰度级的量化步长")
rule(r"the precision floor is emulated: the reference's (?P<d>DT) kernels with every weight and module output "
     r"rounded to the dtype the device holds it in \((?P<e>[^()]+)\); it shares no kernel with the device under test",
     "精度噪声基线为模拟所得：使用参考的 {d} 内核，每个权重与模块输出都舍入到被测设备存放它所用的 dtype（{e}）；"
     "它与被测设备不共享任何内核")
rule(r"(?P<dev>DEV) does not run (?P<want>DT), so the precision floor is built at (?P<d>DT), the nearest dtype it "
     r"supports: a looser floor than (?P<want2>DT) would give",
     "{dev} 不支持 {want}，因此精度噪声基线按其支持的最接近的 dtype {d} 构建：比 {want2} 下的基线更宽松")
rule(r"the precision floor is a second device: (?P<dev>DEV) (?P<d>DT)", "精度噪声基线为第二台设备：{dev} {d}")

# ---- smoke -----------------------------------------------------------------------------------------------------
rule(r"failed: (?P<items>.+)", "失败：{items}", items=_items(", ", "、"))
rule(r"final (?P<key>\w+): NaN/Inf", "最终 {key}：NaN/Inf")
rule(r"image (?P<i>\d+): (?P<size>\d+x\d+)", "图像 {i}：{size}")

# ---- determinism -----------------------------------------------------------------------------------------------
rule(r"run (?P<k>\d+) vs run 1, image (?P<i>\d+)", "第 {k} 次运行对比第 1 次，图像 {i}")
rule(r"<= (?P<b>NUM) \((?P<where>.+)\) WARN, else FAIL", "<= {b}（{where}）WARN，否则 FAIL", where=_t)
rule(r"(?P<n>\d+) runs with the same seed are bitwise identical", "同一 seed 的 {n} 次运行逐位一致")
rule(r"(?P<n>\d+) runs with the same seed differ: RMSE up to (?P<x>NUM) levels, within (?P<where>.+) = (?P<b>NUM)",
     "同一 seed 的 {n} 次运行结果不同：RMSE 最大 {x} 个灰度级，在{where} = {b} 之内", where=_t)
rule(r"(?P<n>\d+) runs with the same seed differ: RMSE up to (?P<x>NUM) levels, beyond (?P<where>.+) = (?P<b>NUM)",
     "同一 seed 的 {n} 次运行结果不同：RMSE 最大 {x} 个灰度级，超出{where} = {b}", where=_t)

# ---- benchmark -------------------------------------------------------------------------------------------------
rule(r"phase (?P<p>\w+)", "{p}阶段", p=_t)
rule(r"(?P<r>\d+) timed rounds after (?P<w>\d+) warm-up: median step (?P<st>NUM) ms, end to end (?P<e>NUM) s"
     r"(?P<mfu>, MFU NUM %)?", "预热 {w} 轮后计时 {r} 轮：单步中位耗时 {st} ms，端到端 {e} s{mfu}",
     mfu=_prefixed(", ", "，{}"))

# ---- operator --------------------------------------------------------------------------------------------------
rule(r"(?P<n>\d+) probe ops and (?P<m>\d+) traced op types within msprobe thresholds",
     "{n} 个探针算子与 {m} 类追踪算子均在 msprobe 阈值之内")
rule(r"(?P<v>PASS|WARN|FAIL): (?P<items>[^:;]+: .+)", "{v}：{items}", items=_items("; ", "；", _named))
rule(r"(?P<v>PASS|WARN|FAIL): (?P<items>[^:]+)", "{v}：{items}", items=_items(", ", "、"))
rule(r"(?P<impl>.+) \((?P<kind>exact|approximate)\)", "{impl}（{kind}）", impl=_t, kind=_EXACT_KIND)
rule(r"(?P<op>.+) \(traced\)", "{op}（追踪）", op=_t)
rule(r"output layout (?P<layout>[\w-]+) \(the reference is compared in the same layout\)",
     "输出布局为 {layout}（参考按相同布局比对）")
rule(r"worst of (?P<n>\d+) judged calls \((?P<ran>\d+) ran\): (?P<comp>[^,]+), call #(?P<i>\d+) of (?P<op>\S+)"
     r"(?P<where> in \S+)?; kept (?P<how>.+)",
     "{n} 个已判定调用中最差的一个（共运行 {ran} 次）：{comp}，{op} 的调用 #{i}{where}；保留 {how}",
     comp=_t, where=_prefixed(" in ", "，位于 {}"), how=_t)
rule(r"(?P<comp>[^:]+): (?P<where>\S+) \(call #(?P<i>\d+)\)", "{comp}：{where}（调用 #{i}）", comp=_t)
rule(r"(?P<comp>[^;:]+?) call (?P<n>\d+): no reduction fits (?P<b>\d+) B", "{comp} 调用 #{n}：没有能放入 {b} B 的缩减方式",
     comp=_t)
rule(r"(?P<comp>[^;:]+?) call (?P<n>\d+): kept (?P<x>\d+) B > (?P<y>\d+) B", "{comp} 调用 #{n}：保留了 {x} B > {y} B",
     comp=_t)
rule(r"(?P<comp>[^;:]+?) call (?P<n>\d+): (?P<err>\w+: [^;]*)", "{comp} 调用 #{n}：{err}", comp=_t, err=_t)
# an op type none of whose calls could be kept: up to three of the reasons, "; "-separated
rule(r"(?P<items>.+? call \d+: .+?; .+? call \d+: .+)", "{items}", items=_items("; ", "；"))
# what a traced call kept (tracing's reductions)
rule(r"(?P<k>\d+) of (?P<n>\d+) elements", "{n} 个元素中的 {k} 个")
rule(r"(?P<a>\d+) of (?P<n>\d+) rows x (?P<b>\d+) of (?P<o>\d+) outputs", "{n} 行中的 {a} 行 × {o} 个输出中的 {b} 个")
rule(r"(?P<a>\d+) of (?P<nb>\d+) matrices, (?P<b>\d+) of (?P<m>\d+) rows x (?P<c>\d+) of (?P<n>\d+) columns",
     "{nb} 个矩阵中的 {a} 个，{m} 行中的 {b} 行 × {n} 列中的 {c} 列")
rule(r"(?P<a>\d+) of (?P<n>\d+) rows of (?P<d>\d+)", "{n} 行（每行 {d} 个元素）中的 {a} 行")
rule(r"(?P<a>\d+) of (?P<n>\d+) \(sample, group\) blocks of (?P<b>\d+)", "{n} 个（样本, 组）块（每块 {b} 个元素）中的 {a} 个")
rule(r"(?P<a>\d+) of (?P<n>\d+) ids", "{n} 个 id 中的 {a} 个")
rule(r"sample 0, (?P<a>\d+) of (?P<c>\d+) channels, window (?P<w>[\dx]+) of (?P<o>[\dx]+)",
     "样本 0，{c} 个通道中的 {a} 个，窗口 {w}（共 {o}）")
rule(r"(?P<a>\d+) of (?P<n>\d+) \(sample, channel\) planes", "{n} 个（样本, 通道）平面中的 {a} 个")
rule(r"(?P<a>\d+) of (?P<h>\d+) heads x (?P<b>\d+) of (?P<q>\d+) queries, all (?P<k>\d+) keys",
     "{h} 个头中的 {a} 个 × {q} 个查询中的 {b} 个，全部 {k} 个键")
# thresholds and decisions
rule(r"< (?P<x>NUM) \(else dual-N\)", "< {x}（否则按 dual-N 判定）")
rule(r"\|ref\| < 2\^(?P<e>-?\d+): abs err <= (?P<x>NUM)", "|ref| < 2^{e}：绝对误差 <= {x}")
rule(r"max abs < (?P<x>NUM)", "最大绝对误差 < {x}")
rule(r"dual-(?P<e>\d+) and dual-(?P<w>\d+)", "dual-{e} 与 dual-{w}")
rule(r"(?P<how>.+), explained by (?P<d>DT) \(within the ratio rule\)", "{how}，可由 {d} 精度解释（在比值规则之内）",
     how=_t)
rule(r"(?P<how>.+); no floor to settle it", "{how}；没有噪声基线可据以裁定", how=_t)
rule(r"(?P<how>.+); ratio rule exceeded: (?P<over>.+)", "{how}；超出比值规则：{over}", how=_t,
     over=_items(", ", "、"))
rule(r"\|ref\| >= 2\^(?P<e>-?\d+)", "|ref| >= 2^{e}（正常值域）")
rule(r"<= (?P<r>NUM) \(floor >= (?P<a>NUM)\)", "<= {r}（噪声基线至少取 {a}）")
rule(r"<= (?P<r>NUM) \(share; floor >= (?P<a>NUM)\)", "<= {r}（按占比；噪声基线至少取 {a}）")

# ---- component (the floor rule) ---------------------------------------------------------------------------------
rule(r"cosine (?P<c>NUM) < (?P<t>NUM)", "余弦相似度 {c} < {t}")
rule(r"no floor: cosine (?P<c>NUM) (?P<op>>=|<) (?P<t>NUM)", "无噪声基线：余弦相似度 {c} {op} {t}")
rule(r"rel-L2 (?P<r>NUM)x the floor's <= (?P<p>NUM)", "rel-L2 为噪声基线的 {r} 倍，<= {p}")
rule(r"rel-L2 (?P<r>NUM)x the floor's, in \((?P<a>NUM), (?P<b>NUM)\]", "rel-L2 为噪声基线的 {r} 倍，位于 ({a}, {b}]")
rule(r"rel-L2 (?P<r>NUM)x the floor's > (?P<f>NUM)", "rel-L2 为噪声基线的 {r} 倍，> {f}")
rule(r">= (?P<x>NUM) \(absolute\)", ">= {x}（绝对界）")
rule(r"<= (?P<p>NUM) PASS, <= (?P<w>NUM) WARN", "<= {p} PASS，<= {w} WARN")
rule(r"(?P<n>\d+) components PASS \((?P<items>.*)\)", "{n} 个组件 PASS（{items}）", items=_items("; ", "；", _named))

# ---- teacher-forced steps ---------------------------------------------------------------------------------------
rule(r"(?P<seed>seed \d+ )?step (?P<i>\d+)", "{seed}第 {i} 步")
rule(r"(?P<key>\w+) cosine", "{key} 余弦相似度")
rule(r"(?P<key>\w+) rel_l2", "{key} 相对 L2 误差")
rule(r"(?P<key>\w+) max_abs", "{key} 最大绝对误差")
rule(r">= (?P<x>NUM) absolute; then rel-L2 / floor", ">= {x}（绝对界）；再看 rel-L2 / 噪声基线")
rule(r"first (?P<v>PASS|WARN|FAIL) at (?P<subject>.+?); first divergent block: (?P<where>.+)",
     "首个 {v} 出现在{subject}；首个分叉 block：{where}", subject=_t, where=_t)
rule(r"(?P<n>\d+) teacher-forced steps: worst rel-L2 (?P<w>NUM)x the floor's \(PASS <= (?P<p>NUM), FAIL > "
     r"(?P<f>NUM)\)(?P<tail>; at the worst step .+)?",
     "{n} 个教师强制步：rel-L2 最大为噪声基线的 {w} 倍（PASS <= {p}，FAIL > {f}）{tail}", tail=_t)
rule(r"(?P<n>\d+) teacher-forced steps without a floor: worst cosine (?P<c>NUM) \(at best WARN\)"
     r"(?P<tail>; at the worst step .+)?",
     "{n} 个教师强制步（无噪声基线）：最差余弦相似度 {c}（最多 WARN）{tail}", tail=_t)
rule(r"; at the worst step \((?P<i>\d+)\) block (?P<b>\S+) exceeds its floor", "；误差最大的第 {i} 步中，block {b} 超出其噪声基线")

# ---- trajectory -------------------------------------------------------------------------------------------------
rule(r"(?P<seed>seed \d+ )?image (?P<k>\d+)", "{seed}图像 {k}")
rule(r"(?P<seed>seed \d+ )?final (?P<key>\w+)", "{seed}最终 {key}")
rule(r"floor (?P<name>mse|cosine|token_agreement)", "噪声基线{name}", name=_t)
rule(r"< (?P<x>NUM) WARN \(no floor: never PASS\), else FAIL", "< {x} WARN（无噪声基线：不会 PASS），否则 FAIL")
rule(r"(?P<a>image RMSE at most .+? dB worst\)); (?P<b>no noise floor for .+)", "{a}；{b}", a=_t, b=_t)
rule(r"(?P<a>image RMSE at most .+? dB worst\)); (?P<b>tokens step by step .+)", "{a}；{b}", a=_t, b=_t)
rule(r"tokens step by step along the device's path: worst (?P<d>NUM)% differ from the reference's step \(floor "
     r"(?P<f>NUM)%; (?P<r>NUM)x floor \+ allowance\)",
     "沿被测设备自身路径逐步比对 token：最多 {d}% 与参考的同一步不同（噪声基线 {f}%；为噪声基线 + 容许量的 {r} 倍）")
rule(r"(?P<seed>seed \d+ )?tokens step by step", "{seed}逐步 token")
rule(r"(?P<seed>seed \d+ )?image (?P<k>\d+) from the device's tokens", "{seed}由被测设备 token 解码的图像 {k}")
# Qwen-Image-Edit's stages after the network, and every other step output (issue 25)
rule(r"(?P<where>.+); after the network: (?P<stage>guided|latents_next|vae_input)", "{where}；网络之后：{stage}",
     where=_t)
rule(r"post (?P<stage>guided|latents_next|vae_input) (?P<what>cosine|rel_l2 / floor|rel_l2|nonfinite_only_device)",
     "网络之后 {stage} {what}", what=_t)
rule(r"(?P<key>\w+) rel_l2 / floor", "{key} rel_l2 / 噪声基线")
rule(r"cosine >= (?P<c>NUM); no floor", "余弦相似度 >= {c}；无噪声基线")
rule(r"sampler (?P<name>jump_prob|rate) cosine", "采样器 {name} 余弦相似度")
rule(r"sampler (?P<name>jump_prob|rate) rel_l2 / floor", "采样器 {name} rel_l2 / 噪声基线")
rule(r"sampler (?P<name>jump_prob|rate) nonfinite_only_device", "采样器 {name} 仅被测设备的 NaN/Inf 个数")
rule(r"<= (?P<p>NUM) PASS, <= (?P<w>NUM) WARN; cosine >= (?P<c>NUM)", "<= {p} PASS，<= {w} WARN；余弦相似度 >= {c}")
rule(r"<= (?P<p>NUM) PASS, <= (?P<w>NUM) WARN \(allowance (?P<a>NUM)\)", "<= {p} PASS，<= {w} WARN（容许量 {a}）")
rule(r"image RMSE at most (?P<r>NUM)x the (?P<label>.+) floor \(PSNR (?P<p>NUM) dB worst\)",
     "图像 RMSE 最大为噪声基线（{label}）的 {r} 倍（最差 PSNR {p} dB）", label=_t)
rule(r"no noise floor for (?P<n>\d+) image\(s\), so not judged against precision: image cosine distance (?P<d>NUM) "
     r"\(diffusers bound < (?P<b>NUM); at best WARN\)",
     "{n} 张图像没有噪声基线，因此不做精度判定：图像余弦距离 {d}（diffusers 界 < {b}；最多 WARN）")

# ---- semantic -------------------------------------------------------------------------------------------------
rule(r"prompts drawn correctly: device (?P<d>\d+)/(?P<n>\d+), reference (?P<r>\d+)/(?P<n2>\d+), floor (?P<f>\d+)/"
     r"(?P<n3>\d+) \((?P<label>.+)\); the device loses (?P<lost>\d+) the reference gets right \((?P<rule>.+)\)",
     "正确绘制的提示词：被测设备 {d}/{n}，参考 {r}/{n2}，噪声基线 {f}/{n3}（{label}）；参考画对而被测设备画错的有 "
     "{lost} 个（{rule}）", label=_t, rule=_t)
rule(r"prompts drawn correctly: device (?P<d>\d+)/(?P<n>\d+), reference (?P<r>\d+)/(?P<n2>\d+), no floor; the device "
     r"loses (?P<lost>\d+) the reference gets right \((?P<rule>.+)\)",
     "正确绘制的提示词：被测设备 {d}/{n}，参考 {r}/{n2}，无噪声基线；参考画对而被测设备画错的有 {lost} 个（{rule}）",
     rule=_t)
rule(r"the reference draws only (?P<r>\d+) of (?P<n>\d+) prompts correctly \(< (?P<p>\d+%)\): the set does not fit "
     r"this model, so meaning cannot be judged",
     "参考只正确绘制了 {n} 个提示词中的 {r} 个（< {p}）：该提示词集不适合此模型，无法判定语义")
rule(r"lost (?P<d>\d+) (?P<op><=|>) (?P<f>\d+) \+ (?P<a>\d+)", "丢失 {d} 个 {op} {f} + {a}")
rule(r"device: expected (?P<e>.+?); found (?P<f>.+? background)(?P<wrong>; wrong: .+)?", "被测设备：期望{e}；检出{f}{wrong}",
     e=_scene, f=_scene, wrong=lambda s: "；错误项：" + "、".join(SHAPE_CHECKS.get(w, w) for w in s[len("; wrong: "):].split(", ")))
rule(r"(?P<checks>(?:background|count|shape|colour|position)(?:, (?:background|count|shape|colour|position))*)",
     "{checks}", checks=_items(", ", "、", _word(SHAPE_CHECKS)))

# ---- msprobe view -----------------------------------------------------------------------------------------------
rule(r"(?P<n>\d+) of (?P<t>\d+) tensor rows hold another dtype on the golden side: msprobe marks them 'dtype "
     r"inconsistent' whatever their values",
     "{t} 行张量中有 {n} 行在标杆侧为另一种 dtype：无论数值如何，msprobe 都将其标为 'dtype inconsistent'")
rule(r"teacher-forced step 0 \(seed (?P<s>\d+)\) on the reference's recorded inputs",
     "参考记录的输入上的教师强制第 0 步（seed {s}）")
rule(r"emulated (?P<d>DT) on (?P<ref>.+) kernels: every (?P<d2>DT) call computed in float32 and rounded \(the "
     r"operator rung's emulation, over the whole step\)",
     "{ref} 内核模拟的 {d}：每个 {d2} 调用都以 float32 计算后舍入（即算子级验证的模拟方式，覆盖整个步）", ref=_t)
rule(r"(?P<ref>.+) \(no floor: msprobe marks every row dtype-inconsistent\)",
     "{ref}（无噪声基线：msprobe 将每一行都标为 dtype 不一致）", ref=_t)
rule(r"(?P<block>\S+): (?P<v>PASS|WARN|FAIL|SKIP) \(first divergent\)", "{block}：{v}（首个分叉）")
rule(r"step (?P<i>\d+): (?P<v>PASS|WARN|FAIL|SKIP)", "第 {i} 步：{v}")

# ---- adaptations ------------------------------------------------------------------------------------------------
rule(r"env (?P<name>[A-Z][A-Z0-9_]*)", "环境变量 {name}")
rule(r"classes (?P<classes>\{.*\})", "组件类 {classes}")
rule(r"disable with '(?P<name>[\w-]+)'", "可用 --disable {name} 关闭")
rule(r"metric path only; disable with '(?P<name>[\w-]+)'", "仅用于 metric 路径；可用 --disable {name} 关闭")
rule(r"_native_npu switched off with '(?P<name>[\w-]+)'", "_native_npu 已由 --disable {name} 关闭")
rule(r"(?P<name>\w+) refused: (?P<err>.+)", "{name} 被拒绝：{err}", err=_t)
rule(r"(?P<dtype>DT) \(model folder\)", "{dtype}（模型目录）")
rule(r"(?P<dtype>DT) from single file", "{dtype}（单文件）")
rule(r"fp8 (?P<fp8>\w+) storage, (?P<dtype>DT) compute", "fp8 {fp8} 存储，{dtype} 计算")
rule(r"(?P<form>plain|scaled) fp8 (?P<dtypes>[\w+]+)(?P<layout> \([\w+-]+ scales\))?(?P<prefix>, keys prefixed '[^']*')?"
     r"(?P<zc>, zero_cond_t marker)?(?P<scaled>, scales applied per forward)?"
     r"(?P<rest>; biases, norms and non-fp8 tensors in \w+)?",
     "{form} fp8 {dtypes}{layout}{prefix}{zc}{scaled}{rest}", form=_FP8_FORM,
     layout=lambda s: f"（{s.strip()[1:-len(' scales)')]} 缩放）",
     prefix=_prefixed(", keys prefixed ", "，键名前缀 {}"), zc=lambda _s: "，带 zero_cond_t 标记",
     scaled=lambda _s: "，每次前向时应用缩放", rest=_prefixed("; biases, norms and non-fp8 tensors in ",
                                                        "；偏置、归一化层及非 fp8 张量为 {}"))
rule(r"unquantized single-file transformer(?P<prefix>, keys prefixed '[^']*')?(?P<zc>, zero_cond_t marker)?",
     "未量化的单文件 transformer{prefix}{zc}", prefix=_prefixed(", keys prefixed ", "，键名前缀 {}"),
     zc=lambda _s: "，带 zero_cond_t 标记")
rule(r"override: ?(?P<label>.+)", "覆盖实现：{label}")
rule(r"installed on (?P<n>\d+) modules of this pipeline only", "仅安装在本流水线的 {n} 个模块上")
rule(r"(?P<label>\w+): regional \(decoder layer\)", "{label}：区域编译（decoder layer）")
rule(r"(?P<label>\w+): regional \(each transformer block, diffusers compile_repeated_blocks\)",
     "{label}：区域编译（逐个 transformer block，diffusers compile_repeated_blocks）")
rule(r"(?P<detail>.+); compiled lazily on the first step; exact within floating-point noise, not bit for bit",
     "{detail}；在第一步时惰性编译；在浮点噪声范围内等价，并非逐位一致", detail=_t)
rule(r"(?P<detail>.+); exact within floating-point noise, not bit for bit", "{detail}；在浮点噪声范围内等价，并非逐位一致",
     detail=_t)
rule(r"mode (?P<mode>[\w-]+)", "模式 {mode}")
rule(r"(?P<mod>[\w.]+)\.get_npu_backend\(\) failed: (?P<err>.+)", "{mod}.get_npu_backend() 失败：{err}")
rule(r"philox4x32-10 on (?P<dev>\w+)(?P<fused> \(Gumbel-max block compiled\))?", "philox4x32-10，位于 {dev}{fused}",
     fused=lambda _s: "（Gumbel-max 块已编译）")
rule(r"the (?P<name>\w+) backend's default", "{name} 后端的默认值")
rule(r"(?P<why>.+?); the portable stream: Gumbel-max on the device keyed by \(seed, step, position\), no host draw "
     r"or sync, the same tokens on every device up to near-tied logits - not the reference's CPU stream "
     r"\('--disable philox-rng' for that\)",
     "{why}；可移植的随机数流：在设备上做 Gumbel-max，以 (seed, step, position) 为键，无主机端采样或同步，除 logits "
     "近乎相等的情况外各设备上得到相同的 token——不是参考的 CPU 随机数流（要用后者请加 '--disable philox-rng'）",
     why=_t)
rule(r"(?P<why>.+?); the reference's own stream, its tokens bit for bit on the CPU in float32"
     r"(?P<host>; every draw is made on the host and copied, with one host sync per step \('--fast philox-rng' draws "
     r"on the device\))?",
     "{why}；参考自身的随机数流，在 CPU 上以 float32 运行时 token 逐位一致{host}", why=_t,
     host=lambda _s: "；每次采样都在主机上进行后拷贝，每步一次主机同步（'--fast philox-rng' 在设备上采样）")
rule(r"(?P<plan>[\w-]+): transformer moved to cpu before decode", "{plan}：解码前将 transformer 移到 cpu")
rule(r"(?P<name>\w+): SDPA picks flash/efficient kernels itself", "{name}：SDPA 自行选择 flash/efficient 内核")
rule(r"First-Block-Cache \(threshold (?P<x>NUM)\)", "First-Block-Cache（阈值 {x}）")
rule(r"TaylorSeer \(refresh every (?P<n>\d+) steps\)", "TaylorSeer（每 {n} 步刷新一次）")
rule(r"same rotation as diffusers' complex64 product, float rounding only; disable with '(?P<name>[\w-]+)'",
     "与 diffusers 的 complex64 乘积旋转相同，仅有浮点舍入差异；可用 --disable {name} 关闭")
rule(r"shorter text padded once per run; each row attends only to its own text, unmasked; equals two batch-1 calls "
     r"within float rounding; disable with '(?P<name>[\w-]+)'",
     "较短的文本每次运行只补齐一次；每行只关注自身文本，无掩码；在浮点舍入范围内等于两次 batch-1 调用；"
     "可用 --disable {name} 关闭")
rule(r"cfg-parallel: conditional half on rank 0, unconditional on rank 1 \((?P<b>\w+), one all-gather of the logits "
     r"per guided step\)",
     "cfg-parallel：CFG batch 的条件部分在 rank 0、无条件部分在 rank 1 上运行（{b}，每个引导步一次 logits 的 all-gather）")
rule(r"cfg-parallel: conditional on rank 0, unconditional on rank 1 \((?P<b>\w+), one all-gather per step\)",
     "cfg-parallel：条件分支在 rank 0、无条件分支在 rank 1 上运行（{b}，每步一次 all-gather）")

# ---- off-identity (validate/identity.py Identity.note): an exact optimisation that is not exact on this device -----
rule(r"Off-identity: on this device the exact optimisations (?P<names>.+) change the picture \((?P<p>NUM) % of pixels "
     r"differ, up to (?P<lv>\d+) levels\) against their off state, so here they are approximate optimisations; the "
     r"rungs above judged the validated run with them on\.",
     "关闭一致性检查：在本设备上，等价优化 {names} 与关闭时相比改变了图像（{p} % 的像素不同，最大相差 {lv} 级），"
     "因此在此处为近似优化；以上各级验证已在开启它的情况下评判了被验证的运行。")

# ---- the compile line of an unasked choice (devices/compile.py auto_compile; models/ursa/pipeline.py) -----------
EXACT["eager (auto)"] = "eager（自动选择）"
rule(r"(?P<label>\w+): regional \(decoder layer\), chosen automatically", "{label}：区域编译（decoder layer），自动选择")
rule(r"auto: eager; compile is never chosen unasked on (?P<dev>\w+) \(the reference's device keeps eager's exact "
     r"tokens; --compile asks\)", "自动：eager；在 {dev} 上从不自动编译（参考设备保持 eager 的精确 token；可用 --compile 请求）")
rule(r"auto: eager; no compiler here \((?P<why>.+)\)", "自动：eager；此处没有可用的编译器（{why}）")
rule(r"auto: eager; no eager step measured yet at this size to estimate the saving",
     "自动：eager；此尺寸下没有测得 eager 步时，无法预计编译是否值得")
rule(r"auto: compiled by an earlier call of this pipeline \(cost already paid\)",
     "自动：已由本流水线之前的调用编译（编译耗时已付出）")
rule(r"auto: (?P<choice>compiled|eager); (?P<done>\d+) \+ (?P<now>\d+) steps x (?P<ms>NUM) ms x (?P<share>NUM) saved = "
     r"(?P<lost>NUM) s (?P<cmp>>=|<) (?P<cost>NUM) s estimated compile \((?P<cache>warm|cold) cache\)"
     r"(?P<rest>; .+)?",
     "自动：{choice}；{done} + {now} 步 × {ms} ms × 可减少的比例 {share} = {lost} s {cmp} 预计编译耗时 {cost} s（{cache}）{rest}",
     choice=_word({"compiled": "编译", "eager": "eager"}), cache=_word({"warm": "缓存已热", "cold": "缓存为冷"}),
     rest=lambda s: "；" + "；".join(_t(p) for p in s[2:].split("; ")))
EXACT.setdefault("not bit for bit", "并非逐位一致")
