"""Typed facts for the pure decisions, written the way the probes would report them (nothing built, no
files read): a libcuda.so.1 with given exports, a vLLM whose extensions need given entry points."""

from __future__ import annotations

from vllm_tmaguard.stages.elf import EM_X86_64, ElfInfo
from vllm_tmaguard.stages.facts import DriverFacts, Facts
from vllm_tmaguard.stages.layers import Layer
from vllm_tmaguard.stages.loader import LibraryResolution
from vllm_tmaguard.stages.vllm_probe import Extension, VllmFacts

# What a real CUDA 12/13 driver exports among the names the decisions look at, plus a few others.
REAL_DRIVER = frozenset(
    {
        "cuInit", "cuGetProcAddress", "cuGetProcAddress_v2", "cuLaunchKernel", "cuLaunchKernelEx",
        "cuTensorMapEncodeTiled", "cuTensorMapEncodeIm2col", "cuTensorMapEncodeIm2colWide",
        "cuTensorMapReplaceAddress", "cuMemCreate", "cuMemMap",
    }
)  # fmt: skip
# tkestack vCUDA master: hooks from CUDA 10/11 headers (no CUDA 12 entry points).
VCUDA = REAL_DRIVER - {
    "cuGetProcAddress_v2", "cuLaunchKernelEx", "cuTensorMapEncodeTiled", "cuTensorMapEncodeIm2col",
    "cuTensorMapEncodeIm2colWide", "cuTensorMapReplaceAddress",
} | {"g_vcuda_config"}  # fmt: skip

# vLLM 0.25's extensions, by what they need from the driver.
VLLM_NEEDS = {
    "vllm._C_stable_libtorch": ("cuTensorMapEncodeTiled", "cuGetProcAddress"),
    "vllm.vllm_flash_attn._vllm_fa3_C": ("cuTensorMapEncodeTiled",),
    "vllm.cumem_allocator": ("cuMemCreate", "cuMemMap"),
}


def driver(
    defined: frozenset[str] | None = REAL_DRIVER,
    *,
    soname: str | None = "libcuda.so.1",
    how: str = "LD_LIBRARY_PATH",
    real_driver: str | None = None,
    overlay_of: str | None = None,
    path: str | None = "/usr/local/nvidia/lib64/libcuda.so.1",
    error: str | None = None,
) -> DriverFacts:
    """libcuda.so.1 as the probe finds it; `defined` None: found but unreadable; `path` None: not found."""
    resolution = LibraryResolution("libcuda.so.1", path, how if path else "not found", ())
    info = (
        None
        if defined is None or path is None
        else ElfInfo(path, EM_X86_64, soname, (), defined, frozenset())
    )
    return DriverFacts(resolution, info, error, real_driver, overlay_of, "580.159.04")


def vllm(needs: dict[str, tuple[str, ...]] | None = None) -> VllmFacts:
    if needs is None:
        return VllmFacts(found=False)
    extensions = tuple(
        Extension(module, f"/site/{module.replace('.', '/')}.abi3.so", frozenset(symbols))
        for module, symbols in needs.items()
    )
    return VllmFacts(True, "0.25.1", "/site/vllm", extensions, True, ())


def facts(
    libcuda: DriverFacts,
    layers: tuple[Layer, ...] = (),
    needs: dict[str, tuple[str, ...]] | None = VLLM_NEEDS,
) -> Facts:
    return Facts(libcuda, vllm(needs), layers, "test", None, {})
