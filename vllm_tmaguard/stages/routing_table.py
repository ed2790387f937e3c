"""vLLM's TMA-dependent kernel paths and the knobs that steer around them, by vLLM version.

Read from each version's wheel (docs/research/vllm_tma_paths.md has file:line sources) and proven against
each table's release by the version matrix (tests/versions, docs/compat.md): every class, knob, module and
flag named here exists in that release. Checked at run time against the installed vLLM: a class name its
selector file does not list is reported as stale knowledge."""

import re

from .values import value_type

MIXED_PRECISION, SCALED_MM, MOE, ATTENTION = "mixed-precision linear", "FP8/INT8 linear", "MoE", "attention"
# The TMA classes vLLM's mixed-precision selector tries on sm_90, in its order, and their names in the record.
MIXED_PRECISION_TMA = (("MacheteLinearKernel", "Machete"), ("HummingLinearKernel", "Humming"))
# The CUTLASS 3.x class whose absence or presence in a version's table names the FP8/INT8 path.
SCALED_MM_CUTLASS = "CutlassFP8ScaledMMLinearKernel"


@value_type
class Kernel:
    name: str  # the class name VLLM_DISABLED_KERNELS takes
    family: str
    tma_majors: frozenset[int]  # compute-capability majors where its kernels use TMA (need a real encoder)
    sm90a_only: bool = False  # sm_90a cubins only: wrong on any other architecture
    needs_launch_ex: bool = False  # launches through cuLaunchKernelEx (Humming's launcher)
    latency_swap: bool = False  # W4A16/W8A16 kernel Marlin beats serving one stream (docs/design.md §3.3)


_HOPPER, _HOPPER_AND_LATER = frozenset({9}), frozenset({9, 10, 12})
KERNELS = {
    k.name: k
    for k in (
        Kernel("CutlassW4A8LinearKernel", MIXED_PRECISION, _HOPPER, sm90a_only=True),
        Kernel("MacheteLinearKernel", MIXED_PRECISION, _HOPPER, sm90a_only=True, latency_swap=True),
        Kernel("HummingLinearKernel", MIXED_PRECISION, _HOPPER, needs_launch_ex=True, latency_swap=True),
        Kernel("CutlassFP8ScaledMMLinearKernel", SCALED_MM, _HOPPER_AND_LATER),
        Kernel("CutlassInt8ScaledMMLinearKernel", SCALED_MM, _HOPPER_AND_LATER),
        Kernel("CutlassFp8BlockScaledMMKernel", SCALED_MM, _HOPPER_AND_LATER),
        Kernel("DeepGemmFp8BlockScaledMMKernel", SCALED_MM, frozenset({9, 10})),
        Kernel("FlashInferFp8DeepGEMMDynamicBlockScaledKernel", SCALED_MM, _HOPPER),
        Kernel("HummingFP8ScaledMMLinearKernel", SCALED_MM, _HOPPER, needs_launch_ex=True),
        Kernel("HummingInt8ScaledMMLinearKernel", SCALED_MM, _HOPPER, needs_launch_ex=True),
    )
}


@value_type
class VersionTable:
    since: str  # first vLLM version this table was read from; it applies up to the next table
    read_from: str
    listed_in: tuple[str, ...]  # selector files (relative to the vllm package) listing every kernel below
    kernels: tuple[str, ...]  # TMA-capable classes this version's selectors honour VLLM_DISABLED_KERNELS for
    gated_to_90: bool  # vLLM itself limits the sm_90a-only classes to compute capability 9.0 exactly
    deep_gemm_off: tuple[str, ...] = ()  # variables that keep DeepGEMM off when "0"
    flash_attn_env: str | None = None  # variable choosing the FlashAttention version (2 = no TMA)
    fa3_module: str | None = None  # FA3 extension; blocking its import makes vLLM fall back to FA2 by itself
    flashmla_module: str | None = None  # sm_90 TMA MLA kernels; vLLM falls back when it cannot import them
    no_knob: tuple[str, ...] = ()  # TMA paths no environment variable reaches, with the flag that does


_MIXED_03 = ("CutlassW4A8LinearKernel", "MacheteLinearKernel")
_FP8_LINEAR = (
    "CutlassFP8ScaledMMLinearKernel",
    "CutlassInt8ScaledMMLinearKernel",
    "CutlassFp8BlockScaledMMKernel",
    "DeepGemmFp8BlockScaledMMKernel",
    "FlashInferFp8DeepGEMMDynamicBlockScaledKernel",
)
_HUMMING = ("HummingLinearKernel", "HummingFP8ScaledMMLinearKernel", "HummingInt8ScaledMMLinearKernel")
_MOE_HINT = (
    "FP8 MoE (compressed-tensors: CUTLASS grouped GEMM; static per-tensor: FlashInfer CUTLASS) and "
    "GPTQ/AWQ MoE (Humming) are chosen without an environment knob: add `--moe-backend marlin` "
    "(FP8 also `--moe-backend triton`); W4A8 MoE has no non-TMA backend"
)
_FP8_NO_KNOB = "FP8/INT8 linear layers use CUTLASS sm90 with no knob in this version: serve a non-FP8 model"

_QUANT_KERNELS = "model_executor/layers/quantization/kernels/"
# 0.8.5 - 0.11.x: FA version by environment; vLLM falls back when FA3 or FlashMLA cannot be imported.
_FA_ENV = {
    "flash_attn_env": "VLLM_FLASH_ATTN_VERSION",
    "fa3_module": "vllm.vllm_flash_attn._vllm_fa3_C",
    "flashmla_module": "vllm._flashmla_C",
}
# From 0.15.1: both DeepGEMM knobs, FA3 steered by its extension's import, FlashMLA likewise.
_SINCE_0_15 = {
    "gated_to_90": True,
    "deep_gemm_off": ("VLLM_USE_DEEP_GEMM", "VLLM_MOE_USE_DEEP_GEMM"),
    "fa3_module": "vllm.vllm_flash_attn._vllm_fa3_C",
    "flashmla_module": "vllm._flashmla_C",
}
_LINEAR = ("model_executor/kernels/linear/__init__.py",)
_MIXED = (_QUANT_KERNELS + "mixed_precision/__init__.py",)

TABLES = (
    VersionTable(
        "0.6.6",
        "0.6.6.post1",
        (_QUANT_KERNELS + "__init__.py",),
        ("MacheteLinearKernel",),
        gated_to_90=False,
        no_knob=(_FP8_NO_KNOB,),
    ),
    VersionTable(
        "0.8.5",
        "0.8.5",
        _MIXED,
        ("MacheteLinearKernel",),
        gated_to_90=False,
        deep_gemm_off=("VLLM_USE_DEEP_GEMM",),
        no_knob=(_FP8_NO_KNOB,),
        **_FA_ENV,
    ),
    VersionTable(
        "0.10.2",
        "0.10.2",
        _MIXED,
        _MIXED_03,
        gated_to_90=True,
        deep_gemm_off=("VLLM_USE_DEEP_GEMM",),
        no_knob=(_FP8_NO_KNOB,),
        **_FA_ENV,
    ),
    VersionTable(
        "0.11.1",
        "0.11.2 (0.11.1's envs.py has the same knobs)",
        _MIXED,
        _MIXED_03,
        gated_to_90=True,
        deep_gemm_off=("VLLM_USE_DEEP_GEMM", "VLLM_MOE_USE_DEEP_GEMM"),
        no_knob=(_FP8_NO_KNOB,),
        **_FA_ENV,
    ),
    VersionTable(
        "0.15.1",
        "0.15.1",
        (*_MIXED, _QUANT_KERNELS + "scaled_mm/__init__.py"),
        (*_MIXED_03, "CutlassFP8ScaledMMLinearKernel", "CutlassInt8ScaledMMLinearKernel"),
        no_knob=("block-FP8 linear layers use CUTLASS sm90 with no knob in this version",),
        **_SINCE_0_15,
    ),
    VersionTable("0.20.2", "0.20.2", _LINEAR, _MIXED_03 + _FP8_LINEAR, no_knob=(_MOE_HINT,), **_SINCE_0_15),
    VersionTable(
        "0.25.1", "0.25.1", _LINEAR, _MIXED_03 + _FP8_LINEAR + _HUMMING, no_knob=(_MOE_HINT,), **_SINCE_0_15
    ),
    VersionTable(
        "0.32.0",
        "0.32.0 and 0.33.0",
        _LINEAR,
        _MIXED_03 + _FP8_LINEAR + _HUMMING,
        no_knob=(_MOE_HINT,),
        **_SINCE_0_15,
    ),
)
NEWEST_READ = (0, 33, 0)


def version_key(version: str) -> tuple[int, ...]:
    """'0.6.6.post1' -> (0, 6, 6); '0.32.0rc1.dev5+g1' -> (0, 32, 0)."""
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0])[:3])


def table_for(version: str | None) -> tuple[VersionTable, str | None]:
    """The table for an installed vLLM version, and a note when that version is outside what was read."""
    if not version:
        return TABLES[-1], "vLLM version unknown: using the newest table"
    key = version_key(version)
    older = [t for t in TABLES if version_key(t.since) <= key]
    if not older:
        return TABLES[0], f"vLLM {version} is older than any version read ({TABLES[0].since}): unverified"
    note = (
        f"vLLM {version} is newer than any version read (0.33.0): unverified" if key > NEWEST_READ else None
    )
    return older[-1], note
