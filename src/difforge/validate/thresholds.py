"""Every threshold the acceptance ladder judges against, and where it comes from.

Values follow ``specs/acceptance.md`` (msprobe / CANN precision compare, AWS NxDI contrib ports,
MindIE-SD accuracy gate, PyTorch ``assert_close``).  Where difforge had to choose a number that no
public tool states (teacher-forced steps, the trajectory noise-floor ratio) the choice is marked
``difforge`` and justified in ``SOURCES``; the report prints the source beside each measurement.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: Citation key -> (short label, where it is written down).
SOURCES: dict[str, tuple[str, str]] = {
    "msprobe-precheck": (
        "msprobe pre-check",
        "Ascend msprobe docs/en/accuracy_checker/pytorch_accuracy_checker_instruct.md: Cosine > 0.99, "
        "then MaxAbsErr < 0.001, then dual-hundredth (fp16/bf16) / dual-thousandth (fp32); "
        "small values judged by absolute error",
    ),
    "cann-compare": (
        "CANN precision compare",
        "CANN 7.0 PyTorch precision compare (hiascend canncommercial/700 AImpug_000197): acceptable when "
        "Cosine > 0.99 and MaxAbsErr < 0.001; not reached when Cosine < 0.9 or MaxAbsErr > 1",
    ),
    "msprobe-nan": (
        "msprobe compare",
        "Ascend msprobe docs/en/accuracy_compare/pytorch_accuracy_compare_instruct.md: NaN/Inf only on the "
        "device side is an error",
    ),
    "msprobe-ratio": (
        "msprobe new standard",
        "msprobe NPU-vs-GPU result compare: error ratio (device vs CPU) / (second device vs CPU) <= 2 "
        "(RMSE, level L0); max rel-err ratio <= 10",
    ),
    "aws-nxdi": (
        "AWS NxDI contrib ports",
        "aws-neuron contrib ports #159/#154/#151: cosine vs CPU fp32 >= 0.999 per component",
    ),
    "mindie-gate": (
        "MindIE-SD accuracy gate",
        "MindIE-SD .agents/skills/accuracy-gate: L1 = same-config rerun bitwise identical; "
        "noise floor is not a tolerance",
    ),
    "difforge-step": (
        "difforge (derived)",
        "teacher-forced steps reuse the component gate (cosine >= 0.999 PASS, >= 0.99 WARN, "
        "msprobe/AWS); no public tool ships a per-step harness (acceptance.md c.2)",
    ),
    "difforge-image": (
        "difforge (derived)",
        "8-bit images: a blank or saturated output (std < 2 levels, or > 98 % of pixels at 0/255) "
        "means the decode or the denoiser collapsed",
    ),
    "difforge-ratio": (
        "difforge (derived)",
        "error vs the fp32 reference divided by the noise floor's error on the same inputs: <= 2 PASS "
        "(msprobe L0 ratio), <= 3 WARN, > 3 FAIL; cosine < 0.99 fails outright (msprobe/CANN); the floor "
        "never uses the device's kernels (emulated or a second device)",
    ),
    "difforge-floor": (
        "difforge (derived)",
        "trajectory error judged against the noise floor (what the device's dtype alone costs, never "
        "computed with the device's kernels), with the floor rule (ratio 2 PASS / 3 WARN); floors below "
        "1 grey level (0-255) are raised to 1 level, the quantisation step of the saved image",
    ),
    "diffusers-fp16": (
        "diffusers fp16 test",
        "diffusers tests/pipelines/test_pipelines_common.py test_float16_inference: "
        "numpy_cosine_similarity_distance(fp16 output, fp32 output) < 5e-2 (acceptance.md c.2); used only "
        "when no noise floor exists, and then at best WARN: an absolute bound proves no port correct",
    ),
    "difforge-tokens": (
        "difforge (derived)",
        "discrete tokens drawn from the same Philox words on every side: the device's share of tokens that differ "
        "from the reference over (the floor's share + an allowance of max(0.5 %, 3 tokens)) <= 2 PASS, <= 3 WARN "
        "(the floor rule); the allowance covers draws that land within rounding of a cumulative-sum boundary, which "
        "a floor sharing none of the device's kernels need not hit, and the count noise of a few such events",
    ),
    "msprobe-benchmark": (
        "msprobe benchmark standard",
        "Ascend mstt debug/accuracy_tools/msprobe/pytorch/api_accuracy_checker: precision_standard/"
        "benchmark_compare.py and compare/algorithm.py (标杆比对法: max relative error over the normal-value "
        "domain only, small values counted as errors above small_value_atol, RMSE without the small values; "
        "calc_ratio returns 1 when both errors are ~0 and DEFAULT_RATIO_VALUE 10000 when only the benchmark's "
        "is, i.e. an error against a zero benchmark always fails); precision_standard/standard_config.py "
        "(ratio error thresholds: small-value 2, RMSE 2, max rel 10, mean rel 2)",
    ),
    "msprobe-dual-n": (
        "msprobe dual-N share",
        "Ascend msprobe docs/en/accuracy_checker/pytorch_accuracy_checker_instruct.md and "
        "precision_standard/standard_config.py (_fp16_ulp_err_proportion 0.001): a low-precision kernel may "
        "miss on a share of elements below 1/N (dual-hundredth bf16/fp16, dual-thousandth fp32)",
    ),
    "difforge-allowance": (
        "difforge (derived)",
        "absolute allowances that keep a floor ratio finite when the floor's own error is ~0 (msprobe would "
        "report its 10000 default there): the operator rung's floors raised to what one rounding of the dtype "
        "costs - RMSE 0.42 * 2^-p (RMS over log-uniform mantissas), max rel 2^-p (float32: both x32, msprobe's "
        "32-ulp ULP threshold), small-value errors 1/warn-N of the elements (0.1 % bf16/fp16, msprobe's ULP "
        "proportion 0.001); component/step rel-L2 floors to 1e-4, image floors to 1 grey level, token floors "
        "to 2 % (at least one token), semantic floors to 10 % of N (at least one prompt)",
    ),
    "peak-table": (
        "vendor datasheets",
        "dense (non-sparse) peak TFLOP/s per dtype, see difforge.validate.bench.KNOWN_PEAKS",
    ),
}

# ---- operator rung (msprobe pre-check) -------------------------------------------------------------
OP_COSINE = 0.99
OP_MAX_ABS = 1e-3


@dataclass(frozen=True)
class DualRule:
    """msprobe's "dual-N": the share of elements with rel. error > 1/N must stay below 1/N."""

    error_n: int  # failing this is an error
    warn_n: int  # failing this is a warning
    small_below: float  # |reference| below this is "small value"
    small_abs: float  # small values are judged by this absolute error


def dual_rule(dtype: torch.dtype) -> DualRule:
    """The msprobe rule for the dtype the device computed in (fp16/bf16: dual-100, fp32: dual-1000)."""
    if dtype == torch.float16:
        return DualRule(100, 1000, 2.0**-11, 2.0**-16)
    if dtype == torch.bfloat16:
        return DualRule(100, 1000, 2.0**-8, 2.0**-16)
    return DualRule(1000, 10000, 2.0**-14, 2.0**-30)



#: Bits of precision (implicit bit included) per dtype: one rounding costs a relative 2^-p at most.
PRECISION_BITS = {torch.bfloat16: 8, torch.float16: 11, torch.float32: 24}


def precision_bits(dtype: torch.dtype) -> int:
    """Significand bits of ``dtype`` (float32's for anything else: float64 is held to float32's rule)."""
    return PRECISION_BITS.get(dtype, 24)


@dataclass(frozen=True)
class OpAllowance:
    """Absolute allowances of the operator rung's ratio rule (msprobe's benchmark standard).

    msprobe divides the device's error by a second device's; difforge divides by the floor's.  A floor
    whose error is (near) zero - an exactly representable output, an op run in float32, one rounding that
    happens to be exact - would make any last-bit difference an infinite ratio, so each floor error is
    raised to what a correct low-precision kernel earns (source ``difforge-allowance``).
    """

    rmse: float  # rel-L2 (RMSE over the reference's RMS) of one rounding at the dtype
    max_rel: float  # max relative error over the normal-value domain
    small_share: float  # share of compared elements that may be small-value errors


def op_allowance(dtype: torch.dtype) -> OpAllowance:
    """The allowances for an op that ran at ``dtype`` (see :class:`OpAllowance` and SOURCES).

    Each is what one correct rounding at the dtype costs - the floor of an op whose kernels round once -
    so for such ops the rule is msprobe's own; the intermediate roundings real kernels add (a convolution
    before its bias, a group norm's statistics, attention's probabilities) are modelled by the floor
    itself (``tracing.FLOOR_RUNS``), not by a looser allowance: a 2^-3 max-rel allowance, tried first,
    let a tanh-for-erf GELU (max rel 0.042 against a floor of 0.0039) pass.
    """
    p = precision_bits(dtype)
    rule = dual_rule(dtype)
    # A float32 op has no rounding of its own to the reference's dtype; its kernels reorder long sums, and
    # msprobe's ULP standard lets float32 carry 32 ulps.
    ulps = 32 if p >= 24 else 1
    # RMS relative error of one round-to-nearest: ulp/sqrt(12) over log-uniform mantissas = 0.42 * 2^-p;
    # its largest relative error is half an ulp at mantissa 1: 2^-p.
    return OpAllowance(rmse=0.42 * 2.0**-p * ulps, max_rel=2.0**-p * ulps, small_share=1.0 / rule.warn_n)


# ---- component and teacher-forced step rungs -------------------------------------------------------
COMPONENT_COS_PASS = 0.999  # AWS NxDI per-component gate
#: A block is "divergent" when its output cosine against the reference falls below this.
BLOCK_COS_DIVERGE = COMPONENT_COS_PASS

# ---- the floor rule (component, step, block and trajectory quantities) ---------------------------------
#: A quantity's error against the reference, divided by the floor's error on the same inputs:
#: up to RATIO_PASS is what the dtype explains (msprobe L0 ratio 2); up to RATIO_FAIL is WARN; beyond, FAIL.
RATIO_PASS = 2.0
RATIO_FAIL = 3.0
#: Absolute bound that fails whatever the floor says (msprobe / CANN cosine acceptance).
ABS_COS_FAIL = 0.99
#: A floor error below this relative L2 is raised to it (a zero floor - device and reference sharing
#: a dtype - would make any last-bit difference an infinite ratio).
MIN_FLOOR_REL = 1e-4

# ---- trajectory rung --------------------------------------------------------------------------------
FLOOR_MIN_RMSE_LEVELS = 1.0
#: Without a noise floor: image cosine distance (1 - cos) of device vs reference must stay below this
#: (diffusers' fp16-vs-fp32 pipeline test); passing it is still only a WARN.
NO_FLOOR_COS_DIST = 5e-2

# ---- discrete tokens (URSA's sampler step and final tokens) ------------------------------------------
#: Tokens a clean port may draw differently from the floor without being judged: a uniform that falls
#: within float rounding of a cumulative-sum boundary (or of the jump threshold) picks the neighbouring code
#: on one side only.  Such flips are rare independent events, so their count is Poisson: on tiny-ursa's
#: 64 token-steps (4 steps x 16 tokens) a clean bf16 device flipped 4-5 where the floor flipped 1-5
#: (seeds 0-4), its transformer error being ~1.5x the floor's.  Three tokens keep 2x from judging counts
#: that small (a floor of 1 with a clean device's 5 is 5 / (1 + 3) = 1.25x); on a large grid the share
#: (0.5 %: 5 tokens of a 512x512 URSA step's 1024) takes over.  difforge's choice, not a public number.
TOKEN_ALLOWANCE_SHARE = 0.005
TOKEN_ALLOWANCE_COUNT = 3


def token_allowance(n: int) -> float:
    """The near-boundary allowance for ``n`` compared tokens, as a share: TOKEN_ALLOWANCE_SHARE, at least
    TOKEN_ALLOWANCE_COUNT tokens."""
    return max(TOKEN_ALLOWANCE_SHARE, TOKEN_ALLOWANCE_COUNT / max(1, int(n)))


# ---- smoke ------------------------------------------------------------------------------------------
BLANK_STD_LEVELS = 2.0
SATURATED_SHARE = 0.98


def cite(key: str) -> str:
    """Short label of a source, for table cells."""
    return SOURCES[key][0]
