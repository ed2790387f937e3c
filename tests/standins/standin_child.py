"""What the stand-in tests share: the entry-point lists, and a runner for code in a fresh interpreter inside
a pod that reports back one JSON object (every check that loads a stand-in runs that way)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from collections.abc import Iterable, Mapping
from pathlib import Path

import podkit
import pytest
from podkit import guard_lines

# L: what vLLM 0.32.0's extensions and torch 2.13's libraries need from libcuda.so.1.
L = [
    "cuCtxGetCurrent",
    "cuCtxSetCurrent",
    "cuDeviceGetAttribute",
    "cuDevicePrimaryCtxRetain",
    "cuGetErrorString",
    "cuMemAddressFree",
    "cuMemAddressReserve",
    "cuMemCreate",
    "cuMemGetAllocationGranularity",
    "cuMemMap",
    "cuMemRelease",
    "cuMemSetAccess",
    "cuMemUnmap",
    "cuPointerGetAttribute",
    "cuDeviceGet",
    "cuDevicePrimaryCtxGetState",
    "cuFuncGetAttribute",
    "cuFuncSetAttribute",
    "cuFuncSetCacheConfig",
    "cuLaunchCooperativeKernel",
    "cuLaunchKernel",
    "cuLinkAddData_v2",
    "cuLinkComplete",
    "cuLinkCreate_v2",
    "cuModuleGetFunction",
    "cuModuleLoad",
    "cuModuleLoadData",
    "cuModuleLoadDataEx",
    "cuModuleUnload",
    "cuOccupancyMaxActiveBlocksPerMultiprocessor",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemcpyHtoD_v2",
    "cuMemcpyDtoH_v2",
    "cuCtxCreate_v2",
    "cuCtxSynchronize",
    "cuDeviceGetName",
    "cuDeviceTotalMem_v2",
    "cuDeviceComputeCapability",
    "cuGetErrorName",
    "cuMemGetInfo_v2",
]
BASIC = ["cuInit", "cuDriverGetVersion", "cuDeviceGetCount", "cuGetProcAddress"]
ENCODERS = [
    "cuTensorMapEncodeTiled",
    "cuTensorMapEncodeIm2col",
    "cuTensorMapEncodeIm2colWide",
    "cuTensorMapReplaceAddress",
]
NEW = [*ENCODERS, "cuGetProcAddress_v2", "cuLaunchKernelEx"]
# Older ABIs beside L, which a driver and a layer built against CUDA 11 headers export.
LEGACY = [
    "cuMemAlloc",
    "cuMemGetInfo",
    "cuDeviceTotalMem",
    "cuLaunchKernel_ptsz",
    "cuLaunchCooperativeKernel_ptsz",
    "cuMemcpyAsync",
    "cuMemcpyAsync_ptsz",
    "cuStreamWaitValue32",
    "cuGetExportTable",
]
# CUDA 12 entry points the runtime libraries use that such a layer lacks.
CUDA12 = ["cuLibraryLoadData", "cuLibraryGetKernel", "cuKernelGetFunction", "cuCtxCreate_v4"]
NVML_REQUIRED = [
    "nvmlInit",
    "nvmlInit_v2",
    "nvmlInitWithFlags",
    "nvmlShutdown",
    "nvmlErrorString",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetCount_v2",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetHandleByIndex_v2",
    "nvmlDeviceGetName",
    "nvmlDeviceGetCudaComputeCapability",
    "nvmlSystemGetDriverVersion",
    "nvmlSystemGetCudaDriverVersion",
    "nvmlSystemGetCudaDriverVersion_v2",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetVirtualizationMode",
    "nvmlDeviceGetIndex",
    "nvmlDeviceGetPciInfo_v3",
    "nvmlDeviceGetP2PStatus",
    "nvmlDeviceGetArchitecture",
    "nvmlDeviceGetBrand",
    "nvmlDeviceGetMinorNumber",
    "nvmlDeviceGetPersistenceMode",
    "nvmlDeviceGetTopologyCommonAncestor",
    "nvmlDeviceGetNvLinkState",
    "nvmlDeviceGetHandleByUUID",
    "nvmlDeviceGetNumaNodeId",
    "nvmlDeviceGetCpuAffinity",
]
GIB = 1 << 30
SITE = Path(sysconfig.get_paths()["purelib"])

# Shared by every child: ctypes helpers, and the guard's vllm import hook (if installed) disarmed.
PRELUDE = r"""
import ctypes, json, os, sys
from ctypes import POINTER, byref, c_char_p, c_int, c_longlong, c_uint, c_ulonglong, c_void_p
sys.meta_path[:] = [f for f in sys.meta_path
                    if not str(getattr(f, "__module__", "")).startswith("vllm_tmaguard")]
out = {}

def addr(fn):
    return ctypes.cast(fn, c_void_p).value

GPA = ctypes.CFUNCTYPE(c_int, c_char_p, POINTER(c_void_p), c_int, c_ulonglong)
GPA2 = ctypes.CFUNCTYPE(c_int, c_char_p, POINTER(c_void_p), c_int, c_ulonglong, POINTER(c_int))
TILED = ctypes.CFUNCTYPE(c_int, c_void_p, c_int, c_uint, c_void_p, POINTER(c_ulonglong),
                         c_void_p, c_void_p, c_void_p, c_int, c_int, c_int, c_int)
IM2COL = ctypes.CFUNCTYPE(c_int, c_void_p, c_int, c_uint, c_void_p, POINTER(c_ulonglong), c_void_p,
                          c_void_p, c_void_p, c_uint, c_uint, c_void_p, c_int, c_int, c_int, c_int)
IM2COL_WIDE = ctypes.CFUNCTYPE(c_int, c_void_p, c_int, c_uint, c_void_p, POINTER(c_ulonglong),
                               c_void_p, c_int, c_int, c_uint, c_uint, c_void_p, c_int, c_int,
                               c_int, c_int, c_int)
REPLACE = ctypes.CFUNCTYPE(c_int, c_void_p, c_void_p)

def gpa(lib, name, version=12000):
    p = c_void_p(0xDEAD)
    r = GPA(addr(lib.cuGetProcAddress))(name.encode(), byref(p), version, 0)
    return [r, p.value]

def gpa2(lib, name, version=12000):
    p, status = c_void_p(0xDEAD), c_int(-7)
    r = GPA2(addr(lib.cuGetProcAddress_v2))(name.encode(), byref(p), version, 0, byref(status))
    return [r, p.value, status.value]

def tiled(fn, dtype=7, rank=1, gaddr=0x1000, dim0=4096, null_map=False):
    desc = ctypes.create_string_buffer(b"\xAA" * 128, 128)
    dims = (c_ulonglong * 1)(dim0)
    r = TILED(fn)(None if null_map else desc, dtype, rank, gaddr, dims, None, None, None, 0, 0, 0, 0)
    return [r, desc.raw.hex()]

def counter(lib, helper, name):
    f = getattr(lib, helper)
    f.restype, f.argtypes = c_longlong, [c_char_p]
    return f(name.encode())

def has(lib, name):
    try:
        getattr(lib, name)
        return True
    except AttributeError:
        return False

def maps_count(fragment):
    with open("/proc/self/maps") as fh:
        return len({line.split()[-1] for line in fh if fragment in line})
"""


def child_env(
    pod: podkit.Pod | None,
    extra: Mapping[str, str] | None = None,
    drop: Iterable[str] = (),
) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("STANDIN_NVML_") and k not in ("LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONPATH")
    }
    if pod is not None:
        env.update(pod.env)
    env["TMAGUARD_MODE"] = "off"  # the guard must not touch what these tests examine
    env.update(extra or {})
    for key in drop:
        env.pop(key, None)
    return env


def run_child(
    pod: podkit.Pod | None,
    code: str,
    *,
    extra: Mapping[str, str] | None = None,
    drop: Iterable[str] = (),
    timeout: float = 120,
) -> dict:
    """Run PRELUDE + code in a fresh interpreter inside `pod`; return its `out` dict."""
    script = PRELUDE + textwrap.dedent(code) + '\nprint("@@OUT@@" + json.dumps(out))\n'
    proc = subprocess.run(
        [sys.executable, "-c", script + podkit.QUICK_EXIT],
        env=child_env(pod, extra, drop),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, f"child failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    guard_lines(proc.stdout + "\n" + proc.stderr)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("@@OUT@@")]
    assert lines, proc.stdout + proc.stderr
    return json.loads(lines[-1][len("@@OUT@@") :])


def readelf_dynamic(path: Path) -> str:
    if shutil.which("readelf") is None:
        pytest.fail("needs readelf (binutils)")
    return subprocess.run(
        ["readelf", "-dW", str(path)], capture_output=True, text=True, check=True, timeout=120
    ).stdout


def soname(path: Path) -> str | None:
    for line in readelf_dynamic(path).splitlines():
        if "(SONAME)" in line:
            return line.split("[", 1)[1].rstrip("]")
    return None


def dynsym(path: Path, *, undefined: bool = False) -> set[str]:
    if shutil.which("nm") is None:
        pytest.fail("needs nm (binutils)")
    flag = "--undefined-only" if undefined else "--defined-only"
    text = subprocess.run(
        ["nm", "-D", flag, str(path)], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    return {line.split()[-1].split("@")[0] for line in text.splitlines() if line.strip()}
