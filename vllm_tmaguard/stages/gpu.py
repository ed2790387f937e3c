"""The GPUs this pod reaches, read from the NVIDIA kernel module's files (docs/design.md §2.8): no NVML and no
CUDA in this process. In a vCUDA pod libnvidia-ml.so.1 is the sharing layer itself, whose nvmlInit runs the
layer's init (its config, a registration with the node's daemon, exit(-1) where that fails), and NVML's own
init loads libcuda.so.1; the kernel module's files cost well under a millisecond.

Steps, in order:
  1. /proc/driver/nvidia/version: the driver version (vCUDA reads the same line to pick its real driver).
  2. /proc/driver/nvidia/gpus/<bus id>/information: each GPU's model name, bus id and device minor.
  3. /dev/nvidia<minor>: which of them the pod was given (the device plugin mounts only those).
  4. The compute capability, from the model name (GPU_FAMILIES).
System paths are read under TMAGUARD_ROOT (tests lay out a pod's files there)."""

import os
import re

from . import door
from .loader import under_root
from .values import value_type


@value_type
class Gpu:
    index: int
    name: str
    compute_capability: tuple[int, int] | None  # None: a model this package does not know
    bus_id: str = ""
    mig: bool | None = None  # NVML only (the doctor's child process); None: not asked or not supported
    virtualization: str | None = None  # NVML only: none, pass-through, vgpu, host-vgpu, ...
    memory_total: int | None = None  # NVML only: the device's memory as NVML reports it (layers may clamp)


@value_type
class GpuFacts:
    gpus: tuple[Gpu, ...] = ()
    driver_version: str | None = None
    cuda_driver_version: int | None = None  # e.g. 12040, derived from driver_version
    error: str | None = None  # why the GPUs could not be read; None when they were
    source: str = "procfs"

    @property
    def present(self) -> bool:
        return bool(self.gpus)

    def capabilities(self) -> frozenset[tuple[int, int]]:
        """The GPUs' compute capabilities; empty when any of them is unknown (routing then assumes the
        worst: every architecture with TMA kernels)."""
        if any(gpu.compute_capability is None for gpu in self.gpus):
            return frozenset()
        return frozenset(gpu.compute_capability for gpu in self.gpus if gpu.compute_capability)


# Model name patterns -> compute capability, most specific first (NVIDIA's CUDA GPUs list). Names as the
# driver reports them, e.g. "NVIDIA H100 80GB HBM3", "NVIDIA GeForce RTX 4090", "NVIDIA A10G".
GPU_FAMILIES: tuple[tuple[str, tuple[int, int]], ...] = (
    (r"RTX \d+ Ada|Ada Generation", (8, 9)),
    (r"\bGB10\b|DGX Spark", (12, 1)),
    (r"RTX PRO \d+ Blackwell|GeForce RTX 50\d\d", (12, 0)),
    (r"\bG?B300\b", (10, 3)),
    (r"\bG?B200\b|\bB100\b", (10, 0)),
    (r"\bGH200\b|\bH100\b|\bH200\b|\bH800\b|\bH20\b", (9, 0)),
    (r"\bL40S?\b|\bL20\b|\bL4\b|\bL2\b|RTX 40\d\d", (8, 9)),
    (r"\bA100\b|\bA800\b|\bA30\b", (8, 0)),
    (r"\bA10G?\b|\bA40\b|\bA16\b|\bA2\b|RTX 30\d\d|RTX A\d+", (8, 6)),
    (r"\bT4\b|RTX 20\d\d|Quadro RTX|TITAN RTX", (7, 5)),
    (r"\bV100\b|TITAN V\b", (7, 0)),
)

# The first Linux x86_64 driver of each CUDA release: NVIDIA's CUDA toolkit release notes, "CUDA Toolkit and
# Corresponding Driver Versions" (docs/design.md §2.12). A driver supports every CUDA release up to the newest
# listed at or below it, e.g. 470.57.02 -> 11.4.
_FIRST_DRIVER_OF_CUDA = (
    ((590, 44, 1), 13010),
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
    ((515, 43, 4), 11070),
    ((510, 39, 1), 11060),
    ((495, 29, 5), 11050),
    ((470, 42, 1), 11040),
    ((465, 19, 1), 11030),
    ((460, 27, 3), 11020),
    ((455, 23, 0), 11010),
    ((450, 51, 5), 11000),
    ((440, 33, 0), 10020),
    ((418, 39, 0), 10010),
    ((410, 48, 0), 10000),
)
_DRIVER_VERSION = re.compile(r"\b(\d+\.\d+(?:\.\d+)?)\b")
_PROC = "/proc/driver/nvidia"
_PROC_FILE_LIMIT = 1 << 20


def capability_of(name: str) -> tuple[int, int] | None:
    return next((cc for pattern, cc in GPU_FAMILIES if re.search(pattern, name)), None)


def driver_tuple(driver: str | None) -> tuple[int, int, int] | None:
    """'535.54.03' -> (535, 54, 3), '550.142' -> (550, 142, 0); None if unparsable."""
    try:
        parts = tuple(int(p) for p in (driver or "").split("."))
    except ValueError:
        return None
    if not 1 <= len(parts) <= 3:
        return None
    major, minor, patch = (*parts, 0, 0)[:3]
    return major, minor, patch


def cuda_version_of_driver(driver: str | None) -> int | None:
    """The newest CUDA version a driver supports, e.g. '550.142' -> 12040; None if unparsable or older."""
    version = driver_tuple(driver)
    if version is None:
        return None
    return next((cuda for first, cuda in _FIRST_DRIVER_OF_CUDA if version >= first), None)


def parse_driver_version(text: str) -> str | None:
    """The version on /proc/driver/nvidia/version's NVRM line ("NVRM version: NVIDIA UNIX x86_64 Kernel
    Module  580.95.05  Tue ..." -> "580.95.05")."""
    line = next((line for line in text.splitlines() if line.startswith("NVRM")), "")
    match = _DRIVER_VERSION.search(line.partition("Module")[2] or line)
    return match.group(1) if match else None


def parse_information(text: str) -> dict[str, str]:
    """The 'Key: value' lines of /proc/driver/nvidia/gpus/<bus id>/information."""
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    return fields


def _read(path: str) -> str | None:
    return door.read_text(path, _PROC_FILE_LIMIT)


def read_driver_version(root: str = "/") -> str | None:
    """The running NVIDIA kernel module's version; None without one."""
    text = _read(under_root(root, f"{_PROC}/version"))
    return None if text is None else parse_driver_version(text)


def probe_gpus(root: str = "/") -> GpuFacts:
    """The pod's GPUs from the kernel module's files (the steps in this module's docstring)."""
    if _read(under_root(root, f"{_PROC}/version")) is None:
        return GpuFacts(error=f"no NVIDIA kernel module ({_PROC}/version is missing)")
    driver = read_driver_version(root)
    gpus = []
    for bus_id, _, info, device in _node_gpus(root):
        if not info.get("Device Minor", "").isdigit() or not door.exists(device):
            continue  # a GPU of the node that this pod was not given
        name = info.get("Model", "unknown")
        gpus.append(Gpu(len(gpus), name, capability_of(name), bus_id))
    return GpuFacts(tuple(gpus), driver, cuda_version_of_driver(driver))


def _node_gpus(root: str) -> list[tuple[str, str, dict[str, str], str]]:
    """(bus id, its information file, that file's fields, the device node its minor names) of each GPU the
    kernel module lists, in bus order (steps 2 and 3 of this module's docstring)."""
    gpus_dir = under_root(root, f"{_PROC}/gpus")
    try:
        bus_ids = door.listdir(gpus_dir)
    except OSError:
        return []
    gpus = []
    for bus_id in bus_ids:
        information = os.path.join(gpus_dir, bus_id, "information")
        info = parse_information(_read(information) or "")
        device = under_root(root, f"/dev/nvidia{info.get('Device Minor', '')}")
        gpus.append((bus_id, information, info, device))
    return gpus
