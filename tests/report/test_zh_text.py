"""The Chinese report is complete: every run-time sentence validate writes has a translation (issue 11, item 4).

Two halves:

* the catalogue (:mod:`difforge.report.zh_text`): a table of English sentences as the code writes them and the
  Chinese each must become - every EXACT entry and at least one example per PATTERN - with checks that
  numbers and code survive, that nothing English is left, and that every EXACT key is a string the code
  really writes (read from the source's string literals);
* real validations (tiny-ursa bf16 clean; tiny-ursa whose bf16 decode is blanked, so the smoke rung fails
  and every later rung is skipped; and, marked slow, tiny-ursa with a planted RoPE fault the step rung
  localises, and tiny-qwen-edit): every run-time text of each ValidationResult must translate to Chinese
  with no English sentence left, and the zh report.html / report.md rendered from it by
  :func:`difforge.report.write_report` are read as a reviewer sees them by :func:`.zh_check.english_left`.

The validations run with a report writer that writes nothing (each test renders the report itself), at
32x32, 2 steps, one timed round and no warm-up: about 40 s of CPU for the two fast ones.
"""

from __future__ import annotations

import ast
import dataclasses
import html
import re
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from difforge.report import write_report, zh_text
from difforge.report.zh_text import EXACT, PATTERNS, SOURCES_ZH, translate, translator
from difforge.validate import ValidateOptions, ValidationResult, Verdict, run_validation
from difforge.validate.thresholds import SOURCES

from .zh_check import english_left, visible_html, visible_markdown

SRC = Path(zh_text.__file__).resolve().parents[1]  # src/difforge

#: EXACT: every whole-string entry (measurement names, subjects, fixed findings, adaptations).
EXACT_EXAMPLES: list[tuple[str, str]] = [
    ('vae convs', 'VAE 卷积'),
    ("diffusers' causal 3-D convolutions", 'diffusers 的因果 3-D 卷积'),
    ("a one-frame causal conv3d is the conv2d of its last temporal tap: the same products in another order, float "
     "rounding only (2.5-5x faster VAE on a CPU); disable with 'vae-2d'",
     '单帧输入的因果 conv3d 等于用其最后一个时间维权重做的 conv2d：乘积相同，仅求和顺序不同，只有浮点舍入差异（CPU 上 VAE 快 '
     "2.5-5 倍）；用 'vae-2d' 关闭"),
    ('status', '状态'),
    ('wall_s', '耗时 (s)'),
    ('peak_device_mib', '设备内存峰值 (MiB)'),
    ('peak_host_rss_mib', '主机内存峰值 RSS (MiB)'),
    ('nonfinite', 'NaN/Inf 个数'),
    ('std_levels', '标准差（灰度级）'),
    ('saturated_share', '饱和像素占比'),
    ('images', '图像数'),
    ('same size', '尺寸相同'),
    ('bitwise_identical', '逐位一致'),
    ('rmse_levels', 'RMSE（灰度级）'),
    ('max_abs_levels', '最大绝对差（灰度级）'),
    ('pixels_differing', '不同像素占比'),
    ('median_s', '中位耗时 (s)'),
    ('min_s', '最短耗时 (s)'),
    ('max_s', '最长耗时 (s)'),
    ('steps_per_s', '每秒步数 (it/s)'),
    ('forwards_per_step', '每步前向次数'),
    ('tokens_per_forward', '每次前向 token 数'),
    ('flops_per_step', '每步 FLOPs'),
    ('achieved_tflops', '实测算力 (TFLOP/s)'),
    ('peak_tflops', '峰值算力 (TFLOP/s)'),
    ('mfu', '算力利用率 (MFU)'),
    ('impl', '实现'),
    ('shape', '形状'),
    ('NaN/Inf only on device', '仅被测设备出现 NaN/Inf'),
    ('cosine', '余弦相似度'),
    ('max_abs_err', '最大绝对误差 (MaxAbsErr)'),
    ('max_rel_err', '最大相对误差 (MaxRelErr)'),
    ('share rel err > 0.1%', '相对误差 > 0.1% 的占比'),
    ('share rel err > 0.01%', '相对误差 > 0.01% 的占比'),
    ('elements compared', '比对元素数'),
    ('floor max_rel_err', '噪声基线最大相对误差'),
    ('floor small-value errors', '噪声基线小值误差数'),
    ('msprobe pre-check tree, then ratio rule (floors raised to allowances)',
     'msprobe 预检决策树，再按比值规则（噪声基线抬升到容许值）'),
    ('share rel err > 1%', '相对误差 > 1% 的占比'),
    ('small-value errors', '小值误差数'),
    ('rmse / floor', 'RMSE / 噪声基线'),
    ('max_rel / floor', '最大相对误差 / 噪声基线'),
    ('small errors / floor', '小值误差 / 噪声基线'),
    ('decision', '判定依据'),
    ('where', '位置'),
    ('rel-L2 / floor', 'rel-L2 / 噪声基线'),
    ('calls judged', '已判定调用数'),
    ('calls', '调用数'),
    ('rel_l2', '相对 L2 误差 (rel_l2)'),
    ('floor rel_l2', '噪声基线 rel_l2'),
    ('rel_l2 / floor', 'rel_l2 / 噪声基线'),
    ('max_abs', '最大绝对误差'),
    ('nonfinite_only_device', '仅被测设备的 NaN/Inf 个数'),
    ('floor cosine', '噪声基线余弦相似度'),
    ('argmax agreement', 'argmax 一致率'),
    ('floor argmax agreement', '噪声基线 argmax 一致率'),
    ('sampled-token agreement', '采样 token 一致率'),
    ('floor sampled agreement', '噪声基线采样 token 一致率'),
    ('replay self-check cosine', '重放自检余弦相似度'),
    ('mse', '均方误差 (MSE)'),
    ('mae', '平均绝对误差 (MAE)'),
    ('psnr_db', 'PSNR (dB)'),
    ('ssim', 'SSIM'),
    ('within_1', '±1 级内像素占比'),
    ('within_4', '±4 级内像素占比'),
    ('within_16', '±16 级内像素占比'),
    ('floor_rmse_levels', '噪声基线 RMSE（灰度级）'),
    ('floor_psnr_db', '噪声基线 PSNR (dB)'),
    ('floor_ssim', '噪声基线 SSIM'),
    ('cos distance (no floor)', '余弦距离（无噪声基线）'),
    ('token_agreement', 'token 一致率'),
    ('load', '加载'),
    ('encode', '编码'),
    ('denoise', '去噪'),
    ('decode', '解码'),
    ('save', '保存'),
    ('run', '运行'),
    ('output', '输出'),
    ('denoising step', '单步去噪'),
    ('end to end (without load)', '端到端（不含加载）'),
    ('normalised', '归一化指标'),
    ('joint attention (block 0)', '联合注意力（block 0）'),
    ('floor rule', '噪声基线规则'),
    ('msprobe pre-check tree, then ratio rule', 'msprobe 预检决策树，再按比值规则'),
    ('all phases completed; output finite and not blank', '各阶段均已完成；输出无 NaN/Inf 且非空白'),
    ('the run returned no image', '运行未返回任何图像'),
    ('only one run with this seed', '该 seed 只有一次运行'),
    ('1 grey level (no floor)', '1 个灰度级（无噪声基线）'),
    ('no timed rounds', '没有计时轮次'),
    ('no op calls captured', '未捕获到任何算子调用'),
    ('NaN/Inf or cosine', 'NaN/Inf 或余弦相似度'),
    ('whole call', '整个调用'),
    ('whole attention sub-module (projections, q/k norm, RoPE, kernel)', '整个注意力子模块（投影、q/k 归一化、RoPE、内核）'),
    ('NaN in the comparison', '比对中出现 NaN'),
    ('after the last block (final norm / head)', '最后一个 block 之后（最终归一化 / 输出头）'),
    ("no noise floor: precision not judged, only diffusers' absolute fp16 bound", '无噪声基线：不做精度判定，仅按 diffusers 的 fp16 绝对界检查'),
    ('no image to judge: the device and the reference produced no comparable image', '没有可判定的图像：被测设备与参考未产生可比较的图像'),
    ('every rung was skipped, so nothing was judged', '所有验证层级均被跳过，未做任何判定'),
    ('no reason given', '未给出原因'),
    ('skipped: the smoke run failed', '已跳过：基本运行失败'),
    ('the reference run recorded no step', '参考运行未记录任何步'),
    ('the reference runs', '参考运行'),
    ('the gallery', '生成样例'),
    ('the msprobe view', 'msprobe 视图'),
    ('the validation stopped before it', '验证在此之前已停止'),
    ('the reference could not be loaded', '参考无法加载'),
    ('the family default', '模型族默认值'),
    ('prompt', '提示词'),
    ('device correct', '被测设备正确'),
    ('reference correct', '参考正确'),
    ('floor correct', '噪声基线正确'),
    ('device checks failed', '被测设备未通过的检查'),
    ('no prompt with expected attributes', '没有带预期属性的提示词'),
    ('no prompt set with expected attributes for this model (--prompt-set)', '该模型没有带预期属性的提示词集（--prompt-set）'),
    ('a golden bundle holds no reference runs of the prompt set; validate without --golden to judge meaning', '标杆数据包中没有该提示词集的参考运行；要判定语义，请不带 --golden 运行 validate'),
    ('none (self-comparison: not a port test)', '无（自比对：不是适配测试）'),
    ('no --image given: edits use a synthetic test picture (input_synthetic.png)', '未给出 --image：编辑任务使用合成测试图（input_synthetic.png）'),
    ("no --image given: edits use the model's own held-out source picture (input_synthetic.png)",
     '未给出 --image：编辑任务使用模型自带的输入图（input_synthetic.png）'),
    ("no --image given: edits use the golden bundle's synthetic test picture", '未给出 --image：编辑任务使用标杆数据包中的合成测试图'),
    ("no --image given to the capture: edits use the capture's synthetic test picture", '未给出 --image：编辑任务使用捕获数据包中的合成测试图'),
    ('msprobe\'s CLI prints "[ERROR] Please verify that the CANN environment is properly configured." on a machine without CANN (its offline-model comparison imports CANN\'s acl at start-up); comparing dumps does not use CANN, so difforge drops that line from the compare log: it is not an error here', '在没有 CANN 的机器上，msprobe 的命令行会打印 "[ERROR] Please verify that the CANN environment is properly configured."（其离线模型比对在启动时导入 CANN 的 acl）；比对 dump 并不使用 CANN，因此 difforge 从比对日志中删去这一行：此处它不是错误'),
    ('neither a floor nor the reference is loaded', '噪声基线与参考均未加载'),
    ('the reference run recorded no step to dump', '参考运行未记录可供 dump 的步'),
    ('weights', '权重'),
    ('transformer weights', 'transformer 权重'),
    ('vae decoder dtype', 'VAE 解码器 dtype'),
    ('lm_head rows', 'lm_head 计算行'),
    ('first forward', '首次前向'),
    ('rope table', 'RoPE 表'),
    ('host draws', '主机端采样'),
    ('unguided tail', '无引导尾段'),
    ('compile', '编译'),
    ('random stream', '随机数流'),
    ('offload', '卸载'),
    ('denoise loop', '去噪循环'),
    ('step cache', '步缓存'),
    ('torch (fp32 rsqrt factor)', 'torch（fp32 rsqrt 因子）'),
    ('torch (fp32 g*u/(1+exp(-g)))', 'torch（fp32 g*u/(1+exp(-g))）'),
    ('torch (interleaved pairs)', 'torch（交错成对）'),
    ('safetensors, strict state-dict load', 'safetensors，严格 state-dict 加载'),
    ('static pickle walk (never unpickled)', '静态遍历 pickle（从不反序列化）'),
    ('sampler rows only', '仅采样器所需的行'),
    ('all positions (reference)', '全部位置（参考）'),
    ('shared by steps 0 and 1', '第 0 步与第 1 步共用'),
    ('one forward per step (reference)', '每步一次前向（参考）'),
    ('built once per call', '每次调用构建一次'),
    ('built every forward (reference)', '每次前向都构建（参考）'),
    ('pinned memory, asynchronous copy', '锁页内存，异步拷贝'),
    ('pageable memory (blocking copy)', '可分页内存（阻塞拷贝）'),
    ('cond-only forward when t >= guidance_trunc', 't >= guidance_trunc 时仅做条件前向'),
    ('eager (compile requested)', 'eager（已请求编译）'),
    ('reference: CPU torch.Generator, host draws', '参考：CPU torch.Generator，主机端采样'),
    ('diffusers RMSNorm', 'diffusers RMSNorm'),
    ('diffusers processor', 'diffusers 处理器'),
    ('real-valued RoPE: (cos, sin) float32 tables cached on the device', '实值 RoPE：(cos, sin) float32 表缓存在设备上'),
    ('diffusers complex64 RoPE (torch.polar / view_as_complex)', 'diffusers complex64 RoPE（torch.polar / view_as_complex）'),
    ('one batch-2 transformer call per step (prompt + negative prompt)', '每步一次 batch-2 的 transformer 调用（提示词 + 负向提示词）'),
    ("two batch-1 transformer calls per step (diffusers' true CFG)", '每步两次 batch-1 的 transformer 调用（diffusers 的 true CFG）'),
    ('static shapes; a host sync in each transformer call (first-block-cache)', '静态形状；每次 transformer 调用有一次主机同步（first-block-cache）'),
    ('no host syncs, static shapes', '无主机同步，静态形状'),
    ('tiled decode/encode', '分块解码/编码'),
    ('torch.nn.functional.scaled_dot_product_attention, no mask', 'torch.nn.functional.scaled_dot_product_attention，无掩码'),
    ('ids cast to int64 before embedding lookups', '嵌入查表前将 ids 转为 int64'),
    ('fused kernel; rounding differs from fp32-rsqrt path', '融合算子；舍入方式与 fp32-rsqrt 路径不同'),
    ('on a packed [gate, up] weight built at load time', '作用于加载时打包的 [gate, up] 权重'),
    ('rotate-half layout (same attention, other reduction order)', 'rotate-half 布局（注意力相同，归约顺序不同）'),
    ('BSND layout, GQA native, no mask', 'BSND 布局，原生 GQA，无掩码'),
    ('injected by the caller', '由调用方注入'),
    ('transformer and VAE; scheduler codebook kept float16 like the reference', 'transformer 与 VAE；调度器码本与参考一致，保持 float16'),
    ('u + (c - u) differs from c by an ulp', 'u + (c - u) 与 c 相差一个 ulp'),
    ('VAE kept on cpu between calls', '两次调用之间 VAE 留在 cpu 上'),
    ('opt-in preset asked for with --preset', '经 --preset 要求启用的可选预设'),
    ('preset applied because it was unset', '该变量未设置，因此应用了预设'),
    ("--preset asked for it, but the user's exported value was kept", '--preset 要求设置该变量，但保留了用户已导出的值'),
    ('the NPU fused kernel needs bf16/fp16', 'NPU 融合算子需要 bf16/fp16'),
    ("QwenImage's rotary embedding as shipped; devices without complex kernels need a real-valued form", 'QwenImage 原版的旋转位置编码；不支持复数内核的设备需要实值形式'),
    ("diffusers' First-Block-Cache reads block 0's residual change with .item() (every call after the first) to decide whether to skip the other blocks; nothing else syncs except a step_hook's CPU copies", 'diffusers 的 First-Block-Cache 用 .item() 读取 block 0 的残差变化（首次之后的每次调用），以决定是否跳过其余 block；除 step_hook 的 CPU 拷贝外没有其他同步'),
    ("timesteps stay on the device, texts padded once per run; a step_hook's CPU copies are the only syncs", '时间步留在设备上，文本每次运行只补齐一次；唯一的同步是 step_hook 的 CPU 拷贝'),
    ("diffusers FirstBlockCacheConfig: later blocks are skipped when block 0's residual barely changes", 'diffusers FirstBlockCacheConfig：block 0 的残差几乎不变时跳过后续 block'),
    ('diffusers TaylorSeerCacheConfig: block outputs predicted by a Taylor expansion between refreshes', 'diffusers TaylorSeerCacheConfig：两次刷新之间用泰勒展开预测 block 输出'),
    ('accelerate hooks move one whole component to the device when it runs', 'accelerate 钩子在组件运行时将整个组件移到设备上'),
    ("accelerate hooks stream every layer's weights to the device (slow, least memory)", 'accelerate 钩子将每一层的权重流式传到设备上（慢，内存占用最少）'),
    ('transformer and text encoder move to the host before VAE decode', 'VAE 解码前将 transformer 与文本编码器移到主机'),
    ('diffusers AutoencoderKLQwenImage tiling', 'diffusers AutoencoderKLQwenImage 分块'),
    ('unquantized single-file transformer', '未量化的单文件 transformer'),
    ('default mode', '默认模式'),
    ('this torch has no torch.compile', '当前 torch 没有 torch.compile'),
    ('torchair is not importable', '无法导入 torchair'),
    ("no C++ compiler on PATH (Inductor's CPU backend needs one)", 'PATH 上没有 C++ 编译器（Inductor 的 CPU 后端需要）'),
    ("ATEN_CPU_CAPABILITY=default: Inductor's CPU kernels need a vector kernel family (avx2, avx512, neon ...)", 'ATEN_CPU_CAPABILITY=default：Inductor 的 CPU 内核需要向量指令族（avx2、avx512、neon ...）'),
    ('named by the run', '由本次运行指定'),
    # URSA's sampler step and tokens (issue 25)
    ('sampler x1 agreement',
     '采样器目标码 x1 一致率'),
    ('sampler token disagreement',
     '采样器 token 不一致率'),
    ('sampler floor token disagreement',
     '噪声基线采样器 token 不一致率'),
    ('sampler tokens / (floor + allowance)',
     '采样器 token 不一致率 / (噪声基线 + 容许量)'),
    ('tokens / (floor + allowance)',
     'token 不一致率 / (噪声基线 + 容许量)'),
    ('token-steps compared',
     '比对的 token 步数'),
    ('device flips',
     '被测设备翻转数'),
    ('floor flips',
     '噪声基线翻转数'),
    ('one-step disagreement',
     '单步 token 不一致率'),
    ('floor one-step disagreement',
     '噪声基线单步 token 不一致率'),
    ('one-step disagreement (no floor)',
     '单步 token 不一致率（无噪声基线）'),
    ('tokens not judged: no noise floor',
     'token 未判定：没有噪声基线'),
    ("informative: one early near-boundary draw changes every later step of a free run, so the final tokens are judged step by step (the row 'tokens step by step')",
     '仅供参考：自由运行中早期一次落在边界附近的抽样会改变之后每一步，因此 token 按步判定（见“逐步 token”一行）'),
    ("tokens not judged: the sides drew from the reference's CPU stream, which falls out of step between them (judged on the portable Philox stream: --fast philox-rng)",
     'token 未判定：各方从参考的 CPU 随机流抽样，彼此会失去同步（在可移植的 Philox 流上判定：--fast philox-rng）'),
    ('end-to-end rmse / floor',
     '端到端 RMSE / 噪声基线'),
    ("informative on a shared stream: the picture's tokens are judged step by step and its pixels from the device's own tokens (the rows below)",
     '共享随机流上仅供参考：图像的 token 按步判定，像素按被测设备自身的 token 判定（见下方各行）'),
    ('eager (auto)',
     'eager（自动选择）'),
    ('not bit for bit',
     '并非逐位一致'),
]

#: PATTERNS: sentences as the rungs, the ladder, the runner and the pipelines build them (numbers and names
#: as a run fills them in), each pattern with at least one example.
PATTERN_EXAMPLES: list[tuple[str, str]] = [
    ("the golden bundle /tmp/g was not checked against an external digest (no --golden-digest): its SHA256SUMS shows "
     "only that its files agree with one another, and a bundle changed with its sums recomputed would pass too; its "
     "digest is 0a1b2c",
     "标杆数据包 /tmp/g 未经外部核对（未给出 --golden-digest）：其 SHA256SUMS 只表示其中各文件之间一致，改动后重新计算 "
     "SHA256SUMS 的数据包同样能通过；其 sha256 为 0a1b2c"),
    ("the prompt 'a purple star' leaves what shapes-ursa was trained on: 'purple', 'star' are outside "
     "shapes-ursa's vocabulary of 27 words; expect a picture that does not follow it.",
     "提示词 'a purple star' 超出 shapes-ursa 所学范围：'purple', 'star' 不在 shapes-ursa 的 27 词词表中；"
     "生成的图片可能与之不一致。"),
    ("'sunset' is outside shapes-qwen-edit's vocabulary of 40 words", "'sunset' 不在 shapes-qwen-edit 的 40 词词表中"),
    ("it is not a caption of the shapes world shapes-ursa was trained on ('a <colour> <shape> on a <colour> "
     "background')", "它不是 shapes-ursa 所学的 shapes 图形说明（“a <colour> <shape> on a <colour> background”）"),
    ("it names 2 items; shapes-ursa was trained on captions of 1 item", "它含 2 个图形；shapes-ursa 只学过含 1 个图形的说明"),
    ('2-D convolutions on single pictures (45 causal convs)', '单张图片上的 2-D 卷积（45 个因果卷积）'),
    ('RuntimeError: the reference run recorded no step to dump',
     'RuntimeError: 参考运行未记录可供 dump 的步'),
    ('GoldenError: the golden bundle has no run for seed 3',
     'GoldenError: 标杆数据包中没有 seed 3 的运行'),
    ('the golden bundle has no step 4 for seed 0',
     '标杆数据包中没有 seed 0 的第 4 步'),
    ('emulated bfloat16 on cpu float32 kernels (golden bundle)',
     'cpu float32 内核模拟的 bfloat16（标杆数据包）'),
    ('cpu float32 (golden bundle)',
     'cpu float32（标杆数据包）'),
    ('emulated bfloat16 on cpu float32 kernels',
     'cpu float32 内核模拟的 bfloat16'),
    ('cpu float32 (the reference itself)',
     'cpu float32（参考本身）'),
    ('cuda:0 bfloat16, nearest to float16',
     'cuda:0 bfloat16（最接近 float16）'),
    ('npu:0 bfloat16 (--floor)',
     'npu:0 bfloat16（--floor）'),
    ('none (cpu runs none of float16, bfloat16)',
     '无（cpu 不支持 float16, bfloat16 中的任何一种）'),
    ('none (the reference could not be loaded)',
     '无（参考无法加载）'),
    ("the floor's RMSE (emulated bfloat16 on cpu float32 kernels)",
     '噪声基线的 RMSE（cpu float32 内核模拟的 bfloat16）'),
    ('the step rung did not run',
     '逐步教师强制验证未运行'),
    ('the operator rung was skipped (skipped: the smoke run failed)',
     '算子级验证被跳过（已跳过：基本运行失败）'),
    ('the component rung was skipped (no reason given)',
     '组件级验证被跳过（未给出原因）'),
    ('out of memory: cpu ran out of memory; offloading cannot help on the CPU (the weights already live in host memory): reduce --height/--width, use --vae-tiling or use --dtype bfloat16.',
     '内存不足：cpu 内存不足；在 CPU 上卸载无济于事（权重本就在主机内存中）：请减小 --height/--width、使用 --vae-tiling 或使用 --dtype bfloat16。'),
    ('cpu ran out of memory; offloading cannot help on the CPU (the weights already live in host memory): reduce --height/--width or use --dtype bfloat16.',
     'cpu 内存不足；在 CPU 上卸载无济于事（权重本就在主机内存中）：请减小 --height/--width 或使用 --dtype bfloat16。'),
    ('npu:0 ran out of memory with --offload none; retry with --offload before-decode.',
     'npu:0 在 --offload none 下内存不足；请改用 --offload before-decode 重试。'),
    ('npu:0 ran out of memory with --offload model; retry with --offload sequential and --vae-tiling.',
     'npu:0 在 --offload model 下内存不足；请改用 --offload sequential 并加 --vae-tiling 重试。'),
    ('npu:0 ran out of memory with --offload model; reduce --height/--width or use a smaller --dtype.',
     'npu:0 在 --offload model 下内存不足；请减小 --height/--width 或使用更小的 --dtype。'),
    ('npu:0 ran out of memory with --offload sequential; reduce --height/--width or use --vae-tiling.',
     'npu:0 在 --offload sequential 下内存不足；请减小 --height/--width 或使用 --vae-tiling。'),
    ('not available for this pipeline: component_inputs',
     '该流水线不支持：component_inputs'),
    ('error: RuntimeError: the reference run recorded no step to dump',
     '错误：RuntimeError: 参考运行未记录可供 dump 的步'),
    ('not run: the reference could not be loaded (FileNotFoundError: model_index.json)',
     '未运行：参考无法加载（FileNotFoundError: model_index.json）'),
    ('not run: the validation stopped before it',
     '未运行：验证在此之前已停止'),
    ('the reference (cpu float32) could not be loaded: FileNotFoundError: model_index.json',
     '参考（cpu float32）无法加载：FileNotFoundError: model_index.json'),
    ('the emulated floor failed to load (RuntimeError: boom)',
     '模拟噪声基线加载失败（RuntimeError: boom）'),
    ('the gallery failed (RuntimeError: boom)',
     '生成样例失败（RuntimeError: boom）'),
    ('the msprobe view failed (RuntimeError: the reference run recorded no step to dump)',
     'msprobe 视图失败（RuntimeError: 参考运行未记录可供 dump 的步）'),
    ('the reference runs failed (RuntimeError: boom)',
     '参考运行失败（RuntimeError: boom）'),
    ('the reference run (seed 0) failed (RuntimeError: boom)',
     '参考运行（seed 0）失败（RuntimeError: boom）'),
    ('the device run (seed 2) failed (RuntimeError: boom)',
     '被测设备运行（seed 2）失败（RuntimeError: boom）'),
    ('the capture was made under --max-bytes 1000000 (level 3: 1 operator calls per op type and component, 262144 '
     'B per call, 4096 output elements per call, block outputs sampled to 1024); the operator rung judges those '
     'calls and samples, the other rungs what validate keeps',
     '捕获数据包在 --max-bytes 1000000 下生成（第 3 级：每个组件每种算子保留 1 次调用，每次调用 262144 B，比较 4096 个输出元素，'
     '各块输出采样 1024 个元素）；算子级验证判定所保留的调用与采样，其余各级验证判定 validate 保留的全部内容'),
    ('reading the golden run (seed 1) failed (GoldenError: the golden bundle has no run for seed 1)',
     '读取标杆数据包中的运行（seed 1）失败（GoldenError: 标杆数据包中没有 seed 1 的运行）'),
    ('the floor run (emulated bfloat16 on cpu float32 kernels, seed 0) failed (RuntimeError: boom)',
     '噪声基线运行（cpu float32 内核模拟的 bfloat16，seed 0）失败（RuntimeError: boom）'),
    ('loading the floor cuda bfloat16 failed (RuntimeError: boom)',
     '加载噪声基线 cuda bfloat16 失败（RuntimeError: boom）'),
    ("the device under test (cuda:0 bfloat16, NVIDIA H200) ran elsewhere: its half of this validation is the capture /data/cap-ursa (made 2026-12-04T10:00:00Z by difforge 0.9.0, digest bebcd515428e6dce); the reference and the floor ran here, teacher-forced on the device's own recorded states",
     '被测设备（cuda:0 bfloat16，NVIDIA H200）在别处运行：本次验证中属于它的部分来自捕获数据包 /data/cap-ursa（由 difforge 0.9.0 于 2026-12-04T10:00:00Z 生成，sha256 bebcd515428e6dce）；参考与噪声基线在本机运行，在被测设备记录的状态上进行教师强制'),
    ('on the device: error: RuntimeError: CUDA_ERROR_ILLEGAL_ADDRESS',
     '在被测设备上：错误：RuntimeError: CUDA_ERROR_ILLEGAL_ADDRESS'),
    ("reference and floor read from the golden bundle /data/golden-ursa (made 2026-12-01T10:00:00Z by difforge 0.9.0): nothing of them ran here; the operator rung replays the device's captured calls on this host's float32 kernels",
     '参考与噪声基线读取自标杆数据包 /data/golden-ursa（由 difforge 0.9.0 于 2026-12-01T10:00:00Z 生成）：二者均未在本机运行；算子级验证在本机的 float32 内核上重放被测设备捕获的调用'),
    ('steps 25 -> 4',
     '步数 25 -> 4'),
    ('steps the family default -> 4',
     '步数 模型族默认值 -> 4'),
    ('prompts 3 -> 1',
     '提示词数 3 -> 1'),
    ('rounds 3 -> 2',
     '计时轮数 3 -> 2'),
    ('warmup 2 -> 1',
     '预热轮数 2 -> 1'),
    ('no precision floor: the emulated floor failed to load (RuntimeError: boom); the trajectory is judged only by an absolute bound, at best WARN',
     '无精度噪声基线：模拟噪声基线加载失败（RuntimeError: boom）；完整轨迹仅按绝对界判定，最多为 WARN'),
    ('no precision floor: cpu runs none of float16, bfloat16; the trajectory is judged only by an absolute bound, at best WARN',
     '无精度噪声基线：cpu 不支持 float16, bfloat16 中的任何一种；完整轨迹仅按绝对界判定，最多为 WARN'),
    ('self-comparison asked for (--allow-self-compare): cpu float32 is the reference itself, so this report is not a port test',
     '按要求进行自比对（--allow-self-compare）：cpu float32 即参考本身，因此本报告不是适配测试'),
    ('device and reference share float32: the floor is the reference itself (zero), raised to the 1-level quantisation step',
     '被测设备与参考同为 float32：噪声基线即参考本身（为零），提高到 1 个灰度级的量化步长'),
    ("the precision floor is emulated: the reference's float32 kernels with every weight and module output rounded to the dtype the device holds it in (bfloat16); it shares no kernel with the device under test",
     '精度噪声基线为模拟所得：使用参考的 float32 内核，每个权重与模块输出都舍入到被测设备存放它所用的 dtype（bfloat16）；它与被测设备不共享任何内核'),
    ('cuda does not run float16, so the precision floor is built at bfloat16, the nearest dtype it supports: a looser floor than float16 would give',
     'cuda 不支持 float16，因此精度噪声基线按其支持的最接近的 dtype bfloat16 构建：比 float16 下的基线更宽松'),
    ('the precision floor is a second device: cuda bfloat16',
     '精度噪声基线为第二台设备：cuda bfloat16'),
    ('failed: denoise, final logits: NaN/Inf',
     '失败：去噪、最终 logits：NaN/Inf'),
    ('failed: image 0: 32x32',
     '失败：图像 0：32x32'),
    ('final logits: NaN/Inf',
     '最终 logits：NaN/Inf'),
    ('image 0: 32x32',
     '图像 0：32x32'),
    ('run 2 vs run 1, image 0',
     '第 2 次运行对比第 1 次，图像 0'),
    ("<= 1.35 (the floor's RMSE (emulated bfloat16 on cpu float32 kernels)) WARN, else FAIL",
     '<= 1.35（噪声基线的 RMSE（cpu float32 内核模拟的 bfloat16））WARN，否则 FAIL'),
    ('<= 1.00 (1 grey level (no floor)) WARN, else FAIL',
     '<= 1.00（1 个灰度级（无噪声基线））WARN，否则 FAIL'),
    ('2 runs with the same seed are bitwise identical',
     '同一 seed 的 2 次运行逐位一致'),
    ("3 runs with the same seed differ: RMSE up to 0.41 levels, within the floor's RMSE (emulated bfloat16 on cpu float32 kernels) = 1.35",
     '同一 seed 的 3 次运行结果不同：RMSE 最大 0.41 个灰度级，在噪声基线的 RMSE（cpu float32 内核模拟的 bfloat16） = 1.35 之内'),
    ('2 runs with the same seed differ: RMSE up to 7.20 levels, beyond 1 grey level (no floor) = 1.00',
     '同一 seed 的 2 次运行结果不同：RMSE 最大 7.20 个灰度级，超出 1 个灰度级（无噪声基线） = 1.00'),
    ('phase encode',
     '编码阶段'),
    ('1 timed rounds after 0 warm-up: median step 167.8 ms, end to end 2.16 s',
     '预热 0 轮后计时 1 轮：单步中位耗时 167.8 ms，端到端 2.16 s'),
    ('3 timed rounds after 1 warm-up: median step 42.3 ms, end to end 1.20 s, MFU 31.4 %',
     '预热 1 轮后计时 3 轮：单步中位耗时 42.3 ms，端到端 1.20 s，MFU 31.4 %'),
    ('5 probe ops and 10 traced op types within msprobe thresholds',
     '5 个探针算子与 10 类追踪算子均在 msprobe 阈值之内'),
    ('FAIL: transformer: cosine 0.98710 < 0.99',
     'FAIL：transformer：余弦相似度 0.98710 < 0.99'),
    ("WARN: vae_decode: rel-L2 2.50x the floor's, in (2, 3]; transformer: rel-L2 2.10x the floor's, in (2, 3]",
     'WARN：vae_decode：rel-L2 为噪声基线的 2.50 倍，位于 (2, 3]；transformer：rel-L2 为噪声基线的 2.10 倍，位于 (2, 3]'),
    ('FAIL: rms_norm/hidden, rms_norm/head',
     'FAIL：rms_norm/hidden、rms_norm/head'),
    ('WARN: linear (traced), conv2d',
     'WARN：linear（追踪）、conv2d'),
    ('torch (fp32 rsqrt factor) (exact)',
     'torch（fp32 rsqrt 因子）（等价）'),
    ('F.linear (traced) (exact)',
     'F.linear（追踪）（等价）'),
    ('override:broken_rms_norm (approximate)',
     '覆盖实现：broken_rms_norm（近似）'),
    ('linear (traced)',
     'linear（追踪）'),
    ('output layout interleaved (the reference is compared in the same layout)',
     '输出布局为 interleaved（参考按相同布局比对）'),
    ('worst of 3 judged calls (3 ran): step 0, call #0 of embedding in transformer.model.embed_tokens; kept 256 of 650 ids',
     '3 个已判定调用中最差的一个（共运行 3 次）：第 0 步，embedding 的调用 #0，位于 transformer.model.embed_tokens；保留 650 个 id 中的 256 个'),
    ('worst of 2 judged calls (2 ran): step 0, call #0 of softmax; kept 4 of 4 rows of 64',
     '2 个已判定调用中最差的一个（共运行 2 次）：第 0 步，softmax 的调用 #0；保留 4 行（每行 64 个元素）中的 4 行'),
    ('step 0: transformer.model.embed_tokens (call #0)',
     '第 0 步：transformer.model.embed_tokens（调用 #0）'),
    ('transformer call 9: no reduction fits 67108864 B',
     'transformer 调用 #9：没有能放入 67108864 B 的缩减方式'),
    ('vae_decode call 3: kept 70000000 B > 67108864 B',
     'vae_decode 调用 #3：保留了 70000000 B > 67108864 B'),
    ('step 0 call 2: ValueError: unsupported layout',
     '第 0 步 调用 #2：ValueError: unsupported layout'),
    ('transformer call 9: no reduction fits 67108864 B; vae_decode call 3: kept 70000000 B > 67108864 B',
     'transformer 调用 #9：没有能放入 67108864 B 的缩减方式；vae_decode 调用 #3：保留了 70000000 B > 67108864 B'),
    ('128 of 128 elements',
     '128 个元素中的 128 个'),
    ('128 of 325 rows x 256 of 256 outputs',
     '325 行中的 128 行 × 256 个输出中的 256 个'),
    ('1 of 1 matrices, 4 of 4 rows x 64 of 64 columns',
     '1 个矩阵中的 1 个，4 行中的 4 行 × 64 列中的 64 列'),
    ('16 of 16 rows of 64',
     '16 行（每行 64 个元素）中的 16 行'),
    ('16 of 32 (sample, group) blocks of 4',
     '32 个（样本, 组）块（每块 4 个元素）中的 16 个'),
    ('256 of 650 ids',
     '650 个 id 中的 256 个'),
    ('sample 0, 16 of 16 channels, window 1x64x64 of 1x128x128',
     '样本 0，16 个通道中的 16 个，窗口 1x64x64（共 1x128x128）'),
    ('16 of 32 (sample, channel) planes',
     '32 个（样本, 通道）平面中的 16 个'),
    ('4 of 4 heads x 128 of 325 queries, all 325 keys',
     '4 个头中的 4 个 × 325 个查询中的 128 个，全部 325 个键'),
    ('< 0.001 (else dual-N)',
     '< 0.001（否则按 dual-N 判定）'),
    ('|ref| < 2^-8: abs err <= 1.5e-05',
     '|ref| < 2^-8：绝对误差 <= 1.5e-05'),
    ('max abs < 0.001',
     '最大绝对误差 < 0.001'),
    ('dual-100 and dual-1000',
     'dual-100 与 dual-1000'),
    ('dual-1000 (rel_gt_0.1% >= 0.001), explained by bfloat16 (within the ratio rule)',
     'dual-1000 (rel_gt_0.1% >= 0.001)，可由 bfloat16 精度解释（在比值规则之内）'),
    ('dual-100 (rel_gt_1% >= 0.01); no floor to settle it',
     'dual-100 (rel_gt_1% >= 0.01)；没有噪声基线可据以裁定'),
    ('dual-100 (rel_gt_1% >= 0.01); ratio rule exceeded: rmse / floor, small errors / floor',
     'dual-100 (rel_gt_1% >= 0.01)；超出比值规则：RMSE / 噪声基线、小值误差 / 噪声基线'),
    ('|ref| >= 2^-8', '|ref| >= 2^-8（正常值域）'),
    ('<= 10 (floor >= 0.12)', '<= 10（噪声基线至少取 0.12）'),
    ('<= 2 (share; floor >= 0.005)', '<= 2（按占比；噪声基线至少取 0.005）'),
    ('the component rung WARNs on a floor ratio between PASS and FAIL (transformer: rel_l2 / floor 2.55), accepted by '
     'the user: 评审过的 bf16 softmax',
     '组件级验证因噪声基线比值位于 PASS 与 FAIL 之间而为 WARN（transformer：rel_l2 / 噪声基线 2.55），已由用户接受：'
     '评审过的 bf16 softmax'),
    ('the step rung WARNs on a floor ratio between PASS and FAIL (step 2: rel_l2 / floor 2.9; step 3: rel_l2 / floor '
     '2.6): a sign-off fails on it unless accepted with --accept-warn step=REASON',
     '逐步教师强制验证因噪声基线比值位于 PASS 与 FAIL 之间而为 WARN（第 2 步：rel_l2 / 噪声基线 2.9；第 3 步：rel_l2 / '
     '噪声基线 2.6）：除非用 --accept-warn step=REASON 明确接受，否则签收判为失败'),
    ("the trajectory rung WARNs on a free run's picture between PASS and FAIL (image 0: rmse / floor 2.08), "
     "explained: every teacher-forced step and every component PASS, so the free run's picture is the chaotic "
     "growth of in-floor per-step errors",
     '轨迹级验证中自由运行的图像比值位于 PASS 与 FAIL 之间（图像 0：RMSE / 噪声基线 2.08），已有解释：每个教师强制步骤和'
     '每个组件均为 PASS，自由运行图像的偏差是基线内逐步误差的混沌放大'),
    ('rel_l2 / floor 2.55', 'rel_l2 / 噪声基线 2.55'),
    ('cosine 0.98710 < 0.99',
     '余弦相似度 0.98710 < 0.99'),
    ('no floor: cosine 0.99950 >= 0.999',
     '无噪声基线：余弦相似度 0.99950 >= 0.999'),
    ('no floor: cosine 0.99800 < 0.999',
     '无噪声基线：余弦相似度 0.99800 < 0.999'),
    ("rel-L2 1.30x the floor's <= 2",
     'rel-L2 为噪声基线的 1.30 倍，<= 2'),
    ("rel-L2 2.50x the floor's, in (2, 3]",
     'rel-L2 为噪声基线的 2.50 倍，位于 (2, 3]'),
    ("rel-L2 3.40x the floor's > 3",
     'rel-L2 为噪声基线的 3.40 倍，> 3'),
    ('>= 0.99 (absolute)',
     '>= 0.99（绝对界）'),
    ('<= 2 PASS, <= 3 WARN',
     '<= 2 PASS，<= 3 WARN'),
    ("2 components PASS (transformer: rel-L2 1.30x the floor's <= 2; vae_decode: rel-L2 1.11x the floor's <= 2)",
     '2 个组件 PASS（transformer：rel-L2 为噪声基线的 1.30 倍，<= 2；vae_decode：rel-L2 为噪声基线的 1.11 倍，<= 2）'),
    ('step 0',
     '第 0 步'),
    ('seed 1 step 3',
     'seed 1 第 3 步'),
    ('logits cosine',
     'logits 余弦相似度'),
    ('noise_pred rel_l2',
     'noise_pred 相对 L2 误差'),
    ('logits max_abs',
     'logits 最大绝对误差'),
    ('>= 0.99 absolute; then rel-L2 / floor',
     '>= 0.99（绝对界）；再看 rel-L2 / 噪声基线'),
    ('first FAIL at step 0; first divergent block: model.layers.0',
     '首个 FAIL 出现在第 0 步；首个分叉 block：model.layers.0'),
    ('first WARN at seed 2 step 1; first divergent block: after the last block (final norm / head)',
     '首个 WARN 出现在 seed 2 第 1 步；首个分叉 block：最后一个 block 之后（最终归一化 / 输出头）'),
    ("2 teacher-forced steps: worst rel-L2 1.49x the floor's (PASS <= 2, FAIL > 3)",
     '2 个教师强制步：rel-L2 最大为噪声基线的 1.49 倍（PASS <= 2，FAIL > 3）'),
    ("2 teacher-forced steps: worst rel-L2 1.49x the floor's (PASS <= 2, FAIL > 3); at the worst step (1) block model.layers.1 exceeds its floor",
     '2 个教师强制步：rel-L2 最大为噪声基线的 1.49 倍（PASS <= 2，FAIL > 3）；误差最大的第 1 步中，block model.layers.1 超出其噪声基线'),
    ('4 teacher-forced steps without a floor: worst cosine 0.99971 (at best WARN)',
     '4 个教师强制步（无噪声基线）：最差余弦相似度 0.99971（最多 WARN）'),
    ('; at the worst step (1) block model.layers.1 exceeds its floor',
     '；误差最大的第 1 步中，block model.layers.1 超出其噪声基线'),
    ('image 0',
     '图像 0'),
    ('seed 1 image 0',
     'seed 1 图像 0'),
    ('final tokens',
     '最终 tokens'),
    ('seed 2 final latents',
     'seed 2 最终 latents'),
    ('< 0.05 WARN (no floor: never PASS), else FAIL',
     '< 0.05 WARN（无噪声基线：不会 PASS），否则 FAIL'),
    ('image RMSE at most 0.03x the emulated bfloat16 on cpu float32 kernels floor (PSNR 47.0 dB worst)',
     '图像 RMSE 最大为噪声基线（cpu float32 内核模拟的 bfloat16）的 0.03 倍（最差 PSNR 47.0 dB）'),
    ('no noise floor for 1 image(s), so not judged against precision: image cosine distance 0.0123 (diffusers bound < 0.05; at best WARN)',
     '1 张图像没有噪声基线，因此不做精度判定：图像余弦距离 0.0123（diffusers 界 < 0.05；最多 WARN）'),
    ('image RMSE at most 1.42x the cpu float32 (the reference itself) floor (PSNR 42.5 dB worst); no noise floor for 1 image(s), so not judged against precision: image cosine distance 1.2e-05 (diffusers bound < 0.05; at best WARN)',
     '图像 RMSE 最大为噪声基线（cpu float32（参考本身））的 1.42 倍（最差 PSNR 42.5 dB）；1 张图像没有噪声基线，因此不做精度判定：图像余弦距离 1.2e-05（diffusers 界 < 0.05；最多 WARN）'),
    ("12 of 4096 tensor rows hold another dtype on the golden side: msprobe marks them 'dtype inconsistent' whatever their values",
     "4096 行张量中有 12 行在标杆侧为另一种 dtype：无论数值如何，msprobe 都将其标为 'dtype inconsistent'"),
    ("teacher-forced step 0 (seed 0) on the reference's recorded inputs",
     '参考记录的输入上的教师强制第 0 步（seed 0）'),
    ("emulated bfloat16 on cpu float32 kernels: every bfloat16 call computed in float32 and rounded (the operator rung's emulation, over the whole step)",
     'cpu float32 内核模拟的 bfloat16：每个 bfloat16 调用都以 float32 计算后舍入（即算子级验证的模拟方式，覆盖整个步）'),
    ('cpu float32 (no floor: msprobe marks every row dtype-inconsistent)',
     'cpu float32（无噪声基线：msprobe 将每一行都标为 dtype 不一致）'),
    ('model.layers.0: FAIL (first divergent)',
     'model.layers.0：FAIL（首个分叉）'),
    ('step 0: PASS',
     '第 0 步：PASS'),
    ('env PYTORCH_CUDA_ALLOC_CONF',
     '环境变量 PYTORCH_CUDA_ALLOC_CONF'),
    ("classes {'transformer': 'URSATransformer3DModel', 'vae': 'AutoencoderVQ'}",
     "组件类 {'transformer': 'URSATransformer3DModel', 'vae': 'AutoencoderVQ'}"),
    ("disable with 'lm-head-slice'",
     '可用 --disable lm-head-slice 关闭'),
    ("metric path only; disable with 'reuse-first-forward'",
     '仅用于 metric 路径；可用 --disable reuse-first-forward 关闭'),
    ("_native_npu switched off with 'npu-attention'",
     '_native_npu 已由 --disable npu-attention 关闭'),
    ('_native_npu refused: ModuleNotFoundError: torch_npu',
     '_native_npu 被拒绝：ModuleNotFoundError: torch_npu'),
    ('bfloat16 (model folder)',
     'bfloat16（模型目录）'),
    ('bfloat16 from single file',
     'bfloat16（单文件）'),
    ('fp8 e4m3fn storage, bfloat16 compute',
     'fp8 e4m3fn 存储，bfloat16 计算'),
    ("scaled fp8 e4m3fn (per-tensor scales), keys prefixed 'model.diffusion_model.', zero_cond_t marker, scales applied per forward; biases, norms and non-fp8 tensors in bfloat16",
     "带缩放 fp8 e4m3fn（per-tensor 缩放），键名前缀 'model.diffusion_model.'，带 zero_cond_t 标记，每次前向时应用缩放；偏置、归一化层及非 fp8 张量为 bfloat16"),
    ('plain fp8 e4m3fn+e5m2; biases, norms and non-fp8 tensors in float16',
     '普通 fp8 e4m3fn+e5m2；偏置、归一化层及非 fp8 张量为 float16'),
    ("unquantized single-file transformer, keys prefixed 'model.diffusion_model.'",
     "未量化的单文件 transformer，键名前缀 'model.diffusion_model.'"),
    ('override: broken_rms_norm',
     '覆盖实现：broken_rms_norm'),
    ('installed on 4 modules of this pipeline only',
     '仅安装在本流水线的 4 个模块上'),
    ('inductor: regional (decoder layer)',
     'inductor：区域编译（decoder layer）'),
    ('torchair: regional (each transformer block, diffusers compile_repeated_blocks)',
     'torchair：区域编译（逐个 transformer block，diffusers compile_repeated_blocks）'),
    ('mode max-autotune-no-cudagraphs; compiled lazily on the first step; exact within floating-point noise, not bit for bit',
     '模式 max-autotune-no-cudagraphs；在第一步时惰性编译；在浮点噪声范围内等价，并非逐位一致'),
    ('default mode; exact within floating-point noise, not bit for bit',
     '默认模式；在浮点噪声范围内等价，并非逐位一致'),
    ('mode max-autotune-no-cudagraphs',
     '模式 max-autotune-no-cudagraphs'),
    ('torchair.get_npu_backend() failed: RuntimeError: no NPU',
     'torchair.get_npu_backend() 失败：RuntimeError: no NPU'),
    ('philox4x32-10 on cuda (Gumbel-max block compiled)',
     'philox4x32-10，位于 cuda（Gumbel-max 块已编译）'),
    ('philox4x32-10 on npu',
     'philox4x32-10，位于 npu'),
    ("the cpu backend's default",
     'cpu 后端的默认值'),
    ("named by the run; the portable stream: Gumbel-max on the device keyed by (seed, step, position), no host draw or sync, the same tokens on every device up to near-tied logits - not the reference's CPU stream ('--disable philox-rng' for that)",
     "由本次运行指定；可移植的随机数流：在设备上做 Gumbel-max，以 (seed, step, position) 为键，无主机端采样或同步，除 logits 近乎相等的情况外各设备上得到相同的 token——不是参考的 CPU 随机数流（要用后者请加 '--disable philox-rng'）"),
    ("the cpu backend's default; the reference's own stream, its tokens bit for bit on the CPU in float32",
     'cpu 后端的默认值；参考自身的随机数流，在 CPU 上以 float32 运行时 token 逐位一致'),
    ("the npu backend's default; the reference's own stream, its tokens bit for bit on the CPU in float32; every draw is made on the host and copied, with one host sync per step ('--fast philox-rng' draws on the device)",
     "npu 后端的默认值；参考自身的随机数流，在 CPU 上以 float32 运行时 token 逐位一致；每次采样都在主机上进行后拷贝，每步一次主机同步（'--fast philox-rng' 在设备上采样）"),
    ('model: transformer moved to cpu before decode',
     'model：解码前将 transformer 移到 cpu'),
    ('cuda: SDPA picks flash/efficient kernels itself',
     'cuda：SDPA 自行选择 flash/efficient 内核'),
    ('First-Block-Cache (threshold 0.05)',
     'First-Block-Cache（阈值 0.05）'),
    ('TaylorSeer (refresh every 4 steps)',
     'TaylorSeer（每 4 步刷新一次）'),
    ("same rotation as diffusers' complex64 product, float rounding only; disable with 'real-rope'",
     '与 diffusers 的 complex64 乘积旋转相同，仅有浮点舍入差异；可用 --disable real-rope 关闭'),
    ("shorter text padded once per run; each row attends only to its own text, unmasked; equals two batch-1 calls within float rounding; disable with 'batched-cfg'",
     '较短的文本每次运行只补齐一次；每行只关注自身文本，无掩码；在浮点舍入范围内等于两次 batch-1 调用；可用 --disable batched-cfg 关闭'),
    ('the golden bundle has no run for seed 1',
     '标杆数据包中没有 seed 1 的运行'),
    ('retry with --offload before-decode',
     '请改用 --offload before-decode 重试'),
    ('retry with --offload sequential and --vae-tiling',
     '请改用 --offload sequential 并加 --vae-tiling 重试'),
    ('reduce --height/--width or use a smaller --dtype',
     '请减小 --height/--width 或使用更小的 --dtype'),
    ('reduce --height/--width or use --vae-tiling',
     '请减小 --height/--width 或使用 --vae-tiling'),
    ('the reference could not be loaded (FileNotFoundError: model_index.json)',
     '参考无法加载（FileNotFoundError: model_index.json）'),
    ('the device run (seed 2)',
     '被测设备运行（seed 2）'),
    ('the reference run (seed 0)',
     '参考运行（seed 0）'),
    ('reading the golden run (seed 1)',
     '读取标杆数据包中的运行（seed 1）'),
    ('the floor run (emulated bfloat16 on cpu float32 kernels, seed 0)',
     '噪声基线运行（cpu float32 内核模拟的 bfloat16，seed 0）'),
    ('loading the floor cuda bfloat16',
     '加载噪声基线 cuda bfloat16'),
    ('cpu runs none of float16, bfloat16',
     'cpu 不支持 float16, bfloat16 中的任何一种'),
    ('semantic prompts 16 -> 4',
     '语义验证提示词数 16 -> 4'),
    ('prompts drawn correctly: device 3/4, reference 4/4, floor 4/4 (emulated bfloat16 on cpu float32 kernels); the device loses 1 the reference gets right (lost 1 <= 0 + 1)',
     '正确绘制的提示词：被测设备 3/4，参考 4/4，噪声基线 4/4（cpu float32 内核模拟的 bfloat16）；参考画对而被测设备画错的有 1 个（丢失 1 个 <= 0 + 1）'),
    ('prompts drawn correctly: device 1/4, reference 1/4, no floor; the device loses 0 the reference gets right (the reference draws only 1 of 4 prompts correctly (< 50%): the set does not fit this model, so meaning cannot be judged)',
     '正确绘制的提示词：被测设备 1/4，参考 1/4，无噪声基线；参考画对而被测设备画错的有 0 个（参考只正确绘制了 4 个提示词中的 1 个（< 50%）：该提示词集不适合此模型，无法判定语义）'),
    ('the reference draws only 1 of 4 prompts correctly (< 50%): the set does not fit this model, so meaning cannot be judged',
     '参考只正确绘制了 4 个提示词中的 1 个（< 50%）：该提示词集不适合此模型，无法判定语义'),
    ('lost 3 > 0 + 2',
     '丢失 3 个 > 0 + 2'),
    ('device: expected a red circle (left) and a blue square on a green background; found a red circle (centre) on no clear background; wrong: position, count',
     '被测设备：期望绿色背景，红色圆形（左侧）和蓝色正方形；检出背景不明确，红色圆形（中央）；错误项：位置、数量'),
    ('device: expected a yellow shape on any background; found nothing on a white background; wrong: count, shape',
     '被测设备：期望任意背景，黄色图形；检出白色背景，无图形；错误项：数量、形状'),
    ('count, position',
     '数量、位置'),
    ('floor mse',
     '噪声基线均方误差 (MSE)'),
    ('floor token_agreement',
     '噪声基线 token 一致率'),
    ('cfg-parallel: conditional half on rank 0, unconditional on rank 1 (gloo, one all-gather of the logits per guided step)',
     'cfg-parallel：CFG batch 的条件部分在 rank 0、无条件部分在 rank 1 上运行（gloo，每个引导步一次 logits 的 all-gather）'),
    ('cfg-parallel: conditional on rank 0, unconditional on rank 1 (hccl, one all-gather per step)',
     'cfg-parallel：条件分支在 rank 0、无条件分支在 rank 1 上运行（hccl，每步一次 all-gather）'),
    # Qwen-Image-Edit's stages after the network, and every other step output (issue 25)
    ('first FAIL at step 0; first divergent block: after the last block (final norm / head); after the network: '
     'latents_next',
     '首个 FAIL 出现在第 0 步；首个分叉 block：最后一个 block 之后（最终归一化 / 输出头）；网络之后：latents_next'),
    ('transformer_blocks.1; after the network: guided',
     'transformer_blocks.1；网络之后：guided'),
    ('post guided rel_l2 / floor',
     '网络之后 guided rel_l2 / 噪声基线'),
    ('cond_pred rel_l2 / floor',
     'cond_pred rel_l2 / 噪声基线'),
    ('cosine >= 0.99; no floor',
     '余弦相似度 >= 0.99；无噪声基线'),
    # URSA's sampler step and tokens (issue 25)
    ('sampler jump_prob cosine',
     '采样器 jump_prob 余弦相似度'),
    ('sampler rate rel_l2 / floor',
     '采样器 rate rel_l2 / 噪声基线'),
    ('sampler jump_prob nonfinite_only_device',
     '采样器 jump_prob 仅被测设备的 NaN/Inf 个数'),
    ('<= 2 PASS, <= 3 WARN; cosine >= 0.99',
     '<= 2 PASS，<= 3 WARN；余弦相似度 >= 0.99'),
    ('<= 2 PASS, <= 3 WARN (allowance 0.188)',
     '<= 2 PASS，<= 3 WARN（容许量 0.188）'),
    ('seed 3 tokens step by step',
     'seed 3 逐步 token'),
    ("seed 1 image 0 from the device's tokens",
     'seed 1 由被测设备 token 解码的图像 0'),
    ("tokens step by step along the device's path: worst 7.8% differ from the reference's step (floor 4.7%; 1.17x floor + allowance)",
     '沿被测设备自身路径逐步比对 token：最多 7.8% 与参考的同一步不同（噪声基线 4.7%；为噪声基线 + 容许量的 1.17 倍）'),
    ("image RMSE at most 0.95x the emulated bfloat16 on cpu float32 kernels floor (PSNR 15.3 dB worst); tokens step by step along the device's path: worst 7.8% differ from the reference's step (floor 4.7%; 1.17x floor + allowance)",
     '图像 RMSE 最大为噪声基线（cpu float32 内核模拟的 bfloat16）的 0.95 倍（最差 PSNR 15.3 dB）；沿被测设备自身路径逐步比对 token：最多 7.8% 与参考的同一步不同（噪声基线 4.7%；为噪声基线 + 容许量的 1.17 倍）'),
    ('Off-identity: on this device the exact optimisations lm-head-slice change the picture (0.42 % of pixels differ, up to 12 levels) against their off state, so here they are approximate optimisations; the rungs above judged the validated run with them on.',
     '关闭一致性检查：在本设备上，等价优化 lm-head-slice 与关闭时相比改变了图像（0.42 % 的像素不同，最大相差 12 级），因此在此处为近似优化；以上各级验证已在开启它的情况下评判了被验证的运行。'),
    ('inductor: regional (decoder layer), chosen automatically',
     'inductor：区域编译（decoder layer），自动选择'),
    ("auto: eager; compile is never chosen unasked on cpu (the reference's device keeps eager's exact tokens; --compile asks)",
     '自动：eager；在 cpu 上从不自动编译（参考设备保持 eager 的精确 token；可用 --compile 请求）'),
    ('auto: eager; no compiler here (triton missing)',
     '自动：eager；此处没有可用的编译器（triton missing）'),
    ('auto: eager; no eager step measured yet at this size to estimate the saving',
     '自动：eager；此尺寸下没有测得 eager 步时，无法预计编译是否值得'),
    ('auto: compiled by an earlier call of this pipeline (cost already paid)',
     '自动：已由本流水线之前的调用编译（编译耗时已付出）'),
    ('auto: compiled; 500 + 25 steps x 52.2 ms x 0.30 saved = 8.2 s >= 5 s estimated compile (warm cache); mode default; not bit for bit',
     '自动：编译；500 + 25 步 × 52.2 ms × 可减少的比例 0.30 = 8.2 s >= 预计编译耗时 5 s（缓存已热）；模式 default；并非逐位一致'),
]

EXAMPLES = EXACT_EXAMPLES + PATTERN_EXAMPLES
_NUMBER = re.compile(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?")
_CODE = re.compile(r"[A-Za-z_][\w]*(?:\.\w+)+|\w*_\w+|--[\w-]+")


def _first_pattern(text: str) -> int | None:
    """Index of the pattern ``translate`` uses for ``text`` (None: an EXACT entry or unknown)."""
    if text in EXACT:
        return None
    return next((i for i, (p, _) in enumerate(PATTERNS) if p.fullmatch(text)), None)


# ---- the catalogue ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("english", "chinese"), EXAMPLES, ids=[e[:60] for e, _ in EXAMPLES])
def test_example_translates(english: str, chinese: str) -> None:
    assert translate(english, "zh") == chinese


def test_every_exact_entry_has_an_example() -> None:
    sources = {text for pair in SOURCES.values() for text in pair}
    listed = {e for e, _ in EXACT_EXAMPLES}
    assert sorted(set(EXACT) - listed - sources) == []
    assert [e for e in listed if e not in EXACT] == []  # an EXACT example that is not an entry is a pattern's


def test_every_pattern_has_an_example() -> None:
    used = {_first_pattern(e) for e, _ in PATTERN_EXAMPLES}
    missing = [p.pattern for i, (p, _) in enumerate(PATTERNS) if i not in used]
    assert missing == []
    assert [e for e, _ in PATTERN_EXAMPLES if _first_pattern(e) is None] == []  # each example is a pattern's


def test_every_threshold_source_is_translated() -> None:
    """thresholds.SOURCES (label, where it is written down) as the report cites them beside each threshold."""
    assert sorted(SOURCES) == sorted(SOURCES_ZH)
    for key, (label, where) in SOURCES.items():
        assert translate(label, "zh") == SOURCES_ZH[key][0]
        assert translate(where, "zh") == SOURCES_ZH[key][1]
        assert english_left(SOURCES_ZH[key][1]) == []


def _literals() -> list[str]:
    """Every string literal of difforge's source (f-strings: their literal parts)."""
    found: list[str] = []
    for path in SRC.rglob("*.py"):
        if path.name == "zh_text.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.append(node.value)
    return found


def test_exact_entries_are_strings_the_code_writes() -> None:
    """An EXACT key no source literal contains is dead (the code changed its words): translate the new ones."""
    literals = "\n".join(_literals())
    assert [k for k in EXACT if k not in literals] == []


@pytest.mark.parametrize(("english", "chinese"), EXAMPLES, ids=[e[:60] for e, _ in EXAMPLES])
def test_translation_leaves_no_english_and_keeps_numbers_and_code(english: str, chinese: str) -> None:
    assert english_left(chinese) == []
    for number in _NUMBER.findall(english):
        assert number in chinese, number
    if len(english.split()) >= 4:  # a sentence: its identifiers, paths and flags stay as they are
        for code in _CODE.findall(english):
            assert code in chinese, code


def test_english_and_unknown_text_pass_through() -> None:
    sentence = "2 teacher-forced steps: worst rel-L2 1.49x the floor's (PASS <= 2, FAIL > 3)"
    assert translate(sentence, "en") == sentence
    assert translate("a sentence no rung writes", "zh") == "a sentence no rung writes"
    assert translate("", "zh") == ""
    tr = translator("zh")
    assert tr("step 3") == "第 3 步" and tr(None) is None and tr(0.5) == 0.5  # type: ignore[arg-type]
    assert translator("en")("step 3") == "step 3"


def test_embedded_labels_errors_and_lists_are_translated() -> None:
    """Groups holding a label, a reason or a list are translated themselves (recursively)."""
    floor = "emulated bfloat16 on cpu float32 kernels"
    assert translate(f"none (the floor run ({floor}, seed 1) failed (RuntimeError: boom))", "zh") == (
        "无（噪声基线运行（cpu float32 内核模拟的 bfloat16，seed 1）失败（RuntimeError: boom））")
    assert translate("the trajectory rung was skipped (not run: the reference runs failed (KeyError: x))", "zh") == (
        "完整轨迹验证被跳过（未运行：参考运行失败（KeyError: x））")
    assert translate("failed: load, image 0: 64x64", "zh") == "失败：加载、图像 0：64x64"


def test_english_left_flags_sentences_not_names_or_code() -> None:
    assert english_left("3 个教师强制步：the floor's error on the same inputs") == ["the floor's error on the same inputs"]
    assert english_left("Every step passed; the worst one") == ["Every step passed; the worst one"]
    assert english_left("通过 Every step passed。the worst one") == ["Every step passed", "the worst one"]
    assert english_left("teacher-forced steps reuse") == ["teacher-forced steps reuse"]
    for kept in ("torch SDPA (diffusers 'native')", "rms_norm/hidden, model.layers.0, F.linear", "--quick --no-speed-table",
                 "tiny-ursa 在 cpu bfloat16 上", "PASS WARN FAIL SKIP", "单步中位耗时 42.3 ms，TFLOP/s", "First-Block-Cache",
                 "RuntimeError: boom", "噪声基线 rel_l2 / floor", 'msprobe 打印 "[ERROR] Please verify the CANN set-up."',
                 "two words"):
        assert english_left(kept) == [], kept
    assert english_left("one two\nthree four") == []  # a line break (a table cell) ends a run


# ---- real validations --------------------------------------------------------------------------------------------
#: The smallest validation: --quick, 32x32, 2 steps, one timed round, no warm-up.
SMALL: dict[str, Any] = {"quick": True, "height": 32, "width": 32, "steps": 2, "rounds": 1, "warmup": 0}
if "speed_table" in {f.name for f in dataclasses.fields(ValidateOptions)}:
    SMALL["speed_table"] = False  # the performance table's other variants: more runs, no other sentence


class _BlankDecode(TorchFunctionMode):
    """A device whose bf16 ``conv2d`` returns zeros: URSA's VAE decodes a blank picture, the smoke rung fails
    on it (std < 2 levels) and every later rung is skipped.  The float32 reference and floor are untouched."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func is F.conv2d and isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16:
            return torch.zeros_like(out)
        return out


def _validate(out: Path, model: str = "tiny-ursa", mode: Any = None) -> ValidationResult:
    options = ValidateOptions(model=model, device="cpu", dtype="bfloat16", reference="cpu:float32", out=out,
                              quiet=True, lang="zh", **SMALL)
    with mode if mode is not None else nullcontext():
        return run_validation(options, lambda *_a, **_k: {})  # no report: each test renders its own


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> ValidationResult:
    result = _validate(tmp_path_factory.mktemp("zh") / "clean")
    assert result.verdict is Verdict.PASS, result.rung_verdicts()
    return result


@pytest.fixture(scope="module")
def skipped(tmp_path_factory: pytest.TempPathFactory) -> ValidationResult:
    result = _validate(tmp_path_factory.mktemp("zh") / "skipped", mode=_BlankDecode())
    assert result.rungs["smoke"].verdict is Verdict.FAIL
    assert all(r.verdict is Verdict.SKIP for k, r in result.rungs.items() if k != "smoke")
    return result


@pytest.fixture(scope="module")
def fault(tmp_path_factory: pytest.TempPathFactory) -> ValidationResult:
    """tiny-ursa with its rotary sine negated as it enters bf16 (tests/validate/faults.py): the step rung fails
    and localises the first transformer layer (tests/validate/test_localisation.py)."""
    from tests.validate import faults

    result = _validate(tmp_path_factory.mktemp("zh") / "fault", mode=faults.get("rope_sin_sign"))
    assert result.verdict is Verdict.FAIL
    assert result.rungs["step"].data["localisation"]["first_divergent"] == "model.layers.0"
    return result


@pytest.fixture(scope="module")
def qwen_edit(tmp_path_factory: pytest.TempPathFactory) -> ValidationResult:
    result = _validate(tmp_path_factory.mktemp("zh") / "qwen", model="tiny-qwen-edit")
    assert result.verdict is Verdict.PASS, result.rung_verdicts()
    return result


SCENARIOS = ["clean", "skipped", pytest.param("fault", marks=pytest.mark.slow),
             pytest.param("qwen_edit", marks=pytest.mark.slow)]


def runtime_texts(result: ValidationResult) -> list[tuple[str, str]]:
    """(where, text) for every text a rung, the ladder or a pipeline wrote into ``result`` at run time."""
    out: list[tuple[str, str]] = []
    for key, rung in result.rungs.items():
        out.append((f"{key} summary", rung.summary))
        for row in rung.rows:
            out.append((f"{key} subject", row.subject))
            out.append((f"{key} note", row.note))
            for m in row.measurements:
                out += [(f"{key} measurement", m.name), (f"{key} threshold", m.threshold)]
                if isinstance(m.value, str) and m.name != "prompt":  # a prompt is the user's own words
                    out.append((f"{key} {m.name}", m.value))
                if m.source:
                    out.append((f"{key} source", SOURCES[m.source][0]))
                    out.append((f"{key} source", SOURCES[m.source][1]))
    d = result.data
    out += [("verdict reason", r) for r in d.get("verdict_reasons") or []]
    out += [("note", n) for n in d.get("notes") or []]
    out += [("--quick", q) for q in d.get("quick_reductions") or []]
    for a in d.get("adaptations") or []:
        out += [(f"adaptation {k}", a.get(k) or "") for k in ("what", "choice", "detail")]
    out.append(("floor label", d.get("floor_label") or ""))
    return [(where, text) for where, text in out if text]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_runtime_texts_are_translated(scenario: str, request: pytest.FixtureRequest) -> None:
    result: ValidationResult = request.getfixturevalue(scenario)
    left = {f"{where}: {text!r} -> {translate(text, 'zh')!r}" for where, text in runtime_texts(result)
            if english_left(translate(text, "zh"))}
    assert not left, "run-time texts without a Chinese translation:\n" + "\n".join(sorted(left))


def _render(result: ValidationResult, out: Path) -> dict[str, str]:
    """report.html and report.md of ``result`` in Chinese, as a reader sees them (prompts, code left out)."""
    files = sorted(p for p in (Path(result.out_dir) / "images").glob("*") if p.is_file())
    import shutil

    shutil.copytree(result.out_dir, out)
    paths = write_report(result, out, lang="zh", files=[out / p.relative_to(result.out_dir) for p in files])
    prompts = [e["prompt"] for e in (result.data.get("gallery") or {}).get("entries") or []]
    semantic = result.rungs.get("semantic")
    prompts += [item["prompt"] for item in ((semantic.data if semantic is not None else None) or {}).get("items", [])]
    text = {"html": html.unescape(visible_html(paths["html"].read_text(encoding="utf-8"))),
            "md": visible_markdown(paths["markdown"].read_text(encoding="utf-8"))}
    for key, value in text.items():
        for prompt in sorted(prompts, key=len, reverse=True):  # the user's own words stay English
            value = value.replace(prompt, " ")
        text[key] = value
    return text


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_zh_report_shows_the_translated_findings(scenario: str, request: pytest.FixtureRequest,
                                                 tmp_path: Path) -> None:
    result: ValidationResult = request.getfixturevalue(scenario)
    text = _render(result, tmp_path / "report")
    for rung in result.rungs.values():
        zh = translate(rung.summary, "zh")
        assert zh != rung.summary and zh in text["html"], rung.key
        assert rung.summary not in text["html"], rung.key
    for reason in result.data.get("verdict_reasons") or []:
        assert translate(reason, "zh") in text["html"]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_zh_report_has_no_english_sentence(scenario: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    result: ValidationResult = request.getfixturevalue(scenario)
    text = _render(result, tmp_path / "report")
    left = {f"{kind}: {x!r}" for kind, value in text.items() for x in english_left(value)}
    assert not left, "English left in the zh report:\n" + "\n".join(sorted(left))
