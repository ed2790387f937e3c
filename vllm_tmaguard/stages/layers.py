"""Sharing-layer fingerprints (docs/design.md §2.9, §2.10): cheap, passive evidence only. Never calls into the
layer (its cuInit/nvmlInit may fork a helper or exit; some override dlsym) and never connects to its
daemon: reads files (ELF tables of the library answering libcuda.so.1 and of each preloaded library, a stat
of a layer's socket), the environment. A layer is named only on evidence from the library that answers
libcuda.so.1 (its SONAME, its exports) or from what the loader preloads; files and variables alone are not
enough (a bare driver in an image that once had /etc/vcuda is no vCUDA pod), with one exception: KubeShare's
hook, mounted at its fixed path with the pod manager's variable, in a debug copy of a pod whose preload was
taken out (the preload kills every process on glibc >= 2.34, the doctor's included); and the variables the
container runtime or the loader acts on (KAI's fraction, NVIDIA's memory limit, LD_AUDIT: docs/design.md
§2.10). A libcuda.so.1 that lacks what every real driver of its era exports, with no layer named, is an
unrecognized layer.

Each layer carries its commit family where its exports tell it (the metering table, metering.py, is per
family) and the conditions found beside it (codes: a daemon's socket missing, a hook this glibc cannot
load, a preloaded layer whose limits are not in force).

A preloaded layer is in force only where the loader maps one of its entries (preloads.py says why one is
not); each layer carries its library file's identity (facts.py reads it). Long because every layer's
fingerprint reads the same evidence and stays beside the others: one place says what names a layer."""

import os
import re
from collections.abc import Mapping

from .. import files
from ..loaded import mapped_named, read_loaded_objects
from . import door, preloads
from .catalogue import ENCODERS, OVERLAY_TRIGGERS, PROC_ADDRESS_V2
from .elf import ElfError, ElfInfo, read_elf
from .loader import under_root
from .values import value_type

# Layer names, with what an operator reads in the log line.
LABELS = {
    "vcuda": "tkestack vCUDA",
    "vcuda-fork": "a vCUDA fork (CUDA 12)",
    "hami": "HAMi-core",
    "vgpu-manager": "vgpu-manager",
    "nvshare": "nvshare",
    "lupine": "lupine (GPU over the network)",
    "kubeshare": "KubeShare/Gemini",
    "cgpu": "Alibaba cGPU",
    "mps": "NVIDIA MPS",
    "unrecognized": "an unrecognized GPU-sharing layer",
    "vcuda-bypassed": "tkestack vCUDA (bypassed)",
    "tensor-fusion": "TensorFusion (its soft limiter)",
    "kai-fraction": "a KAI Scheduler GPU fraction (memory not enforced)",
    "nvidia-memory-limit": "an NVIDIA GPU memory limit (the container toolkit's CDI hook)",
    "ld-audit": "an LD_AUDIT library (the loader's audit interface can rebind libcuda.so.1's symbols)",
}
# Layers that are the process's libcuda.so.1 (the others are preloaded in front of NVIDIA's, or beside it).
OWNS_LIBCUDA = frozenset({"vcuda", "vcuda-fork", "lupine"})
# vCUDA builds (tkestack's vcuda-controller and its forks): their cuGetProcAddress(_v2) asks the real driver,
# then swaps in the layer's hook by the requested base name, whatever ABI was asked (docs/design.md §2.4).
SWAPS_LOOKUPS = frozenset({"vcuda", "vcuda-fork"})

# Conditions found beside a layer (codes; layer_problems in metering.py says what each breaks).
SOCKET_MISSING = "scheduler-socket-missing"  # nvshare: its scheduler's socket is not in the pod
SOCKET_NOT_A_SOCKET = "scheduler-socket-not-a-socket"
GLIBC_TOO_NEW = "hook-needs-glibc-private"  # KubeShare: the hook needs __libc_dlopen_mode, this libc lacks it
OVERSOLD = "oversold-managed-memory"  # vgpu-manager oversold: past the real memory, managed memory

VCUDA_CONTROL_SONAME = "libcuda-control.so"
VCUDA_MARKER = "g_vcuda_config"
# The CUDA 12 fork's own helpers (coldzerofear/vcuda-controller ec4dee1), which tkestack's build lacks.
VCUDA_FORK_HELPERS = ("search_on_pids_table", "load_pids_table", "atomic_action", "get_used_gpu_memory")
LUPINE_MARKER = "lupine_checkpoint_"
NVSHARE_SOCKET = "/var/run/nvshare/scheduler.sock"
KUBESHARE_HOOK = "/kubeshare/library/libgemhook.so.1"
GLIBC_PRIVATE = ("__libc_dlopen_mode", "__libc_dlsym")  # gone from libc.so.6 since glibc 2.34
# The names read from the library answering libcuda.so.1 (facts.py) and from each preloaded library.
# tkestack's master exports its hook table (cuda_hooks_entry); v1.0.5 has none, and exports its limiter's
# `delta`, which master made static.
VCUDA_MASTER_MARKER, VCUDA_V105_MARKER = "cuda_hooks_entry", "delta"
LIBCUDA_PREFIXES = (
    b"cu", b"g_vcuda", b"dlsym", b"lupine_", b"delta", *(h.encode() for h in VCUDA_FORK_HELPERS),
)  # fmt: skip
PRELOAD_PREFIXES = (b"cu", b"dlsym", b"nvshare_", b"ensure_post_init", b"rm_quitted_process", b"__libc_dl")

# Preloaded libraries by file name.
_PRELOADS = {
    "libvgpu.so": "hami",
    "libvgpu-control.so": "vgpu-manager",
    "libnvshare.so": "nvshare",
    "libgemhook.so.1": "kubeshare",
    "libcuda_limiter.so": "tensor-fusion",  # NexusGPU/tensor-fusion 3e0a490 pkg/constants/env.go
}
# The preloaded layers whose entries are judged in force or not (preloads.py; KubeShare's hook kills every
# process on glibc >= 2.34 whatever its entries: GLIBC_TOO_NEW).
JUDGED = frozenset({"hami", "vgpu-manager", "nvshare"})
HAMI_LIBRARY = preloads.HAMI_LIBRARY


@value_type
class Layer:
    name: str  # a key of LABELS
    evidence: tuple[str, ...]
    forwards_to_local_driver: bool = True  # False: no local real driver to forward to (network GPU)
    family: str | None = None  # the commit family its exports tell (metering.py's tables); None: not told
    conditions: tuple[str, ...] = ()  # codes of what was found wrong beside it (the constants above)
    preload_faults: tuple[preloads.PreloadFault, ...] = ()  # why its preload entries are not in force
    library: preloads.Library | None = None  # its library file's identity (facts.identify)

    @property
    def label(self) -> str:
        return LABELS[self.name]


@value_type
class PodEvidence:
    """Everything the fingerprints look at, gathered once (side effects stay in the probe)."""

    existing_paths: frozenset[str]  # which of FINGERPRINT_PATHS exist (paths as inside the pod)
    preload: tuple[str, ...]  # LD_PRELOAD entries and /etc/ld.so.preload lines
    environ: Mapping[str, str]
    libcuda: ElfInfo | None  # the library answering libcuda.so.1 (behind the overlay: the layer's file)
    preloaded: Mapping[str, ElfInfo] = {}  # readable preloaded libraries (and KubeShare's hook), by entry
    kinds: Mapping[str, str] = {}  # the file type of each of SOCKET_PATHS ("missing" where absent)
    libc_lacks: tuple[str, ...] = ()  # which of GLIBC_PRIVATE this process's libc.so.6 lacks (if asked)
    preload_faults: Mapping[str, preloads.PreloadFault] = {}  # judged layers' entries not in force, by entry


FINGERPRINT_PATHS = (
    "/etc/vcuda", "/usr/local/nvidia/bin/gpu-client", "/usr/local/vgpu", KUBESHARE_HOOK, HAMI_LIBRARY,
)  # fmt: skip
SOCKET_PATHS = (NVSHARE_SOCKET,)
_PRELOAD_FILE = preloads.PRELOAD_FILE
_PRELOAD_LIMIT = 1 << 20
# The environment variables the fingerprints look at, by prefix (LD_PRELOAD besides).
ENV_PREFIXES = (
    "CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_SM_LIMIT", "LUPINE_SERVER", "ALIYUN_COM_GPU_MEM_",
    "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_MEM_LIMIT_", "CUDA_CORE_LIMIT_",
    "MANAGER_VISIBLE_DEVICES", "POD_MANAGER_PORT", "CUDA_MEM_OVERSOLD", "CUDA_MEM_RATIO",
    "CUDA_DEVICE_MEMORY_SHARED_CACHE", "CONTAINER_VGPU_MOUNT", "GPU_PORTION", "RUNAI_NUM_OF_GPUS",
    "NVIDIA_GPU_MEMORY_", "TF_ISOLATION_MODE", "LD_AUDIT", preloads.HAMI_SWITCH,
)  # fmt: skip


def _elf(path: str, prefixes: tuple[bytes, ...]) -> ElfInfo | None:
    try:
        return read_elf(path, prefixes=prefixes)
    except ElfError:
        return None


def _kind(path: str) -> str:
    info = door.stat(path)
    return "missing" if info is None else files.kind_of(info.st_mode)


def _libc_lacks(needed: set[str]) -> tuple[str, ...]:
    """Which of `needed` the libc.so.6 this process runs on lacks (the pod's own glibc where the doctor runs
    in the pod's image)."""
    libc = next(iter(mapped_named("libc.so.6", read_loaded_objects())), None)
    info = _elf(libc, (b"__libc_dl",)) if libc else None
    return () if info is None else tuple(sorted(needed - info.defined))


def gather_evidence(root: str, environ: Mapping[str, str], libcuda: ElfInfo | None) -> PodEvidence:
    existing = frozenset(p for p in FINGERPRINT_PATHS if door.exists(under_root(root, p)))
    from_env = preloads.split_preload(environ.get("LD_PRELOAD", ""))
    text = door.read_text(under_root(root, _PRELOAD_FILE), _PRELOAD_LIMIT) or ""
    from_file = preloads.preload_file_entries(text)
    # Paths from the environment are taken as they are; the preload file's name files in the pod's root.
    paths = {entry: entry for entry in from_env}
    paths.update({entry: under_root(root, entry) for entry in from_file if entry not in paths})
    if KUBESHARE_HOOK in existing and "POD_MANAGER_PORT" in environ:
        paths.setdefault(KUBESHARE_HOOK, under_root(root, KUBESHARE_HOOK))
    absolute = {entry: path for entry, path in paths.items() if os.path.isabs(path)}
    read = {entry: preloads.read_preload(path, PRELOAD_PREFIXES) for entry, path in absolute.items()}
    preloaded = {entry: info for entry, info in read.items() if isinstance(info, ElfInfo)}
    stat_sockets = _preloads(from_env + from_file)
    kinds = {path: _kind(under_root(root, path)) for path in SOCKET_PATHS} if stat_sockets else {}
    needed = {name for info in preloaded.values() for name in GLIBC_PRIVATE if name in info.undefined}
    variables = {name: environ[name] for name in environ if name.startswith(ENV_PREFIXES)}
    judged = [e for e in dict.fromkeys(from_env + from_file) if preloaded_layer(e) in JUDGED]
    faults = preloads.faults_of(judged, from_env, paths, read, root in ("", "/"))
    return PodEvidence(
        existing, tuple(from_env + from_file), variables, libcuda, preloaded, kinds,
        _libc_lacks(needed) if needed else (), faults,
    )  # fmt: skip


def preloaded_layer(entry: str) -> str | None:
    """The layer a preload entry is, by its file name (a key of LABELS), or None."""
    return _PRELOADS.get(os.path.basename(entry))


def _preloads(entries: list[str]) -> bool:
    """A preloaded layer whose daemon's socket is worth a stat (nvshare)."""
    return any(_PRELOADS.get(os.path.basename(entry)) == "nvshare" for entry in entries)


def _env_matches(environ: Mapping[str, str], prefixes: tuple[str, ...]) -> list[str]:
    return sorted(f"env {k}" for k in environ if k.startswith(prefixes))


def is_vcuda_build(info: ElfInfo) -> bool:
    """The file is tkestack vCUDA's libcuda-control.so or a fork of it (its SONAME, or its config block)."""
    return info.soname == VCUDA_CONTROL_SONAME or VCUDA_MARKER in info.defined


def _vcuda(evidence: PodEvidence) -> Layer | None:
    libcuda = evidence.libcuda
    if libcuda is None or not is_vcuda_build(libcuda):
        return None
    own = []
    if libcuda.soname == VCUDA_CONTROL_SONAME:
        own.append(f"{os.path.basename(libcuda.path)} has SONAME {VCUDA_CONTROL_SONAME}")
    if VCUDA_MARKER in libcuda.defined:
        own.append(f"libcuda.so.1 exports {VCUDA_MARKER}")
    helpers = [h for h in VCUDA_FORK_HELPERS if h in libcuda.defined]
    files_seen = [f"{p} exists" for p in FINGERPRINT_PATHS[:2] if p in evidence.existing_paths]
    # The CUDA 12 forks export cuGetProcAddress_v2 and the tiled encoder (not necessarily every encoder:
    # coldzerofear's ec4dee1 was built from CUDA 12.2 headers, before cuTensorMapEncodeIm2colWide).
    fork = bool(helpers) or {PROC_ADDRESS_V2, ENCODERS[0]} <= libcuda.defined
    if not fork:
        return Layer("vcuda", (*own, *files_seen), family=_tkestack_family(libcuda))
    exports = [f"libcuda.so.1 exports {', '.join(helpers or [PROC_ADDRESS_V2, ENCODERS[0]])}"]
    return Layer("vcuda-fork", (*own, *exports, *files_seen), family="ec4dee1" if helpers else None)


def _tkestack_family(libcuda: ElfInfo) -> str | None:
    if VCUDA_MASTER_MARKER in libcuda.defined:
        return "master"
    return "v1.0.5" if VCUDA_V105_MARKER in libcuda.defined else None


def _preloaded_as(evidence: PodEvidence, name: str) -> list[tuple[str, ElfInfo | None]]:
    """The preload entries of layer `name` (by file name), each with its ELF where it could be read."""
    return [
        (entry, evidence.preloaded.get(entry))
        for entry in dict.fromkeys(evidence.preload)
        if _PRELOADS.get(os.path.basename(entry)) == name
    ]


def _hami_family(info: ElfInfo | None) -> str | None:
    """HAMi-core's commit family from its preloaded file's exports (hami-core-pins research): a Release build
    exports dlsym alone; 93cf05d (Volcano v1.10.0) still exports cuDeviceGetAttribute and lacks
    cuLaunchKernelEx; 8c32de6 (Volcano v1.12.0) hooks cuLaunchKernelEx; 8f3a89c added ensure_post_init."""
    if info is None:
        return None
    hooks = {name for name in info.defined if name.startswith("cu")}
    if "dlsym" in info.defined and not hooks:
        return "hidden-build"
    if "ensure_post_init" in info.defined:
        return "8f3a89c"
    if "cuLaunchKernelEx" in hooks and "cuMemRelease" in hooks:
        return "8c32de6"
    if "cuDeviceGetAttribute" in hooks or "rm_quitted_process" in info.defined:
        return "93cf05d"
    return None


def _hami(evidence: PodEvidence) -> Layer | None:
    entries = _preloaded_as(evidence, "hami")
    limits = _env_matches(evidence.environ, ("CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_SM_LIMIT"))
    files_seen = ["/usr/local/vgpu exists"] if "/usr/local/vgpu" in evidence.existing_paths else []
    # HAMi-core works only when preloaded; its limits beside its mounted library (or its device plugin's
    # switch) without the preload are a pod that HAMi prepared but whose preload did not take.
    if not entries:
        return _hami_not_preloaded(evidence, limits)
    family = next((f for _, info in entries if (f := _hami_family(info))), None)
    conditions, faults = preloads.in_force([e for e, _ in entries], evidence.preload_faults)
    said = (*(f"preloads {e}" for e, _ in entries), *limits, *files_seen)
    return Layer("hami", said, family=family, conditions=conditions, preload_faults=faults)


def _hami_not_preloaded(evidence: PodEvidence, limits: list[str]) -> Layer | None:
    mounted = HAMI_LIBRARY in evidence.existing_paths
    conditions = preloads.not_preloaded(bool(limits), mounted, evidence.environ)
    if not conditions:
        return None
    said = [*limits, *([f"{HAMI_LIBRARY} exists"] if mounted else []), "nothing preloads it"]
    said += [f"env {preloads.HAMI_SWITCH}=true"] if preloads.CONTROL_DISABLED in conditions else []
    return Layer("hami", tuple(said), conditions=conditions)


def _vgpu_manager(evidence: PodEvidence) -> Layer | None:
    entries = _preloaded_as(evidence, "vgpu-manager")
    if not entries:
        return None
    variables = _env_matches(
        evidence.environ, ("CUDA_MEM_LIMIT_", "CUDA_CORE_LIMIT_", "MANAGER_VISIBLE_DEVICES")
    )
    hooks = [f"{os.path.basename(e)} exports dlsym" for e, elf in entries if elf and "dlsym" in elf.defined]
    said = (*(f"preloads {e}" for e, _ in entries), *hooks[:1], *variables)
    conditions, faults = preloads.in_force([e for e, _ in entries], evidence.preload_faults)
    oversold = (OVERSOLD,) if _oversold(evidence.environ) and not conditions else ()
    return Layer("vgpu-manager", said, conditions=conditions + oversold, preload_faults=faults)


def _oversold(environ: Mapping[str, str]) -> bool:
    """vgpu-manager oversells memory with CUDA_MEM_OVERSOLD(_<i>) set, or a CUDA_MEM_RATIO above 1."""
    ratio = environ.get("CUDA_MEM_RATIO", "").strip()
    try:
        above = float(ratio) > 1 if ratio else False
    except ValueError:
        above = False
    oversold = [v for k, v in environ.items() if k.startswith("CUDA_MEM_OVERSOLD")]
    return above or any(v.strip().lower() in ("1", "true", "yes", "on") for v in oversold)


def _nvshare(evidence: PodEvidence) -> Layer | None:
    entries = _preloaded_as(evidence, "nvshare")
    if not entries:
        return None
    kind = evidence.kinds.get(NVSHARE_SOCKET, "missing")
    conditions = {"missing": (SOCKET_MISSING,), "a socket": ()}.get(kind, (SOCKET_NOT_A_SOCKET,))
    socket = f"{NVSHARE_SOCKET} is {kind}" if kind != "missing" else f"no {NVSHARE_SOCKET}"
    # not in force: its socket is never asked for
    not_in_force, faults = preloads.in_force([e for e, _ in entries], evidence.preload_faults)
    said = (*(f"preloads {e}" for e, _ in entries), socket)
    return Layer("nvshare", said, conditions=not_in_force or conditions, preload_faults=faults)


def _kubeshare(evidence: PodEvidence) -> Layer | None:
    entries = dict(_preloaded_as(evidence, "kubeshare"))
    needing = {
        entry: [name for name in GLIBC_PRIVATE if name in info.undefined]
        for entry, info in evidence.preloaded.items()
        if any(name in info.undefined for name in GLIBC_PRIVATE)
    }
    mounted = KUBESHARE_HOOK in evidence.existing_paths and "POD_MANAGER_PORT" in evidence.environ
    if not (entries or needing or mounted):
        return None
    said = [f"preloads {e}" for e in entries if e in evidence.preload]
    if mounted and KUBESHARE_HOOK not in entries:
        said.append(f"{KUBESHARE_HOOK} is mounted (KubeShare's hook)")
    said += [f"{os.path.basename(e)} needs {', '.join(names)}" for e, names in needing.items()]
    said += _env_matches(evidence.environ, ("POD_MANAGER_PORT",))
    dead = any(name in evidence.libc_lacks for names in needing.values() for name in names)
    return Layer("kubeshare", tuple(said), conditions=(GLIBC_TOO_NEW,) if dead else ())


def _lupine(evidence: PodEvidence) -> Layer | None:
    libcuda = evidence.libcuda
    exports = sorted(n for n in (libcuda.defined if libcuda else ()) if n.startswith(LUPINE_MARKER))
    variable = bool(evidence.environ.get("LUPINE_SERVER", "").strip())  # empty: lupine has no server
    if not (exports or variable):
        return None
    said = [f"libcuda.so.1 exports {exports[0]}"] if exports else []
    # The client researched (lupinemachines/lupine 7fbd364) is the one exporting its checkpoint calls.
    family = "7fbd364" if exports else None
    said += ["env LUPINE_SERVER"] if variable else []
    return Layer("lupine", tuple(said), forwards_to_local_driver=False, family=family)


def detect_layers(evidence: PodEvidence, cuda_driver_version: int | None = None) -> tuple[Layer, ...]:
    """Every layer with enough evidence, the one that owns libcuda.so.1 first. `cuda_driver_version`: what
    the running kernel module supports; a libcuda.so.1 lacking CUDA 12's entry points under a module older
    than CUDA 12 is that old driver, not a layer."""
    found = (_vcuda, _lupine, _hami_injected, _vgpu_manager, _nvshare, _kubeshare, _tensor_fusion)
    layers = [layer for layer in (probe(evidence) for probe in found) if layer is not None]
    if cgpu := _env_matches(evidence.environ, ("ALIYUN_COM_GPU_MEM_",)):
        layers.append(Layer("cgpu", tuple(cgpu)))
    if mps := _env_matches(
        evidence.environ, ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
    ):
        layers.append(Layer("mps", tuple(mps)))
    layers += [layer for layer in (probe(evidence) for probe in BY_VARIABLES) if layer is not None]
    libcuda = evidence.libcuda
    owns_libcuda = any(layer.name in OWNS_LIBCUDA for layer in layers)
    old_driver = cuda_driver_version is not None and cuda_driver_version < 12000
    if libcuda is not None and not owns_libcuda and not old_driver:
        lacking = [name for name in OVERLAY_TRIGGERS if name not in libcuda.defined]
        if lacking or libcuda.soname not in (None, "libcuda.so.1"):
            why = f"lacks {', '.join(lacking)}" if lacking else f"has SONAME {libcuda.soname}"
            layers.insert(0, Layer("unrecognized", (f"{os.path.basename(libcuda.path)} {why}",)))
    return tuple(layers)


# The layers of 2026 (docs/design.md §2.10, docs/research/sharing_layers_2026.md).
# Who put HAMi-core's preload there, from the variables each injector sets beside it.
HAMI_INJECTORS = {
    "kai-resource-isolator": "KAI Scheduler's resource isolator (its webhook)",
    "hami-dra": "HAMi's DRA driver (CDI)",
    "hami-device-plugin": "HAMi's device plugin",
}
_DRA_CACHE_DIR = "/vgpu/claims/"  # the DRA driver's shared cache: /usr/local/vgpu/claims/<claim>/<uuid>.cache
# The toolkit's apply-cuda-memory-limits hook applies nothing unless it finds a request and a limit.
NVIDIA_MEMORY_REQUEST = ("NVIDIA_GPU_MEMORY_REQUEST", "NVIDIA_GPU_MEMORY_REQUESTS")
NVIDIA_MEMORY_LIMIT = ("NVIDIA_GPU_MEMORY_LIMIT", "NVIDIA_GPU_MEMORY_LIMITS")
KAI_FRACTION_VARIABLES = ("GPU_PORTION", "RUNAI_NUM_OF_GPUS")  # KAI sets both on a fraction's container
def hami_injector(environ: Mapping[str, str]) -> str | None:
    """Which system injected HAMi-core (a key of HAMI_INJECTORS); None where its variables do not tell."""
    if environ.get("CONTAINER_VGPU_MOUNT", "").strip():
        return "kai-resource-isolator"
    cache = environ.get("CUDA_DEVICE_MEMORY_SHARED_CACHE", "").strip()
    if _DRA_CACHE_DIR in cache or any(re.fullmatch(r"CUDA_DEVICE_SM_LIMIT_\d+", name) for name in environ):
        return "hami-dra"  # one SM limit per device, where HAMi's device plugin sets one for all
    return "hami-device-plugin" if cache else None


def _hami_injected(evidence: PodEvidence) -> Layer | None:
    layer = _hami(evidence)
    if layer is None or (injector := hami_injector(evidence.environ)) is None:
        return layer
    return layer._replace(evidence=(*layer.evidence, f"injected by {HAMI_INJECTORS[injector]}"))


def _tensor_fusion(evidence: PodEvidence) -> Layer | None:
    """TensorFusion's soft limiter, preloaded: the real libcuda.so.1 stays, patched in memory."""
    entries = _preloaded_as(evidence, "tensor-fusion")
    said = [f"preloads {e}" for e, _ in entries] + _env_matches(evidence.environ, ("TF_ISOLATION_MODE",))
    return Layer("tensor-fusion", tuple(said)) if entries else None


def _set(environ: Mapping[str, str], names: tuple[str, ...]) -> list[str]:
    return [f"env {name}" for name in names if environ.get(name, "").strip()]


def _nvidia_memory_limit(evidence: PodEvidence) -> Layer | None:
    """Named by its variables, the only input of the toolkit's hook, which fails the container's start where
    it cannot apply them: in a running container, a limit the driver holds (or no hook was installed)."""
    environ = evidence.environ
    request, limit = _set(environ, NVIDIA_MEMORY_REQUEST), _set(environ, NVIDIA_MEMORY_LIMIT)
    return Layer("nvidia-memory-limit", (*request, *limit)) if request and limit else None


def _kai_fraction(evidence: PodEvidence) -> Layer | None:
    """KAI's non-enforced fraction: both its variables, and no limiter of its other modes beside them
    (HAMi-core preloaded by its isolator, the NVIDIA memory limit NvFractions injects)."""
    said = _set(evidence.environ, KAI_FRACTION_VARIABLES)
    limited = _preloaded_as(evidence, "hami") or _nvidia_memory_limit(evidence)
    complete = len(said) == len(KAI_FRACTION_VARIABLES)
    return Layer("kai-fraction", tuple(said)) if complete and not limited else None


def _ld_audit(evidence: PodEvidence) -> Layer | None:
    """What the loader loads through its audit interface: it sees every binding and library search,
    libcuda.so.1's too (HAMi interposes this way on AMD GPUs)."""
    entries = [e.strip() for e in evidence.environ.get("LD_AUDIT", "").split(":") if e.strip()]
    return Layer("ld-audit", tuple(f"LD_AUDIT loads {e}" for e in entries)) if entries else None


# Named from variables the loader or the container runtime acts on, after the layers named by their files.
BY_VARIABLES = (_kai_fraction, _nvidia_memory_limit, _ld_audit)
