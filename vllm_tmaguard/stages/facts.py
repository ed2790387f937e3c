"""One pass of passive probes over files: everything planning what to supply needs, gathered without side
effects on the process (no CUDA context, no load of libcuda.so.1, no call into a sharing layer)."""

from collections.abc import Mapping

from ..loaded import read_loaded_objects
from .catalogue import DRIVER_LIBRARY, ENCODERS, MARKER
from .compat import BYPASSED, BYPASSED_VCUDA
from .elf import ElfError, ElfInfo, read_elf
from .gpu import cuda_version_of_driver, read_driver_version
from .layers import (
    LIBCUDA_PREFIXES,
    OWNS_LIBCUDA,
    Layer,
    PodEvidence,
    detect_layers,
    gather_evidence,
    preloaded_layer,
)
from .loader import LibraryResolution, find_real_driver, resolve_library
from .memory import VCUDA_CONFIG, vcuda_quota
from .preloads import library_of
from .scan_cache import probe_vllm_cached
from .values import value_type
from .vllm_probe import VllmFacts


@value_type
class DriverFacts:
    resolution: LibraryResolution
    info: ElfInfo | None  # the library answering libcuda.so.1; behind this package's overlay, the layer's
    error: str | None = None  # why that file could not be read
    real_driver: str | None = None  # a real NVIDIA driver file behind a layer, exporting the encoders
    overlay_of: str | None = (
        None  # libcuda.so.1 is this package's overlay (tmaguard env) in front of this file
    )
    module_version: str | None = None  # the NVIDIA kernel module's version (/proc/driver/nvidia/version)
    searched_to: str | None = None  # the real driver's search: the last step it looked in (None: no search)

    @property
    def read_library_path(self) -> bool:
        """The real driver's search went through LD_LIBRARY_PATH's directories (loader.real_driver_search):
        then the variable's value is a verdict input, not only its effect on the loader's own search."""
        return self.searched_to not in (None, "beside the layer")

    @property
    def path(self) -> str | None:
        return self.resolution.path

    @property
    def cuda_version(self) -> int | None:
        return cuda_version_of_driver(self.module_version)

    def exports(self, symbol: str) -> bool:
        """libcuda.so.1 answers `symbol`: the layer exports it, or this package's overlay stands in front of
        it (the overlay carries every driver entry point)."""
        return self.overlay_of is not None or (self.info is not None and symbol in self.info.defined)


@value_type
class Facts:
    driver: DriverFacts
    vllm: VllmFacts
    layers: tuple[Layer, ...]
    trigger: str
    kernels_listed: frozenset[str] | None  # the routing table's names the installed vLLM lists
    environ: Mapping[str, str]  # the user's settings routing merges with
    eager: str | None = None  # the command-line flag that makes vLLM run eager (process.py), if any


def probe_driver(environ: Mapping[str, str], root: str) -> DriverFacts:
    module_version = read_driver_version(root)
    resolution = resolve_library(DRIVER_LIBRARY, environ, root, read_loaded_objects())
    if resolution.path is None:
        return DriverFacts(resolution, None, module_version=module_version)
    try:
        info = read_elf(resolution.path, prefixes=(*LIBCUDA_PREFIXES, MARKER.encode()))
        overlay_of = _overlaid_layer(info)
        if overlay_of is not None:
            info = read_elf(overlay_of, prefixes=LIBCUDA_PREFIXES)
    except ElfError as error:
        return DriverFacts(resolution, None, error=error.why, module_version=module_version)
    real, searched = None, None
    if ENCODERS[0] not in info.defined:
        real, searched = find_real_driver(info, module_version, environ, root)
    return DriverFacts(resolution, info, None, real, overlay_of, module_version, searched)


def _overlaid_layer(info: ElfInfo) -> str | None:
    """The layer file behind this package's overlay (installed by `tmaguard env`), if `info` is one."""
    if MARKER not in info.defined:
        return None
    return next((needed for needed in info.needed if needed.startswith("/")), None)


def _bypassed_vcuda(layers: tuple[Layer, ...], root: str, driver: DriverFacts) -> tuple[Layer, ...]:
    """vCUDA configured for this pod (a quota in its vcuda.config, `enable` on) while this process's
    libcuda.so.1 is not a vCUDA build: the layer is bypassed here (compat.py), never "no sharing layer". A
    vcuda.config of gpu-manager's whole-GPU containers (`enable` 0) limits nothing and names nothing."""
    if driver.info is None or any(layer.name in ("vcuda", "vcuda-fork") for layer in layers):
        return ()  # no libcuda.so.1 that could be read: the driver's own problem says so, first
    quota = vcuda_quota(root)
    if quota is None:
        return ()
    evidence = (
        f"{VCUDA_CONFIG} sets a quota of {quota} bytes",
        f"libcuda.so.1 is {driver.path or 'not found'}, not a vCUDA build",
    )
    return (Layer(BYPASSED_VCUDA, evidence, conditions=(BYPASSED,)),)


def identify(layers: tuple[Layer, ...], evidence: PodEvidence) -> tuple[Layer, ...]:
    """Each layer with its library file's identity (which build it is): the library answering libcuda.so.1
    for a layer that is it, the first readable preload entry for a preloaded one; files the fingerprints
    read already, so no new verdict input. The full run's, the doctor's and `tmaguard check`'s; a replay
    keeps the record's."""
    found = []
    for layer in layers:
        path = _library_path(layer, evidence)
        found.append(layer._replace(library=library_of(path)) if path else layer)
    return tuple(found)


def _library_path(layer: Layer, evidence: PodEvidence) -> str | None:
    if layer.name in OWNS_LIBCUDA or layer.name == "unrecognized":
        return evidence.libcuda.path if evidence.libcuda else None
    named = [info.path for entry, info in evidence.preloaded.items() if preloaded_layer(entry) == layer.name]
    return named[0] if named else None


def probe(
    environ: Mapping[str, str],
    root: str,
    trigger: str,
    *,
    eager: str | None,
    vllm_dir: str | None = None,
    cache_dir: str | None = None,
) -> Facts:
    """One pass of the file probes. `eager`: the process's eager flag (launch_file.process_eager_flag), read
    once by the caller so that a verdict's inputs and its routing come from one reading of a `--config`
    file; `vllm_dir`: the vLLM package directory to read instead of the one on sys.path; `cache_dir`: where
    the vLLM scan is cached across processes (the guard's private directory)."""
    driver = probe_driver(environ, root)
    evidence = gather_evidence(root, environ, driver.info)
    layers = identify(detect_layers(evidence, driver.cuda_version), evidence)
    layers = (*layers, *_bypassed_vcuda(layers, root, driver))
    vllm = probe_vllm_cached(cache_dir, vllm_dir)
    return Facts(driver, vllm, layers, trigger, vllm.kernels_listed, dict(environ), eager)
