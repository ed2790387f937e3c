"""The GPUs, through NVML only: never a CUDA context (DESIGN.md §2.6)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from types import ModuleType


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    compute_capability: tuple[int, int]
    mig: bool | None = None  # None: NVML cannot tell (not supported)
    virtualization: str | None = None  # NVML virtualization mode: none, pass-through, vgpu, host-vgpu, ...


@dataclass(frozen=True)
class GpuFacts:
    gpus: tuple[Gpu, ...] = ()
    driver_version: str | None = None
    cuda_driver_version: int | None = None  # e.g. 12040
    error: str | None = None  # why NVML could not answer; None when it did
    source: str = "nvml"

    @property
    def present(self) -> bool:
        return bool(self.gpus)

    def capabilities(self) -> frozenset[tuple[int, int]]:
        return frozenset(gpu.compute_capability for gpu in self.gpus)


_VIRTUALIZATION_MODES = {0: "none", 1: "pass-through", 2: "vgpu", 3: "host-vgpu", 4: "host-vsga"}


def _pynvml() -> ModuleType:
    """vLLM's copy if vLLM already loaded it (no second import on its start-up path), else nvidia-ml-py."""
    for name in ("vllm.third_party.pynvml", "pynvml"):
        module = sys.modules.get(name)
        if module is not None:
            return module
    import pynvml

    return pynvml


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _optional(call, *args):  # type: ignore[no-untyped-def]
    try:
        return call(*args)
    except Exception:
        return None


def probe_gpus() -> GpuFacts:
    """Asks NVML (in this process) for every GPU's name, compute capability, MIG and virtualization mode."""
    try:
        nvml = _pynvml()
        nvml.nvmlInit()
    except Exception as error:
        return GpuFacts(error=f"NVML unavailable: {error}")
    try:
        gpus = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
            mig = _optional(nvml.nvmlDeviceGetMigMode, handle)
            virt = _optional(nvml.nvmlDeviceGetVirtualizationMode, handle)
            gpus.append(
                Gpu(
                    index=index,
                    name=_text(nvml.nvmlDeviceGetName(handle)),
                    compute_capability=(int(major), int(minor)),
                    mig=None if mig is None else bool(mig[0]),
                    virtualization=None if virt is None else _VIRTUALIZATION_MODES.get(virt, str(virt)),
                )
            )
        return GpuFacts(
            gpus=tuple(gpus),
            driver_version=_optional(lambda: _text(nvml.nvmlSystemGetDriverVersion())),
            cuda_driver_version=_optional(nvml.nvmlSystemGetCudaDriverVersion),
        )
    except Exception as error:
        return GpuFacts(error=f"NVML query failed: {error}")
    finally:
        _optional(nvml.nvmlShutdown)
