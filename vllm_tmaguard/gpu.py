"""The GPUs, through NVML only: never a CUDA context (docs/design.md §2.8)."""

from __future__ import annotations

from dataclasses import dataclass

from .nvml import Nvml, NvmlError


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
    cuda_driver_version: int | None = None  # e.g. 12040, derived from driver_version
    error: str | None = None  # why NVML could not answer; None when it did
    source: str = "nvml"

    @property
    def present(self) -> bool:
        return bool(self.gpus)

    def capabilities(self) -> frozenset[tuple[int, int]]:
        return frozenset(gpu.compute_capability for gpu in self.gpus)


_VIRTUALIZATION_MODES = {0: "none", 1: "pass-through", 2: "vgpu", 3: "host-vgpu", 4: "host-vsga"}


# The first Linux driver of each CUDA release (NVIDIA's CUDA toolkit release notes). The CUDA version is
# derived from the driver version because nvmlSystemGetCudaDriverVersion loads libcuda.so.1 to answer
# (measured on an H200, driver 580), which would map the layer before the guard can act (docs/design.md §2.7).
_FIRST_DRIVER_OF_CUDA = (
    ((580, 65, 6), 13000),
    ((575, 51, 3), 12090),
    ((570, 26, 0), 12080),
    ((560, 28, 3), 12060),
    ((555, 42, 2), 12050),
    ((550, 54, 14), 12040),
    ((545, 23, 6), 12030),
    ((535, 54, 3), 12020),
    ((530, 30, 2), 12010),
    ((525, 60, 13), 12000),
    ((520, 61, 5), 11080),
    ((450, 80, 2), 11000),
)


def cuda_version_of_driver(driver: str | None) -> int | None:
    """The newest CUDA version a driver supports, e.g. '550.142' -> 12040; None if unparsable or older."""
    try:
        parts = tuple(int(p) for p in (driver or "").split("."))
    except ValueError:
        return None
    padded = (*parts, 0, 0, 0)[:3]
    return next((cuda for first, cuda in _FIRST_DRIVER_OF_CUDA if padded >= first), None) if parts else None


def _optional(call, *args):  # type: ignore[no-untyped-def]
    try:
        return call(*args)
    except (NvmlError, AttributeError):
        return None


def probe_gpus() -> GpuFacts:
    """Asks NVML (in this process) for every GPU's name, compute capability, MIG and virtualization mode."""
    try:
        nvml = Nvml()
        nvml.init()
    except (OSError, NvmlError, AttributeError) as error:
        return GpuFacts(error=f"NVML unavailable: {error}")
    try:
        gpus = []
        for index in range(nvml.device_count()):
            handle = nvml.handle(index)
            mig = _optional(nvml.mig_mode, handle)
            virt = _optional(nvml.virtualization_mode, handle)
            gpus.append(
                Gpu(
                    index=index,
                    name=nvml.name(handle),
                    compute_capability=nvml.compute_capability(handle),
                    mig=None if mig is None else bool(mig),
                    virtualization=None if virt is None else _VIRTUALIZATION_MODES.get(virt, str(virt)),
                )
            )
        driver = _optional(nvml.driver_version)
        return GpuFacts(
            gpus=tuple(gpus), driver_version=driver, cuda_driver_version=cuda_version_of_driver(driver)
        )
    except (NvmlError, AttributeError) as error:
        return GpuFacts(error=f"NVML query failed: {error}")
    finally:
        _optional(nvml.shutdown)
