"""GPU memory: what the sharing layer gives a process, and the share of it vLLM will take (docs/design.md
§2.13). vLLM asks for `--gpu-memory-utilization` of the device's total (0.92 by default) and needs room past
that for what it does not count: its CUDA context, which an enforcing layer counts inside its limit, and the
non-PyTorch memory of cuBLAS and CUDA graphs. On an 80 GiB GPU the default leaves 6.4 GiB; under an 8 GiB
limit it leaves 0.64 GiB and the EngineCore dies of `torch.OutOfMemoryError` while capturing its graphs
(measured under three real layers, docs/real-layers.md). What vLLM needs is an absolute headroom, not a ratio.

Reading the limit is a side effect (a file read through the door: vCUDA's vcuda.config); everything else is a
pure function of the values read."""

import math
import os
import re
import struct
from collections.abc import Mapping

from .. import files
from ..codes import MEMORY_FRACTION_TOO_HIGH, MEMORY_UNENFORCED
from . import door
from .loader import under_root
from .outcomes import Problem
from .values import value_type

GIB = 1 << 30
# Measured on an H100 (driver 580, torch 2.11, vLLM 0.25.1) under vgpu-manager, the CUDA-12 vCUDA fork and
# HAMi-core with an 8 GiB limit: 0.85 starts (1.2 GiB left), 0.88 dies in graph capture (0.96 GiB left);
# each layer counts the CUDA context (520-612 MiB) inside its limit (docs/real-layers.md, "Memory").
HEADROOM = 1.25 * GIB
VLLM_DEFAULT_FRACTION = "0.92"  # CacheConfig.gpu_memory_utilization in vLLM 0.25.1 to 0.33 (0.9 before)
FRACTION_FLAG = "--gpu-memory-utilization"
KV_CACHE_FLAG = "--kv-cache-memory-bytes"
# The flags that size vLLM's memory, as written on the command line (or its --config file).
FLAGS = (FRACTION_FLAG, KV_CACHE_FLAG)

VCUDA_CONFIG = "/etc/vcuda/vcuda.config"
# tkestack vcuda-controller's resource_data_t (include/hijack.h, master 72e0115, v1.0.5 and the CUDA-12 fork
# ec4dee1 alike): packed; pod_uid[48], limit, occupied[4044], container_name[4096], bus_id[16], then
# uint64 gpu_memory at 8208, utilization, hard_limit, driver_version (2 ints), int enable at 8232.
_VCUDA_MEMORY_AT, _VCUDA_ENABLE_AT, _VCUDA_SIZE = 8208, 8232, 8240

# Variables that carry a memory limit the layer enforces, by layer (value formats from each layer's source).
_HAMI = "CUDA_DEVICE_MEMORY_LIMIT"  # HAMi-core: bytes, or a number with k/m/g (get_limit_from_env)
_VGPU_MANAGER = "CUDA_MEM_LIMIT_"  # vgpu-manager: CUDA_MEM_LIMIT_<i>, e.g. 8192m
_MPS_PINNED = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"  # MPS: "0=8G,1=4G" or "8G" (every device)
# NVIDIA's container toolkit CDI hook: the driver enforces it (NVML SetMemoryLimits), docs/design.md §2.10
_NVIDIA_LIMITS = ("NVIDIA_GPU_MEMORY_LIMIT", "NVIDIA_GPU_MEMORY_LIMITS")
GIVEN_PORTION = "GPU_PORTION"  # KAI Scheduler's fraction of a GPU (not enforced)
ENV_NAMES = (_MPS_PINNED,)  # GPU_PORTION and NVIDIA_GPU_MEMORY_* are layers.ENV_PREFIXES


@value_type
class MemoryLimit:
    limit: int  # bytes the process may hold on its device, as the layer counts them
    source: str  # where the limit was read: the variable or file, with its value


@value_type
class MemoryFlags:
    """vLLM's memory settings as the process's command line gives them (process.py)."""

    fraction: str | None = None  # --gpu-memory-utilization's value as written
    kv_cache: str | None = None  # --kv-cache-memory-bytes's value as written
    serve: bool = False  # the process is a vLLM server's front (its command line is parsed by vLLM)


@value_type
class MemoryPlan:
    limit: MemoryLimit | None
    fits: str | None  # the largest --gpu-memory-utilization that starts under the limit (2 decimals)
    chosen: str  # the fraction vLLM will use: the user's, or its default
    by_user: bool
    set_to: str | None  # what the guard sets (vLLM's default left and above `fits`), or None
    problems: tuple[Problem, ...]

    def to_json(self) -> dict[str, object]:
        return {
            "limit_bytes": self.limit.limit if self.limit else None,
            "limit_source": self.limit.source if self.limit else None,
            "fits": self.fits,
            "fraction": self.chosen,
            "by_user": self.by_user,
            "set_to": self.set_to,
        }


_SIZE = re.compile(r"\s*(\d+)\s*([kKmMgG]?)[iI]?[bB]?\s*")
_SCALE = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_size(value: str) -> int | None:
    """Bytes from a limit as the layers write it (`8589934592`, `8192m`, `8g`, `8G`, `8Gi`); None where it is
    none of those, or zero (HAMi-core reads 0 as no limit)."""
    match = _SIZE.fullmatch(value)
    if match is None:
        return None
    size = int(match.group(1)) * _SCALE[match.group(2).lower()]
    return size or None


def _mps_limit(value: str) -> int | None:
    """CUDA_MPS_PINNED_DEVICE_MEM_LIMIT's limit for the process's first device (`0=8G,1=4G`, or one size)."""
    entries = [entry.strip() for entry in value.split(",") if entry.strip()]
    for entry in entries:
        device, sep, size = entry.partition("=")
        if not sep:
            return parse_size(device)
        if device.strip() == "0":
            return parse_size(size)
    return None


def env_limit(environ: Mapping[str, str]) -> MemoryLimit | None:
    """The smallest enforced limit the environment names for the process's devices (vLLM's workers each take
    one device; the smallest is the one that fails first)."""
    found: list[MemoryLimit] = []
    for name in sorted(environ):
        value = environ[name]
        size = None
        hami = name == _HAMI or (name.startswith(_HAMI + "_") and name[len(_HAMI) + 1 :].isdigit())
        if hami or (name.startswith(_VGPU_MANAGER) and name[len(_VGPU_MANAGER) :].isdigit()):
            size = parse_size(value)
        elif name == _MPS_PINNED:
            size = _mps_limit(value)
        elif name in _NVIDIA_LIMITS:
            size = parse_size(value)
        if size:
            found.append(MemoryLimit(size, f"{name}={value}"))
    return min(found, default=None)


def vcuda_limit(data: bytes) -> int | None:
    """The memory quota in a vCUDA resource_data_t (`vcuda.config`); None where the file is not one, or the
    quota is off (`enable` 0: gpu-manager's config for whole GPUs)."""
    if len(data) != _VCUDA_SIZE:
        return None
    (memory,) = struct.unpack_from("<Q", data, _VCUDA_MEMORY_AT)
    (enable,) = struct.unpack_from("<i", data, _VCUDA_ENABLE_AT)
    return memory if enable and memory else None


def vcuda_quota(root: str) -> int | None:
    """The quota of the pod's vCUDA config (None: no file, not a resource_data_t, or the quota off)."""
    path = under_root(root, VCUDA_CONFIG)
    # /etc/vcuda is a fingerprint path every full run looks at already: one input, not two, outside vCUDA
    if not door.exists(os.path.dirname(path)):
        return None
    try:  # a missing file is an error the door notes as the input, like any other
        data = files.read_bytes(path, _VCUDA_SIZE + 1)
    except OSError:
        return None
    return vcuda_limit(data)


def read_limit(environ: Mapping[str, str], root: str, layer_names: frozenset[str]) -> MemoryLimit | None:
    """The memory limit in force for this process's layers: vCUDA's quota from its config file, else the
    variables HAMi-core, vgpu-manager or MPS read. Only for a layer the fingerprints found: a variable of a
    layer that is not loaded limits nothing (layers.py names a configured layer that is not in force)."""
    if layer_names & {"vcuda", "vcuda-fork"}:
        quota = vcuda_quota(root)
        if quota:
            return MemoryLimit(quota, f"{VCUDA_CONFIG} ({quota} bytes)")
    if layer_names & {"hami", "vgpu-manager", "mps", "nvidia-memory-limit"}:
        return env_limit(environ)
    return None


def fitting_fraction(limit: int, headroom: float = HEADROOM) -> str | None:
    """The largest --gpu-memory-utilization (2 decimals, rounded down) that leaves `headroom` of `limit`;
    None where the limit is no larger than the headroom (nothing fits)."""
    room = (limit - headroom) / limit
    if room <= 0.01:
        return None
    return f"{math.floor(room * 100 + 1e-9) / 100:.2f}"


def _gib(size: float) -> str:
    return f"{size / GIB:.2f}".rstrip("0").rstrip(".") + " GiB"


def _above(value: str, bound: str) -> bool:
    try:
        return float(value) > float(bound)
    except ValueError:
        return False  # vLLM refuses what is not a number itself


def plan_memory(
    limit: MemoryLimit | None,
    flags: MemoryFlags,
    unenforced: tuple[str, ...],
    setting: str,
    portion: str | None = None,
) -> MemoryPlan:
    """What to say and do about vLLM's memory fraction. `unenforced`: the labels of layers found sharing the
    GPU without a memory limit; `portion`: the share of the GPU the pod was given, where it says; `setting`:
    TMAGUARD_MEMORY (fit: set the fraction where vLLM's default cannot start; warn: say so only; off:
    nothing). Order of the decisions: a --kv-cache-memory-bytes budget wins
    over any fraction (vLLM sizes the cache from it), so nothing is said; under an enforced limit a user's
    fraction above what fits is a warning with the value that fits, vLLM's default above it is set to it
    (fit) or warned about (warn); under sharing that enforces nothing, vLLM's default takes the whole GPU."""
    chosen = flags.fraction or VLLM_DEFAULT_FRACTION
    by_user = flags.fraction is not None
    fits = fitting_fraction(limit.limit) if limit else None
    # A process that is no server's front and was given no fraction gets its share from whoever builds its
    # engine (a Ray worker's from the EngineCore, over the wire): its own argv says nothing about it.
    if setting == "off" or flags.kv_cache is not None or not (flags.serve or by_user):
        return MemoryPlan(limit, fits, chosen, by_user, None, ())
    problems: list[Problem] = []
    set_to = None
    if limit is not None and (fits is None or _above(chosen, fits)):
        left = limit.limit * (1 - float(chosen)) if not _above(chosen, "1") else 0.0
        if by_user or setting == "warn" or fits is None:
            let_guard = "" if by_user else " (or let the guard set it: TMAGUARD_MEMORY=fit)"
            fix = (
                f"{FRACTION_FLAG} {fits}{let_guard}"
                if fits
                else f"a larger memory limit: vLLM needs about {_gib(HEADROOM)} past its own share"
            )
            problems.append(
                Problem(
                    MEMORY_FRACTION_TOO_HIGH,
                    cause=f"{FRACTION_FLAG} {chosen}{'' if by_user else ' (vLLM default)'} leaves "
                    f"{_gib(left)} of the layer's {_gib(limit.limit)} limit ({limit.source}); vLLM needs "
                    f"about {_gib(HEADROOM)} past its share (its CUDA context counts inside the limit)",
                    consequence="the EngineCore runs out of memory while capturing CUDA graphs "
                    "(torch.OutOfMemoryError) and vLLM does not start",
                    fix=fix,
                    subject=FRACTION_FLAG,
                )
            )
        else:
            set_to = fits
    elif limit is None and unenforced and not by_user:
        share = (
            f"below {portion} (the share this pod was given, {GIVEN_PORTION})"
            if portion
            else f"to this pod's share of the GPU, less {_gib(HEADROOM)} (e.g. 0.45 for half a GPU)"
        )
        problems.append(
            Problem(
                MEMORY_UNENFORCED,
                cause=f"{' and '.join(unenforced)} shares the GPU with no memory limit, and vLLM takes "
                f"{VLLM_DEFAULT_FRACTION} of the whole GPU by default",
                consequence="the pods sharing the GPU find it full (their allocations fail, or swap)",
                fix=f"{FRACTION_FLAG} set {share}",
                subject=FRACTION_FLAG,
            )
        )
    return MemoryPlan(limit, fits, set_to or chosen, by_user, set_to, tuple(problems))
