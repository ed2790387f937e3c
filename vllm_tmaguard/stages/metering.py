"""What each sharing layer meters among the driver entry points vLLM's processes use, per layer and commit
family, as read from the layer's source at the commit named (docs/real-layers.md); the caveats known of it;
and the problems the conditions found beside a layer are (layers.py). Values only between modules: statuses
and caveats are codes, entry points are symbols; the sentences people read are rendered at the edges (the
log line, the doctor's findings). A layer whose build the fingerprints cannot place has no table: the guard
claims nothing about it.

Rows are (status, entry points) as the entry points are reached: through the CUDA runtime's versioned
look-ups, dlsym, or the overlay in front of the layer (where the guard loads one)."""

import os
from typing import Any

from ..codes import LAYER_CANNOT_LOAD, LAYER_DAEMON_MISSING, LAYER_NOT_IN_FORCE
from . import layers as fingerprints
from . import preloads
from .compat import BYPASSED
from .layers import Layer
from .outcomes import Problem
from .values import value_type

# Statuses: memory.
METERED = "metered"  # counted against the layer's memory quota
VIRTUALISED = "virtualised"  # the memory query answers the quota, not the GPU
MANAGED = "managed"  # turned into managed (oversubscribable) memory, capped per process only
UNMETERED = "unmetered"  # allocates outside the quota
# Statuses: launches.
THROTTLED = "throttled"  # paced by the layer's SM limiter (or its time-slicing lock)
THROTTLED_BUT_CLUSTERS = "throttled-but-clusters"  # the overlay's cuLaunchKernelEx: cluster launches are not
UNTHROTTLED = "unthrottled"  # launches the limiter never sees
LOCKED = "locked"  # nvshare: waits for the GPU lock its scheduler hands out (time slicing)
UNLOCKED = "unlocked"  # nvshare: runs without the lock

STATUSES = (
    METERED, VIRTUALISED, MANAGED, UNMETERED, THROTTLED, THROTTLED_BUT_CLUSTERS, UNTHROTTLED, LOCKED,
    UNLOCKED,
)  # fmt: skip

# Caveats, each with its severity (the doctor's; "warning": vLLM fails or is far slower unless fixed).
SM_LIMITER_OVERFLOW = "sm-limiter-overflow"
HAMI_CUDA_128_HANG = "hami-cuda-12.8-hang"
HAMI_FORK_AFTER_INIT = "hami-fork-after-cuinit"
HIDDEN_BUILD = "hidden-build-meters-nothing"
CORE_LIMITER_TIMING = "core-limiter-timing"
OVERSOLD_MANAGED = fingerprints.OVERSOLD  # a condition of the pod (layers.py), said as a caveat
NO_QUOTA = "no-memory-quota"
CUDA_GRAPH_CAPTURE_FAILS = "cuda-graph-capture-fails"
MANAGED_IPC = "managed-memory-ipc"
TILED_ONLY = "encoders-tiled-only"
ROUND_TRIPS = "round-trips"
HALF_CUBLAS_FAILS = "half-cublas-fails"
METERS_NOTHING_CUDA12 = "meters-nothing-cuda12"

SEVERITY = {
    SM_LIMITER_OVERFLOW: "warning", HAMI_CUDA_128_HANG: "warning", HAMI_FORK_AFTER_INIT: "info",
    HIDDEN_BUILD: "warning", CORE_LIMITER_TIMING: "info", OVERSOLD_MANAGED: "info", NO_QUOTA: "info",
    CUDA_GRAPH_CAPTURE_FAILS: "warning", MANAGED_IPC: "info", TILED_ONLY: "info", ROUND_TRIPS: "info",
    HALF_CUBLAS_FAILS: "warning", METERS_NOTHING_CUDA12: "warning",
}  # fmt: skip
# What vLLM must be given where a caveat is in force (its own flags; no environment variable of vLLM turns
# CUDA-graph capture off: nvshare research, vllm/envs.py 0.25.1 and 0.32.0). The first keeps torch.compile.
VLLM_ARGS = {
    CUDA_GRAPH_CAPTURE_FAILS: ("--compilation-config", '{"cudagraph_mode": "NONE"}'),
    MANAGED_IPC: ("--disable-custom-all-reduce",),
    OVERSOLD_MANAGED: ("--disable-custom-all-reduce",),
    # fp32 GEMMs take no private-table path (H100, lupine); vLLM refuses fp32 for GPTQ/AWQ models (measured)
    HALF_CUBLAS_FAILS: ("--dtype", "float32"),
}
ALTERNATIVE_ARGS = {CUDA_GRAPH_CAPTURE_FAILS: ("--enforce-eager",)}


@value_type
class Metering:
    source: str  # the repository and commit the table was read from
    rows: tuple[tuple[str, tuple[str, ...]], ...]  # (status, entry points)
    caveats: tuple[str, ...] = ()


_VCUDA_MEMORY = (
    (METERED, ("cuMemAlloc_v2", "cuMemAllocPitch_v2", "cuMemAllocManaged", "cuArrayCreate_v2",
               "cuArray3DCreate_v2", "cuMipmappedArrayCreate")),
    (VIRTUALISED, ("cuMemGetInfo_v2", "cuDeviceTotalMem_v2")),
)  # fmt: skip
_TKESTACK = (
    *_VCUDA_MEMORY,
    (UNMETERED, ("cuMemCreate", "cuMemAllocAsync", "cuMemAllocFromPoolAsync")),
    (THROTTLED, ("cuLaunchKernel", "cuLaunchKernel_ptsz", "cuLaunchCooperativeKernel")),
    (THROTTLED_BUT_CLUSTERS, ("cuLaunchKernelEx",)),
    (UNTHROTTLED, ("cuGraphLaunch",)),
)
_HAMI_MEMORY = (
    (METERED, ("cuMemAlloc_v2", "cuMemAllocPitch_v2", "cuMemAllocManaged", "cuArrayCreate_v2",
               "cuMemAllocAsync")),
    (VIRTUALISED, ("cuMemGetInfo_v2", "cuDeviceTotalMem_v2")),
)  # fmt: skip
_HAMI_FIXED = (
    (METERED, ("cuMemCreate",)),
    (UNMETERED, ("cuMemAllocFromPoolAsync",)),
    (THROTTLED, ("cuLaunchKernel", "cuLaunchCooperativeKernel", "cuLaunchKernelEx")),
    (UNTHROTTLED, ("cuGraphLaunch",)),
)
_HAMI_SOURCE = "Project-HAMi/HAMi-core"

TABLES: dict[tuple[str, str | None], Metering] = {
    ("vcuda", None): Metering("tkestack/vcuda-controller 72e0115 (master; v1.0.5 hooks the same)", _TKESTACK),
    ("vcuda", "master"): Metering("tkestack/vcuda-controller 72e0115 (master)", _TKESTACK),
    ("vcuda", "v1.0.5"): Metering("tkestack/vcuda-controller v1.0.5", _TKESTACK, (SM_LIMITER_OVERFLOW,)),
    ("vcuda-fork", "ec4dee1"): Metering(
        "coldzerofear/vcuda-controller ec4dee1",
        (
            *_VCUDA_MEMORY,
            (UNMETERED, ("cuMemCreate", "cuMemAllocAsync", "cuMemAllocFromPoolAsync", "cuMulticastCreate",
                         "cuGraphAddMemAllocNode")),
            (THROTTLED, ("cuLaunchKernel", "cuLaunchKernel_ptsz", "cuLaunchKernelEx", "cuLaunchKernelEx_ptsz",
                         "cuLaunchCooperativeKernel")),
            (UNTHROTTLED, ("cuGraphLaunch", "cuLaunchHostFunc")),
        ),
    ),
    ("hami", "93cf05d"): Metering(
        f"{_HAMI_SOURCE} 93cf05d (volcano-vgpu-device-plugin v1.10.0)",
        (
            *_HAMI_MEMORY,
            (UNMETERED, ("cuMemCreate", "cuMemAllocFromPoolAsync")),
            (THROTTLED, ("cuLaunchKernel", "cuLaunchCooperativeKernel")),
            (UNTHROTTLED, ("cuLaunchKernelEx", "cuGraphLaunch")),
        ),
        (HAMI_CUDA_128_HANG, HAMI_FORK_AFTER_INIT),
    ),
    ("hami", "8c32de6"): Metering(
        f"{_HAMI_SOURCE} 8c32de6 (volcano-vgpu-device-plugin v1.12.0)",
        (*_HAMI_MEMORY, *_HAMI_FIXED),
        (HAMI_FORK_AFTER_INIT,),
    ),
    ("hami", "8f3a89c"): Metering(f"{_HAMI_SOURCE} 8f3a89c", (*_HAMI_MEMORY, *_HAMI_FIXED)),
    ("hami", "hidden-build"): Metering(
        f"{_HAMI_SOURCE} built with -fvisibility=hidden (a Release build)",
        (
            (UNMETERED, ("cuMemAlloc_v2", "cuMemCreate", "cuMemAllocAsync")),
            (UNTHROTTLED, ("cuLaunchKernel", "cuLaunchKernelEx", "cuGraphLaunch")),
        ),
        (HIDDEN_BUILD,),
    ),
    ("vgpu-manager", None): Metering(
        "coldzerofear/vgpu-manager 3d7f66d",
        (
            (METERED, ("cuMemAlloc_v2", "cuMemAllocPitch_v2", "cuMemAllocManaged", "cuMemAllocAsync",
                       "cuMemAllocFromPoolAsync", "cuMemCreate", "cuArrayCreate_v2", "cuArray3DCreate_v2",
                       "cuMipmappedArrayCreate")),
            (VIRTUALISED, ("cuMemGetInfo_v2", "cuDeviceTotalMem_v2", "nvmlDeviceGetMemoryInfo")),
            (UNMETERED, ("cuMemPoolCreate", "cuMulticastCreate", "cuMemAllocHost_v2")),
            (THROTTLED, ("cuLaunchKernel", "cuLaunchKernel_ptsz", "cuLaunchKernelEx",
                         "cuLaunchCooperativeKernel", "cuGraphLaunch")),
        ),
        (CORE_LIMITER_TIMING,),
    ),
    ("nvshare", None): Metering(
        "grgalex/nvshare 1a8f211",
        (
            (MANAGED, ("cuMemAlloc_v2",)),
            (VIRTUALISED, ("cuMemGetInfo_v2",)),
            (UNMETERED, ("cuMemAllocAsync", "cuMemAllocFromPoolAsync", "cuMemCreate", "cuMemAllocPitch_v2")),
            (LOCKED, ("cuLaunchKernel",)),
            (UNLOCKED, ("cuLaunchKernelEx", "cuLaunchKernel_ptsz", "cuLaunchCooperativeKernel",
                        "cuGraphLaunch")),
        ),
        (NO_QUOTA, CUDA_GRAPH_CAPTURE_FAILS, MANAGED_IPC),
    ),
    ("lupine", None): Metering("lupinemachines/lupine", (), (NO_QUOTA,)),
    ("lupine", "7fbd364"): Metering(
        "lupinemachines/lupine 7fbd364", (), (NO_QUOTA, TILED_ONLY, ROUND_TRIPS, HALF_CUBLAS_FAILS)
    ),
    ("kubeshare", None): Metering(
        "NTHU-LSALAB/KubeShare a862311 (Gemini 953052b)",
        (
            (UNMETERED, ("cuMemAlloc_v2", "cuMemCreate", "cuMemAllocAsync")),
            (UNTHROTTLED, ("cuLaunchKernel", "cuLaunchKernelEx", "cuGraphLaunch")),
        ),
        (METERS_NOTHING_CUDA12,),
    ),
    # Nothing interposes: KAI sets the fraction's variables and schedules; no entry point is metered.
    ("kai-fraction", None): Metering(
        "kai-scheduler/KAI-Scheduler d5bc503 (non-enforced fractions)", (), (NO_QUOTA,)
    ),
}


# Layers that share a GPU and limit no device memory (each process sees the whole GPU: vLLM's
# --gpu-memory-utilization takes its share of all of it), and layers that limit it (a quota their hooks
# meter, or the driver's own limit). The memory-limit warning reads memory_unlimited.
ENFORCES_NO_MEMORY_LIMIT = frozenset({"kai-fraction", "nvshare", "mps"})
LIMITS_MEMORY = frozenset(
    {"vcuda", "vcuda-fork", "hami", "vgpu-manager", "cgpu", "tensor-fusion", "nvidia-memory-limit"}
)


def memory_unlimited(layers: tuple[Layer, ...]) -> tuple[Layer, ...]:
    """The layers sharing the GPU while nothing limits its memory (of ENFORCES_NO_MEMORY_LIMIT, with none of
    LIMITS_MEMORY beside them); () where memory is limited or the GPU is not shared."""
    if any(layer.name in LIMITS_MEMORY for layer in layers):
        return ()
    return tuple(layer for layer in layers if layer.name in ENFORCES_NO_MEMORY_LIMIT)


def metering_of(layer: Layer) -> Metering | None:
    """The table of the layer's commit family; None where its build cannot be placed (HAMi-core's family is
    read from its preloaded file, and a build matching none of the researched ones gets no claim)."""
    if layer.name == "hami" and layer.family is None:
        return None
    return TABLES.get((layer.name, layer.family)) or TABLES.get((layer.name, None))


def metering_json(layers: tuple[Layer, ...]) -> list[dict[str, Any]]:
    """The record's `metering` field: per layer with a table, its family, source, rows by status, and its
    caveats with their severity and the vLLM flags each needs."""
    found = []
    for layer in layers:
        table = metering_of(layer)
        off = BYPASSED in layer.conditions or set(layer.conditions) & NOT_IN_FORCE_CONDITIONS
        if table is not None and not off:  # a layer bypassed here, or not loaded at all, meters nothing
            caveats = (*table.caveats, *(c for c in layer.conditions if c in SEVERITY))
            found.append(
                {
                    "layer": layer.name,
                    "family": layer.family,
                    "source": table.source,
                    "rows": {status: list(names) for status, names in table.rows},
                    "caveats": [
                        {
                            "code": code,
                            "severity": SEVERITY[code],
                            "vllm_args": list(VLLM_ARGS.get(code, ())),
                            "or_vllm_args": list(ALTERNATIVE_ARGS.get(code, ())),
                        }
                        for code in caveats
                    ],
                }
            )
    return found


def layer_problems(layers: tuple[Layer, ...]) -> tuple[Problem, ...]:
    """What the conditions found beside each layer break (layers.py), with the fix; the other conditions are
    caveats (metering_json)."""
    found = {fingerprints.GLIBC_TOO_NEW: _hook_cannot_load(), **_socket_problems()}
    problems = []
    for layer in layers:
        for condition in layer.conditions:
            if condition in found:
                problems.append(found[condition])
            elif condition in NOT_IN_FORCE_CONDITIONS:
                problems.append(_not_loaded(layer, condition))
    return tuple(problems)


# Conditions under which a layer is not loaded at all (preloads.py): it meters and limits nothing.
NOT_IN_FORCE_CONDITIONS = frozenset(
    {preloads.NOT_IN_FORCE, preloads.NOT_PRELOADED, preloads.PRELOAD_NEEDS_GLIBC}
)
_LIMITS = {"hami": "HAMi-core's limits are", "vgpu-manager": "vgpu-manager's limits are",
           "nvshare": "nvshare's GPU lock (its time slicing) is"}  # fmt: skip
_UNMETERED = (
    "every CUDA call of every process goes to NVIDIA's driver unmetered: no memory quota, no compute limit; "
    "vLLM sizes its KV cache from the whole GPU, which the scheduler promised in part to other pods"
)
_FAULT_WORDS = {
    preloads.MISSING: "is not there",
    preloads.UNREADABLE: "cannot be read ({found})",
    preloads.NOT_A_FILE: "{found}",
    preloads.NOT_AN_ELF: "is not a shared library ({found})",
    preloads.WRONG_CLASS: "is an {found} build, this process 64-bit",
    preloads.WRONG_MACHINE: "is {found}",
    preloads.NOT_LOADED: "is {found}",
}


def _fault_words(fault: preloads.PreloadFault) -> str:
    return f"{fault.entry} (from {fault.source}) " + _FAULT_WORDS[fault.kind].format(found=fault.found)


def _not_loaded(layer: Layer, condition: str) -> Problem:
    limits = _LIMITS.get(layer.name, f"{layer.label}'s limits are")
    faults = layer.preload_faults
    if condition == preloads.PRELOAD_NEEDS_GLIBC:
        fault = next(f for f in faults if f.kind == preloads.NEEDS_NEWER_GLIBC)
        return Problem(
            LAYER_CANNOT_LOAD,
            cause=f"{fault.entry} (from {fault.source}) needs {fault.found}",
            consequence="the loader stops every process of the container at start-up (`version "
            f"`{fault.needs}' not found (required by {fault.entry})`), before vLLM or the guard runs",
            fix=f"mount a build of {layer.label}'s library linked against this image's glibc or an older one "
            "(build it in the oldest image the node runs), or use an image with a newer glibc",
            subject=fault.entry,
        )
    if condition == preloads.NOT_PRELOADED:
        switched = preloads.CONTROL_DISABLED in layer.conditions
        hami, switch = preloads.HAMI_LIBRARY, preloads.HAMI_SWITCH
        why = f" ({switch}=true: HAMi's device plugin then leaves /etc/ld.so.preload out)" if switched else ""
        return Problem(
            LAYER_NOT_IN_FORCE,
            cause=f"{limits} NOT in force: nothing preloads {hami}{why}",
            consequence=_UNMETERED,
            fix=f"unset {switch} in the pod spec (HAMi's device plugin then mounts /etc/ld.so.preload naming "
            f"{hami}), or request a whole GPU for a pod meant to run without limits"
            if switched
            else f"preload it: /etc/ld.so.preload naming {hami} (HAMi's device plugin mounts one) or "
            f"LD_PRELOAD={hami}",
            subject=switch if switched else hami,
        )
    first = faults[0]
    loader = preloads.LOADER_SAYS.get(first.kind)
    said = (
        f"the loader skips it (`ERROR: ld.so: object '{first.entry}' from {first.source} cannot be preloaded "
        f"({loader}): ignored.`), and "
        if loader
        else "this process's loader did not map it (LD_PRELOAD set after the process started?), and "
    )
    return Problem(
        LAYER_NOT_IN_FORCE,
        cause=f"{limits} NOT in force: " + "; ".join(_fault_words(f) for f in faults),
        consequence=said + _UNMETERED,
        fix=_preload_fix(layer, first),
        subject=first.entry,
    )


def _preload_fix(layer: Layer, fault: preloads.PreloadFault) -> str:
    library, entry = f"{layer.label}'s library", fault.entry
    if fault.kind == preloads.MISSING:
        return f"mount {library} at {entry} (its device plugin mounts it from the node); restart the pod"
    if fault.kind == preloads.NOT_A_FILE:
        return (
            f"mount {library} at {fault.entry} and restart the pod (a directory there is what the container "
            "runtime makes where the node lacks the file the mount names: put the library on the node)"
        )
    if fault.kind == preloads.UNREADABLE:
        return f"make {fault.entry} readable by the container's user (its copy on the node: chmod a+r)"
    if fault.kind == preloads.NOT_AN_ELF:
        return f"replace {fault.entry} with {library} (what is there is not a shared library)"
    if fault.kind in (preloads.WRONG_CLASS, preloads.WRONG_MACHINE):
        machine = os.uname().machine
        return f"mount the build of {library} for this machine ({machine}, 64-bit) at {fault.entry}"
    return f"preload {fault.entry} from the process's start (the container's LD_PRELOAD, /etc/ld.so.preload)"


def _hook_cannot_load() -> Problem:
    hook, symbol = fingerprints.KUBESHARE_HOOK, fingerprints.GLIBC_PRIVATE[0]
    return Problem(
        LAYER_CANNOT_LOAD,
        cause=f"KubeShare's hook {hook} needs {symbol}, gone in glibc 2.34+",
        consequence="with the hook preloaded every process of the container exits 127 at start-up (`symbol "
        f"lookup error: ... undefined symbol: {symbol}`), before vLLM or the guard runs",
        fix="rebuild Gemini's hook without glibc-private symbols, or use an image with glibc < 2.34, or "
        "request a whole GPU (no preload)",
        subject=hook,
    )


def _socket_problems() -> dict[str, Problem]:
    socket = fingerprints.NVSHARE_SOCKET
    said = {
        fingerprints.SOCKET_MISSING: f"no nvshare scheduler socket at {socket}",
        fingerprints.SOCKET_NOT_A_SOCKET: f"not a socket: {socket}",
    }
    return {
        condition: Problem(
            LAYER_DAEMON_MISSING,
            cause=cause,
            consequence="the first CUDA call of every process prints `[NVSHARE][FATAL]` and exits; under "
            "torch and vLLM the process hangs instead",
            fix="start nvshare-scheduler on the node and mount /var/run/nvshare into the pod",
            subject=socket,
        )
        for condition, cause in said.items()
    }
