"""Sharing-layer fingerprints (docs/design.md §2.9, §2.10): cheap, passive evidence only. Never calls into
the layer (its cuInit/nvmlInit may fork a helper or exit; some override dlsym), reads files, env and ELF
tables."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from .elf import ElfInfo
from .loader import under_root

ENCODERS = (
    "cuTensorMapEncodeTiled",
    "cuTensorMapEncodeIm2col",
    "cuTensorMapEncodeIm2colWide",
    "cuTensorMapReplaceAddress",
)


@dataclass(frozen=True)
class Layer:
    name: str  # vcuda, vcuda-fork, hami, lupine, cgpu, mps
    evidence: tuple[str, ...]
    forwards_to_local_driver: bool = True  # False: no local real driver to forward to (network GPU)


@dataclass(frozen=True)
class PodEvidence:
    """Everything the fingerprints look at, gathered once (side effects stay in the probe)."""

    existing_paths: frozenset[str]  # which of FINGERPRINT_PATHS exist (paths as inside the pod)
    preload: tuple[str, ...]  # LD_PRELOAD entries and /etc/ld.so.preload lines
    environ: Mapping[str, str]
    libcuda: ElfInfo | None


FINGERPRINT_PATHS = (
    "/etc/vcuda",
    "/etc/vcuda/vcuda.sock",
    "/usr/local/nvidia/bin/gpu-client",
    "/usr/local/vgpu",
    "/usr/local/vgpu/libvgpu.so",
)


def gather_evidence(root: str, environ: Mapping[str, str], libcuda: ElfInfo | None) -> PodEvidence:
    existing = frozenset(p for p in FINGERPRINT_PATHS if os.path.exists(under_root(root, p)))
    preload = list(environ.get("LD_PRELOAD", "").replace(":", " ").split())
    try:
        with open(under_root(root, "/etc/ld.so.preload")) as file:
            preload += [w for line in file for w in line.split("#", 1)[0].split()]
    except OSError:
        pass
    return PodEvidence(existing, tuple(preload), dict(environ), libcuda)


def _env_matches(environ: Mapping[str, str], prefixes: tuple[str, ...]) -> list[str]:
    return sorted(f"env {k}" for k in environ if k.startswith(prefixes))


def detect_layers(evidence: PodEvidence) -> tuple[Layer, ...]:
    """Every layer with evidence, the one that owns libcuda.so.1 first."""
    layers = []
    libcuda = evidence.libcuda
    vcuda = [
        f"{p} exists"
        for p in ("/etc/vcuda", "/usr/local/nvidia/bin/gpu-client")
        if p in evidence.existing_paths
    ]
    if libcuda is not None:
        if libcuda.soname == "libcuda-control.so":
            vcuda.append(f"{os.path.basename(libcuda.path)} has SONAME libcuda-control.so")
        if "g_vcuda_config" in libcuda.defined:
            vcuda.append("libcuda.so.1 exports g_vcuda_config")
    if vcuda:
        fork = libcuda is not None and {"cuGetProcAddress_v2", *ENCODERS} <= libcuda.defined
        layers.append(Layer("vcuda-fork" if fork else "vcuda", tuple(vcuda)))

    hami = [f"preloads {p}" for p in evidence.preload if os.path.basename(p) == "libvgpu.so"]
    hami += [f"{p} exists" for p in ("/usr/local/vgpu",) if p in evidence.existing_paths]
    hami += _env_matches(evidence.environ, ("CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_SM_LIMIT"))
    if hami:
        layers.append(Layer("hami", tuple(hami)))

    if "LUPINE_SERVER" in evidence.environ:
        layers.append(Layer("lupine", ("env LUPINE_SERVER",), forwards_to_local_driver=False))
    cgpu = _env_matches(evidence.environ, ("ALIYUN_COM_GPU_MEM_",))
    if cgpu:
        layers.append(Layer("cgpu", tuple(cgpu)))
    mps = _env_matches(evidence.environ, ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"))
    if mps:
        layers.append(Layer("mps", tuple(mps)))
    return tuple(layers)
