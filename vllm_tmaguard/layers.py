"""Sharing-layer fingerprints (docs/design.md §2.9, §2.10): cheap, passive evidence only. Never calls into the
layer (its cuInit/nvmlInit may fork a helper or exit; some override dlsym): reads files, the environment
and ELF tables. A layer is named only on evidence from the library that answers libcuda.so.1 (its SONAME,
its exports) or from what the loader preloads; files and variables alone are not enough (a bare driver in
an image that once had /etc/vcuda is no vCUDA pod). A libcuda.so.1 that lacks what every real driver of its
era exports, with no layer named, is an unrecognized layer."""

import os
from collections.abc import Mapping
from typing import NamedTuple

from . import files
from .catalogue import ENCODERS, OVERLAY_TRIGGERS, PROC_ADDRESS_V2
from .elf import ElfInfo
from .loader import under_root

# Layer names, with what an operator reads in the log line.
LABELS = {
    "vcuda": "tkestack vCUDA",
    "vcuda-fork": "a vCUDA fork (exports the CUDA 12 entry points)",
    "hami": "HAMi-core",
    "lupine": "lupine (GPU over the network)",
    "cgpu": "Alibaba cGPU",
    "mps": "NVIDIA MPS",
    "unrecognized": "an unrecognized GPU-sharing layer",
}


class Layer(NamedTuple):
    name: str  # a key of LABELS
    evidence: tuple[str, ...]
    forwards_to_local_driver: bool = True  # False: no local real driver to forward to (network GPU)

    @property
    def label(self) -> str:
        return LABELS[self.name]


class PodEvidence(NamedTuple):
    """Everything the fingerprints look at, gathered once (side effects stay in the probe)."""

    existing_paths: frozenset[str]  # which of FINGERPRINT_PATHS exist (paths as inside the pod)
    preload: tuple[str, ...]  # LD_PRELOAD entries and /etc/ld.so.preload lines
    environ: Mapping[str, str]
    libcuda: ElfInfo | None  # the library answering libcuda.so.1 (behind the overlay: the layer's file)


FINGERPRINT_PATHS = ("/etc/vcuda", "/usr/local/nvidia/bin/gpu-client", "/usr/local/vgpu")
_PRELOAD_FILE = "/etc/ld.so.preload"
_PRELOAD_LIMIT = 1 << 20
# The environment variables the fingerprints look at, by prefix (LD_PRELOAD besides).
ENV_PREFIXES = (
    "CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_SM_LIMIT", "LUPINE_SERVER", "ALIYUN_COM_GPU_MEM_",
    "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
)  # fmt: skip


def gather_evidence(root: str, environ: Mapping[str, str], libcuda: ElfInfo | None) -> PodEvidence:
    existing = frozenset(p for p in FINGERPRINT_PATHS if files.exists(under_root(root, p)))
    preload = list(environ.get("LD_PRELOAD", "").replace(":", " ").split())
    text = files.read_text(under_root(root, _PRELOAD_FILE), _PRELOAD_LIMIT) or ""
    preload += [w for line in text.splitlines() for w in line.split("#", 1)[0].split()]
    variables = {name: environ[name] for name in environ if name.startswith(ENV_PREFIXES)}
    return PodEvidence(existing, tuple(preload), variables, libcuda)


def _env_matches(environ: Mapping[str, str], prefixes: tuple[str, ...]) -> list[str]:
    return sorted(f"env {k}" for k in environ if k.startswith(prefixes))


def _vcuda(evidence: PodEvidence) -> Layer | None:
    libcuda = evidence.libcuda
    if libcuda is None:
        return None
    own = []
    if libcuda.soname == "libcuda-control.so":
        own.append(f"{os.path.basename(libcuda.path)} has SONAME libcuda-control.so")
    if "g_vcuda_config" in libcuda.defined:
        own.append("libcuda.so.1 exports g_vcuda_config")
    if not own:
        return None
    files = [f"{p} exists" for p in FINGERPRINT_PATHS[:2] if p in evidence.existing_paths]
    fork = {PROC_ADDRESS_V2, *ENCODERS} <= libcuda.defined
    return Layer("vcuda-fork" if fork else "vcuda", (*own, *files))


def _hami(evidence: PodEvidence) -> Layer | None:
    preloads = [f"preloads {p}" for p in evidence.preload if os.path.basename(p) == "libvgpu.so"]
    limits = _env_matches(evidence.environ, ("CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_SM_LIMIT"))
    files = ["/usr/local/vgpu exists"] if "/usr/local/vgpu" in evidence.existing_paths else []
    # HAMi-core works only when preloaded; its limits and mount without the preload are a pod that HAMi's
    # webhook prepared but whose preload did not take.
    return Layer("hami", (*preloads, *limits, *files)) if preloads else None


def detect_layers(evidence: PodEvidence, cuda_driver_version: int | None = None) -> tuple[Layer, ...]:
    """Every layer with enough evidence, the one that owns libcuda.so.1 first. `cuda_driver_version`: what
    the running kernel module supports; a libcuda.so.1 lacking CUDA 12's entry points under a module older
    than CUDA 12 is that old driver, not a layer."""
    layers = [layer for layer in (_vcuda(evidence), _hami(evidence)) if layer is not None]
    if "LUPINE_SERVER" in evidence.environ:
        layers.append(Layer("lupine", ("env LUPINE_SERVER",), forwards_to_local_driver=False))
    if cgpu := _env_matches(evidence.environ, ("ALIYUN_COM_GPU_MEM_",)):
        layers.append(Layer("cgpu", tuple(cgpu)))
    if mps := _env_matches(
        evidence.environ, ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
    ):
        layers.append(Layer("mps", tuple(mps)))
    libcuda = evidence.libcuda
    owns_libcuda = any(layer.name in ("vcuda", "vcuda-fork", "lupine") for layer in layers)
    old_driver = cuda_driver_version is not None and cuda_driver_version < 12000
    if libcuda is not None and not owns_libcuda and not old_driver:
        lacking = [name for name in OVERLAY_TRIGGERS if name not in libcuda.defined]
        if lacking or libcuda.soname not in (None, "libcuda.so.1"):
            why = f"lacks {', '.join(lacking)}" if lacking else f"has SONAME {libcuda.soname}"
            layers.insert(0, Layer("unrecognized", (f"{os.path.basename(libcuda.path)} {why}",)))
    return tuple(layers)
