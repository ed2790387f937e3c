"""One pass of passive probes: everything the decision needs, gathered without side effects on the process
(no CUDA context, no load of libcuda.so.1, no call into a sharing layer)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from .elf import ElfError, ElfInfo, read_elf
from .gpu import GpuFacts, probe_gpus
from .layers import ENCODERS, Layer, detect_layers, gather_evidence
from .loader import (
    LibraryResolution,
    read_self_maps,
    resolve_library,
    search_order,
    split_library_path,
    under_root,
)
from .routing_table import table_for
from .scan_cache import probe_vllm_cached
from .vllm_probe import DRIVER_LIBRARY, VllmFacts, names_listed

OVERLAY_MARKER = "tmaguard_shim_source"  # exported by every shim and overlay of this package
_DRIVER_FILE = re.compile(r"^libcuda\.so\.(\d+(?:\.\d+)+)$")


@dataclass(frozen=True)
class DriverFacts:
    resolution: LibraryResolution
    info: ElfInfo | None  # SONAME, NEEDED and exported cu* names of the file that answers libcuda.so.1
    error: str | None = None  # why that file could not be read
    real_driver: str | None = None  # a real NVIDIA driver file behind a layer, exporting the encoders
    overlay_of: str | None = None  # libcuda.so.1 is this package's overlay in front of this layer file

    @property
    def path(self) -> str | None:
        return self.resolution.path

    def exports(self, symbol: str) -> bool:
        return self.info is not None and symbol in self.info.defined


@dataclass(frozen=True)
class Facts:
    gpu: GpuFacts
    driver: DriverFacts
    vllm: VllmFacts
    layers: tuple[Layer, ...]
    trigger: str
    kernels_listed: frozenset[str] | None = None  # the routing table's names the installed vLLM lists
    environ: Mapping[str, str] = field(default_factory=dict)  # the user's settings routing merges with


# Where NVIDIA's container toolkit and distributions put the driver, searched after the layer's own directory
# and the loader's paths (read under TMAGUARD_ROOT).
DRIVER_DIRS = (
    "/usr/local/nvidia/lib64",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/lib64",
    "/usr/lib/wsl/lib",
)


def driver_search_dirs(layer_path: str, environ: Mapping[str, str], root: str) -> list[str]:
    """Where a real driver behind a layer may be, in the order searched: the layer's directory (vCUDA keeps
    the real file beside it), LD_LIBRARY_PATH, the directories ld.so.cache names for libcuda.so.1, the
    usual driver directories."""
    dirs = [os.path.dirname(layer_path), os.path.dirname(os.path.realpath(layer_path))]
    dirs += split_library_path(environ.get("LD_LIBRARY_PATH", ""), os.getcwd())
    dirs += [
        os.path.dirname(path) for path, how in search_order(DRIVER_LIBRARY, {}, root, "/", os.uname().machine)
    ]
    dirs += [under_root(root, directory) for directory in DRIVER_DIRS]
    return list(dict.fromkeys(dirs))


def find_real_driver(
    libcuda: ElfInfo | None, driver_version: str | None, environ: Mapping[str, str], root: str
) -> str | None:
    """The real driver file the layer sits in front of: a libcuda.so.<version> (or libcuda.so.1) with SONAME
    libcuda.so.1 that exports the encoders and is not the layer itself, from the first directory of
    driver_search_dirs that has one; within a directory NVML's driver version first, then the newest."""
    if libcuda is None:
        return None
    layer = os.path.realpath(libcuda.path)
    for directory in driver_search_dirs(libcuda.path, environ, root):
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        candidates = []
        for name in names:
            match = _DRIVER_FILE.match(name)
            path = os.path.join(directory, name)
            if (match or name == DRIVER_LIBRARY) and os.path.realpath(path) != layer:
                version = match.group(1) if match else "0"
                candidates.append((version == driver_version, _version_key(version), path))
        for _, _, path in sorted(candidates, reverse=True):
            try:
                info = read_elf(path, prefixes=(b"cuTensorMap", OVERLAY_MARKER.encode()))
            except ElfError:
                continue
            real = ENCODERS[0] in info.defined and OVERLAY_MARKER not in info.defined
            if info.soname == DRIVER_LIBRARY and real:
                return path
    return None


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def probe_driver(environ: Mapping[str, str], root: str, driver_version: str | None) -> DriverFacts:
    resolution = resolve_library(DRIVER_LIBRARY, environ, root, read_self_maps())
    if resolution.path is None:
        return DriverFacts(resolution, None)
    try:
        info = read_elf(resolution.path, prefixes=(b"cu", b"g_vcuda", OVERLAY_MARKER.encode()))
        overlay_of = _overlaid_layer(info)
        if overlay_of is not None:
            layer = read_elf(overlay_of, prefixes=(b"cu", b"g_vcuda"))
            info = replace(layer, defined=layer.defined | info.defined - {OVERLAY_MARKER})
    except ElfError as error:
        return DriverFacts(resolution, None, error=error.why)
    real = None if ENCODERS[0] in info.defined else find_real_driver(info, driver_version, environ, root)
    return DriverFacts(resolution, info, real_driver=real, overlay_of=overlay_of)


def _overlaid_layer(info: ElfInfo) -> str | None:
    """The layer file behind this package's overlay (installed by `tmaguard env`), if `info` is one."""
    if OVERLAY_MARKER not in info.defined:
        return None
    return next((needed for needed in info.needed if needed.startswith("/")), None)


def probe(
    environ: Mapping[str, str],
    root: str,
    trigger: str,
    gpu: GpuFacts | None = None,
    vllm_dir: str | None = None,
    cache_dir: str | None = None,
) -> Facts:
    """One pass of the probes. `gpu`: NVML's answer gathered elsewhere (the doctor asks NVML in a child
    process); `vllm_dir`: the vLLM package directory to read instead of the one on sys.path; `cache_dir`:
    where the vLLM scan is cached across processes (the guard's private record directory)."""
    # The loader's view first: nvmlInit loads libcuda.so.1 (measured, driver 580), after which it is mapped.
    driver = probe_driver(environ, root, gpu.driver_version if gpu else None)
    gpu = probe_gpus(root) if gpu is None else gpu
    layers = detect_layers(gather_evidence(root, environ, driver.info))
    vllm = probe_vllm_cached(cache_dir, vllm_dir)
    listed = None
    if vllm.package_dir:
        table, _ = table_for(vllm.version)
        listed = names_listed(vllm.package_dir, table.listed_in, table.kernels)
    return Facts(
        gpu=gpu,
        driver=driver,
        vllm=vllm,
        layers=layers,
        trigger=trigger,
        kernels_listed=listed,
        environ=dict(environ),
    )
