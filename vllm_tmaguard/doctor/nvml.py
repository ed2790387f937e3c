"""The few NVML calls `tmaguard doctor --active` makes in a child process, through ctypes (nvidia-ml-py's
pynvml costs 30-40 ms to import). The guard itself never calls NVML (gpu.py)."""

from __future__ import annotations

import ctypes

from ..stages.gpu import Gpu, GpuFacts, cuda_version_of_driver

_SUCCESS = 0


class NvmlError(RuntimeError):
    def __init__(self, function: str, code: int, message: str) -> None:
        self.function, self.code = function, code
        super().__init__(f"{function}: {message} ({code})")


class Nvml:
    def __init__(self, library: str = "libnvidia-ml.so.1") -> None:
        self._lib = ctypes.CDLL(library)  # OSError when NVML is not installed

    def _call(self, function: str, *args: object) -> None:
        code = getattr(self._lib, function)(*args)  # AttributeError when this NVML lacks the function
        if code != _SUCCESS:
            raise NvmlError(function, code, self._error_string(code))

    def _error_string(self, code: int) -> str:
        try:
            describe = self._lib.nvmlErrorString
            describe.restype = ctypes.c_char_p
            return (describe(code) or b"unknown error").decode(errors="replace")
        except AttributeError:
            return "unknown error"

    def init(self) -> None:
        self._call("nvmlInit_v2" if hasattr(self._lib, "nvmlInit_v2") else "nvmlInit")

    def shutdown(self) -> None:
        self._call("nvmlShutdown")

    def device_count(self) -> int:
        count = ctypes.c_uint()
        self._call("nvmlDeviceGetCount_v2", ctypes.byref(count))
        return count.value

    def handle(self, index: int) -> ctypes.c_void_p:
        handle = ctypes.c_void_p()
        self._call("nvmlDeviceGetHandleByIndex_v2", ctypes.c_uint(index), ctypes.byref(handle))
        return handle

    def name(self, handle: ctypes.c_void_p) -> str:
        buffer = ctypes.create_string_buffer(96)
        self._call("nvmlDeviceGetName", handle, buffer, ctypes.c_uint(len(buffer)))
        return buffer.value.decode(errors="replace")

    def compute_capability(self, handle: ctypes.c_void_p) -> tuple[int, int]:
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._call("nvmlDeviceGetCudaComputeCapability", handle, ctypes.byref(major), ctypes.byref(minor))
        return major.value, minor.value

    def mig_mode(self, handle: ctypes.c_void_p) -> int:
        current, pending = ctypes.c_uint(), ctypes.c_uint()
        self._call("nvmlDeviceGetMigMode", handle, ctypes.byref(current), ctypes.byref(pending))
        return current.value

    def virtualization_mode(self, handle: ctypes.c_void_p) -> int:
        mode = ctypes.c_int()
        self._call("nvmlDeviceGetVirtualizationMode", handle, ctypes.byref(mode))
        return mode.value

    def memory_total(self, handle: ctypes.c_void_p) -> int:
        memory = (ctypes.c_ulonglong * 3)()  # nvmlMemory_t: total, free, used
        self._call("nvmlDeviceGetMemoryInfo", handle, memory)
        return int(memory[0])

    def driver_version(self) -> str:
        buffer = ctypes.create_string_buffer(96)
        self._call("nvmlSystemGetDriverVersion", buffer, ctypes.c_uint(len(buffer)))
        return buffer.value.decode(errors="replace")


_VIRTUALIZATION_MODES = {0: "none", 1: "pass-through", 2: "vgpu", 3: "host-vgpu", 4: "host-vsga"}


def _optional(call, *args):  # type: ignore[no-untyped-def]
    try:
        return call(*args)
    except (NvmlError, AttributeError):
        return None


def probe_with_nvml(library: str = "libnvidia-ml.so.1") -> GpuFacts:
    """Every GPU's name, compute capability, MIG and virtualization mode, from NVML in this process. Only
    `tmaguard doctor --active` runs it, in a child process: in a vCUDA pod NVML is the sharing layer, whose
    nvmlInit runs the layer's init (docs/design.md §2.8)."""
    try:
        nvml = Nvml(library)
        nvml.init()
    except (OSError, NvmlError, AttributeError) as error:
        return GpuFacts(error=f"NVML unavailable: {error}", source="nvml")
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
                    memory_total=_optional(nvml.memory_total, handle),
                )
            )
        driver = _optional(nvml.driver_version)
        return GpuFacts(
            gpus=tuple(gpus),
            driver_version=driver,
            cuda_driver_version=cuda_version_of_driver(driver),
            source="nvml",
        )
    except (NvmlError, AttributeError) as error:
        return GpuFacts(error=f"NVML query failed: {error}", source="nvml")
    finally:
        _optional(nvml.shutdown)
