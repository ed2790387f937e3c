"""The stand-in libraries and emulated pods behave as tests/podkit.py promises.

Every check that loads a stand-in runs in a fresh interpreter (sys.executable), inside the pod's
environment, and reports back one JSON object.
"""

from __future__ import annotations

import ctypes.util
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
from podkit import expected_descriptor

# The brief's list L: what vLLM 0.32.0's extensions and torch 2.13's libraries need from libcuda.so.1.
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
]
BASIC = ["cuInit", "cuDriverGetVersion", "cuDeviceGetCount", "cuGetProcAddress"]
ENCODERS = [
    "cuTensorMapEncodeTiled",
    "cuTensorMapEncodeIm2col",
    "cuTensorMapEncodeIm2colWide",
    "cuTensorMapReplaceAddress",
]
NEW = [*ENCODERS, "cuGetProcAddress_v2", "cuLaunchKernelEx"]
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
        [sys.executable, "-c", script],
        env=child_env(pod, extra, drop),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, f"child failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("@@OUT@@")]
    assert lines, proc.stdout + proc.stderr
    return json.loads(lines[-1][len("@@OUT@@") :])


def readelf_dynamic(path: Path) -> str:
    if shutil.which("readelf") is None:
        pytest.fail("needs readelf (binutils)")
    return subprocess.run(["readelf", "-dW", str(path)], capture_output=True, text=True, check=True).stdout


def soname(path: Path) -> str | None:
    for line in readelf_dynamic(path).splitlines():
        if "(SONAME)" in line:
            return line.split("[", 1)[1].rstrip("]")
    return None


def dynsym(path: Path, *, undefined: bool = False) -> set[str]:
    if shutil.which("nm") is None:
        pytest.fail("needs nm (binutils)")
    flag = "--undefined-only" if undefined else "--defined-only"
    text = subprocess.run(["nm", "-D", flag, str(path)], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1].split("@")[0] for line in text.splitlines() if line.strip()}


@pytest.fixture(scope="session")
def libs() -> dict[str, Path]:
    return podkit.build_standins(podkit.DEFAULT_BUILD_DIR)


@pytest.fixture(scope="session")
def pods(libs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, podkit.Pod]:
    base = tmp_path_factory.mktemp("pods")
    return {kind: podkit.build_pod(base, kind) for kind in podkit.KINDS}


@pytest.fixture(scope="session")
def old_vllm(libs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return podkit.build_old_vllm(tmp_path_factory.mktemp("old"))


# ---------------------------------------------------------------------------------------------
# Build outputs and pod layout
# ---------------------------------------------------------------------------------------------


def test_build_is_cached(libs: dict[str, Path]) -> None:
    mtimes = {name: path.stat().st_mtime_ns for name, path in libs.items()}
    again = podkit.build_standins(podkit.DEFAULT_BUILD_DIR)
    assert again == libs
    assert {name: path.stat().st_mtime_ns for name, path in again.items()} == mtimes


def test_sonames_and_exports(libs: dict[str, Path]) -> None:
    expected_soname = {
        "driver": "libcuda.so.1",
        "layer": "libcuda-control.so",
        "layer_fork": "libcuda-control.so",
        "layer_noforward": "libcuda-control.so",
        "layer_standalone": "libcuda.so.1",
        "nvml": "libnvidia-ml.so.1",
    }
    for name, want in expected_soname.items():
        assert soname(libs[name]) == want, name

    driver = dynsym(libs["driver"])
    assert set(L + BASIC + NEW) <= driver
    assert {"standin_driver_calls", "standin_is_real_driver"} <= driver

    upstream = dynsym(libs["layer"])
    assert set(L + BASIC) | {"g_vcuda_config", "standin_layer_calls", "standin_is_layer"} <= upstream
    assert not set(NEW) & upstream
    assert dynsym(libs["layer_noforward"]) == upstream
    assert dynsym(libs["layer_fork"]) == upstream | set(NEW)
    assert dynsym(libs["layer_standalone"]) == upstream - {"g_vcuda_config"}
    # Only entry points and test helpers are exported (the guard reads .dynsym).
    assert {s for s in upstream if not s.startswith(("cu", "standin_"))} == {"g_vcuda_config"}

    assert set(NVML_REQUIRED) <= dynsym(libs["nvml"])
    assert dynsym(libs["vgpu"]) == {
        "cuMemAlloc_v2",
        "cuLaunchKernel",
        "standin_vgpu_calls",
        "standin_is_vgpu",
    }

    ext = libs["old_vllm_ext"]
    assert "Shared library: [libcuda.so.1]" in readelf_dynamic(ext)
    assert "cuTensorMapEncodeTiled" in dynsym(ext, undefined=True)
    assert "PyInit__C" in dynsym(ext)


@pytest.mark.parametrize("kind", podkit.KINDS)
def test_pod_layout(pods: dict[str, podkit.Pod], kind: str) -> None:
    pod = pods[kind]
    assert pod.kind == kind
    assert pod.lib_dir == pod.root / "usr/local/nvidia/lib64"
    assert pod.env["LD_LIBRARY_PATH"] == str(pod.lib_dir)
    assert pod.env["TMAGUARD_ROOT"] == str(pod.root)
    assert (pod.lib_dir / "libnvidia-ml.so.1").is_file()
    cuda1 = pod.lib_dir / "libcuda.so.1"
    vcuda_files = [pod.root / "etc/vcuda/vcuda.sock", pod.root / "usr/local/nvidia/bin/gpu-client"]

    if kind == "nogpu":
        assert not cuda1.exists() and pod.real_driver is None
        assert pod.env["STANDIN_NVML_COUNT"] == "0"
        return
    assert pod.env["STANDIN_NVML_NAME"] == "NVIDIA GeForce RTX 4090"
    assert pod.env["STANDIN_NVML_CC"] == "8.9"
    assert pod.env["STANDIN_NVML_DRIVER"] == "550.142"
    assert pod.env["STANDIN_NVML_COUNT"] == "1"

    if kind == "lupine":
        assert pod.real_driver is None
        assert pod.env["LUPINE_SERVER"] == "127.0.0.1:9999"
        assert soname(cuda1) == "libcuda.so.1"
        assert not list(pod.lib_dir.glob("libcuda.so.*.*"))
        return

    driver_dir = pod.root / podkit.SYSTEM_DRIVER_DIR if kind == "vcuda-gpa-v2" else pod.lib_dir
    assert pod.real_driver == driver_dir / "libcuda.so.550.142"
    assert soname(pod.real_driver) == "libcuda.so.1"
    if kind in ("bare", "hami"):
        assert soname(cuda1) == "libcuda.so.1"
        assert cuda1.read_bytes() == pod.real_driver.read_bytes()
        assert not any(p.exists() for p in vcuda_files)
    if kind == "hami":
        vgpu = pod.root / "usr/local/vgpu/libvgpu.so"
        assert vgpu.is_file()
        assert (pod.root / "etc/ld.so.preload").read_text().split() == ["/usr/local/vgpu/libvgpu.so"]
        assert pod.env["LD_PRELOAD"] == str(vgpu.resolve())
        assert pod.env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "20g"
        assert pod.env["CUDA_DEVICE_SM_LIMIT"] == "50"
    if kind in podkit.VCUDA_KINDS:
        assert soname(cuda1) == "libcuda-control.so"
        assert cuda1.stat().st_ino == (pod.lib_dir / "libcuda-control.so").stat().st_ino
        assert all(p.is_file() for p in vcuda_files)
        assert os.access(vcuda_files[1], os.X_OK)
    if kind not in ("hami",):
        assert "LD_PRELOAD" not in pod.env


def test_build_pod_options_and_unique_roots(libs: dict[str, Path], tmp_path: Path) -> None:
    a = podkit.build_pod(
        tmp_path, "vcuda", gpu_name="NVIDIA H100 80GB HBM3", cc="9.0", driver="580.95.05", gpu_count=2
    )
    b = podkit.build_pod(tmp_path, "vcuda")
    assert a.root != b.root
    assert a.real_driver == a.lib_dir / "libcuda.so.580.95.05" and a.real_driver.is_file()
    assert a.env["STANDIN_NVML_NAME"] == "NVIDIA H100 80GB HBM3"
    assert a.env["STANDIN_NVML_CC"] == "9.0"
    assert a.env["STANDIN_NVML_DRIVER"] == "580.95.05"
    assert a.env["STANDIN_NVML_COUNT"] == "2"
    out = run_child(
        a,
        "lib = ctypes.CDLL('libcuda.so.1'); lib.standin_layer_real_driver.restype = c_char_p\n"
        "out['real'] = lib.standin_layer_real_driver().decode()",
    )
    assert out["real"] == str(a.real_driver)
    with pytest.raises(ValueError):
        podkit.build_pod(tmp_path, "no-such-kind")


# ---------------------------------------------------------------------------------------------
# The real-driver stand-in
# ---------------------------------------------------------------------------------------------


def test_driver_entry_points(pods: dict[str, podkit.Pod]) -> None:
    names = L + BASIC + NEW
    out = run_child(
        pods["bare"],
        f"""
        lib = ctypes.CDLL("libcuda.so.1")
        out["is_driver"] = lib.standin_is_real_driver()
        out["missing"] = [n for n in {names!r} if not has(lib, n)]
        out["unknown_counter"] = counter(lib, "standin_driver_calls", "cuNoSuchThing")
        ptr = c_ulonglong(0xDEADBEEF)
        out["alloc"] = lib.cuMemAlloc_v2(byref(ptr), c_ulonglong(1 << 20))
        out["alloc_ptr"] = ptr.value
        lib.cuMemAlloc_v2(byref(ptr), c_ulonglong(1 << 20))
        out["alloc_calls"] = counter(lib, "standin_driver_calls", "cuMemAlloc_v2")
        out["free_calls"] = counter(lib, "standin_driver_calls", "cuMemFree_v2")
        msg, name = c_char_p(), c_char_p()
        out["errstr"] = [lib.cuGetErrorString(500, byref(msg)), msg.value.decode()]
        out["errname"] = [lib.cuGetErrorName(500, byref(name)), name.value.decode()]
        lib.cuGetErrorString(12345, byref(msg))
        out["errstr_unknown"] = msg.value.decode()
        v, n = c_int(), c_int()
        out["version"] = [lib.cuDriverGetVersion(byref(v)), v.value]
        out["count"] = [lib.cuDeviceGetCount(byref(n)), n.value]
        out["init"] = lib.cuInit(0)
        out["launch"] = lib.cuLaunchKernel(*([None] + [1] * 6 + [0, None, None, None]))
        out["launch_calls"] = counter(lib, "standin_driver_calls", "cuLaunchKernel")
        """,
    )
    assert out["is_driver"] == 1
    assert out["missing"] == []
    assert out["unknown_counter"] == -1
    assert out["alloc"] == 0 and out["alloc_ptr"] == 0
    assert out["alloc_calls"] == 2 and out["free_calls"] == 0
    assert out["errstr"] == [0, "named symbol not found"]
    assert out["errname"] == [0, "CUDA_ERROR_NOT_FOUND"]
    assert out["errstr_unknown"] == "unknown error"
    assert out["version"] == [0, 13000]
    assert out["count"] == [0, 1]
    assert out["init"] == 0
    assert out["launch"] == 0 and out["launch_calls"] == 1


def test_driver_encoders_write_the_specified_descriptor(pods: dict[str, podkit.Pod]) -> None:
    out = run_child(
        pods["bare"],
        """
        lib = ctypes.CDLL("libcuda.so.1")
        out["t1"] = tiled(addr(lib.cuTensorMapEncodeTiled))
        out["t2"] = tiled(addr(lib.cuTensorMapEncodeTiled), dtype=9, rank=3, gaddr=0x7F0012345678,
                          dim0=(1 << 40) + 5)
        desc = ctypes.create_string_buffer(128)
        dims = (c_ulonglong * 4)(64, 1, 1, 1)
        out["im2col"] = IM2COL(addr(lib.cuTensorMapEncodeIm2col))(
            desc, 2, 4, 0x2000, dims, None, None, None, 8, 16, None, 0, 0, 0, 0)
        out["im2col_desc"] = desc.raw.hex()
        wide = ctypes.create_string_buffer(128)
        out["wide"] = IM2COL_WIDE(addr(lib.cuTensorMapEncodeIm2colWide))(
            wide, 3, 3, 0x3000, dims, None, -1, 1, 8, 16, None, 0, 1, 0, 0, 0)
        out["wide_desc"] = wide.raw.hex()
        out["replace"] = REPLACE(addr(lib.cuTensorMapReplaceAddress))(wide, 0xABCDEF)
        out["replaced_desc"] = wide.raw.hex()
        out["null"] = tiled(addr(lib.cuTensorMapEncodeTiled), null_map=True)[0]
        out["null_replace"] = REPLACE(addr(lib.cuTensorMapReplaceAddress))(None, 1)
        out["rank0"] = tiled(addr(lib.cuTensorMapEncodeTiled), rank=0)
        lib.standin_encoder_calls.restype = c_ulonglong
        out["encoder_calls"] = lib.standin_encoder_calls()
        out["tiled_calls"] = counter(lib, "standin_driver_calls", "cuTensorMapEncodeTiled")
        """,
    )
    assert out["t1"] == [0, expected_descriptor(7, 1, 0x1000, 4096, 1).hex()]
    assert out["t2"] == [0, expected_descriptor(9, 3, 0x7F0012345678, (1 << 40) + 5, 2).hex()]
    assert out["im2col"] == 0
    assert out["im2col_desc"] == expected_descriptor(2, 4, 0x2000, 64, 3).hex()
    assert out["wide"] == 0
    assert out["wide_desc"] == expected_descriptor(3, 3, 0x3000, 64, 4).hex()
    # ReplaceAddress rewrites only the address (it still takes call number 5).
    assert out["replace"] == 0
    assert out["replaced_desc"] == expected_descriptor(3, 3, 0xABCDEF, 64, 4).hex()
    assert out["null"] == 1 and out["null_replace"] == 1
    assert out["rank0"] == [0, expected_descriptor(7, 0, 0x1000, 0, 8).hex()]
    assert out["encoder_calls"] == 8
    assert out["tiled_calls"] == 4


def test_driver_get_proc_address(pods: dict[str, podkit.Pod]) -> None:
    out = run_child(
        pods["bare"],
        """
        lib = ctypes.CDLL("libcuda.so.1")
        out["own"] = {n: addr(getattr(lib, n)) for n in
                      ["cuTensorMapEncodeTiled", "cuMemAlloc_v2", "cuGetProcAddress_v2", "cuLaunchKernelEx"]}
        out["v1"] = {n: gpa(lib, n) for n in out["own"]}
        out["v2"] = {n: gpa2(lib, n) for n in out["own"]}
        out["v1_unknown"] = gpa(lib, "cuNoSuchThing")
        out["v2_unknown"] = gpa2(lib, "cuNoSuchThing")
        out["v1_null"] = GPA(addr(lib.cuGetProcAddress))(b"cuInit", None, 12000, 0)
        fn = gpa(lib, "cuTensorMapEncodeTiled")[1]
        out["through_gpa"] = tiled(fn)
        out["gpa_calls"] = [counter(lib, "standin_driver_calls", "cuGetProcAddress"),
                            counter(lib, "standin_driver_calls", "cuGetProcAddress_v2")]
        """,
    )
    for name, address in out["own"].items():
        assert out["v1"][name] == [0, address], name
        assert out["v2"][name] == [0, address, 0], name
    assert out["v1_unknown"] == [0, None]
    assert out["v2_unknown"] == [0, None, 1]
    assert out["v1_null"] == 1
    assert out["through_gpa"] == [0, expected_descriptor(7, 1, 0x1000, 4096, 1).hex()]
    assert out["gpa_calls"] == [7, 5]


# ---------------------------------------------------------------------------------------------
# vCUDA-like layers
# ---------------------------------------------------------------------------------------------

LAYER_PROBE = """
lib = ctypes.CDLL("libcuda.so.1")
real_path = os.environ.get("POD_REAL_DRIVER")
lib.standin_layer_variant.restype = c_char_p
lib.standin_layer_real_driver.restype = c_char_p
out["is_layer"] = lib.standin_is_layer()
out["variant"] = lib.standin_layer_variant().decode()
rd = lib.standin_layer_real_driver()
out["real_driver"] = rd.decode() if rd else None
out["exports"] = {n: has(lib, n) for n in ENTRY_NAMES}
out["has_config"] = has(lib, "g_vcuda_config")
# Every later dlopen("libcuda.so.1") gets the layer (matched by the name it was loaded as).
out["again_is_layer"] = has(ctypes.CDLL("libcuda.so.1"), "standin_is_layer")
drv = None
if real_path:
    drv = ctypes.CDLL(real_path, mode=os.RTLD_NOLOAD | os.RTLD_NOW)
    out["drv_is_real"] = drv.standin_is_real_driver()
    out["driver_mappings"] = maps_count(os.path.basename(real_path))
"""


def layer_probe(pod: podkit.Pod, code: str) -> dict:
    names = L + BASIC + NEW
    extra = {"POD_REAL_DRIVER": str(pod.real_driver)} if pod.real_driver else {}
    return run_child(pod, f"ENTRY_NAMES = {names!r}\n" + LAYER_PROBE + textwrap.dedent(code), extra=extra)


def test_vcuda_layer_upstream(pods: dict[str, podkit.Pod]) -> None:
    pod = pods["vcuda"]
    out = layer_probe(
        pod,
        """
        out["alloc_before"] = [counter(lib, "standin_layer_calls", "cuMemAlloc_v2"),
                               counter(drv, "standin_driver_calls", "cuMemAlloc_v2")]
        ptr = c_ulonglong(0xDEADBEEF)
        out["alloc"] = lib.cuMemAlloc_v2(byref(ptr), c_ulonglong(1 << 20))
        out["alloc_ptr"] = ptr.value
        out["alloc_after"] = [counter(lib, "standin_layer_calls", "cuMemAlloc_v2"),
                              counter(drv, "standin_driver_calls", "cuMemAlloc_v2")]
        out["launch"] = lib.cuLaunchKernel(*([None] + [1] * 6 + [0, None, None, None]))
        out["launch_calls"] = [counter(lib, "standin_layer_calls", "cuLaunchKernel"),
                               counter(drv, "standin_driver_calls", "cuLaunchKernel")]
        msg = c_char_p()
        out["errstr"] = [lib.cuGetErrorString(500, byref(msg)), msg.value.decode()]
        v = c_int()
        out["version"] = [lib.cuDriverGetVersion(byref(v)), v.value]

        out["gpa_own"] = gpa(lib, "cuMemAlloc_v2") == [0, addr(lib.cuMemAlloc_v2)]
        r, fn = gpa(lib, "cuTensorMapEncodeTiled")
        out["gpa_encoder"] = [r, fn == addr(drv.cuTensorMapEncodeTiled)]
        out["encode"] = tiled(fn)
        out["gpa_v2"] = gpa(lib, "cuGetProcAddress_v2")[1] == addr(drv.cuGetProcAddress_v2)
        out["gpa_unknown"] = gpa(lib, "cuNoSuchThing")
        out["gpa_calls"] = [counter(lib, "standin_layer_calls", "cuGetProcAddress"),
                            counter(drv, "standin_driver_calls", "cuGetProcAddress")]
        out["driver_mappings_after"] = maps_count(os.path.basename(real_path))
        """,
    )
    assert out["is_layer"] == 1 and out["variant"] == "upstream"
    assert out["real_driver"] == str(pod.real_driver)
    assert out["has_config"] is True
    assert out["again_is_layer"] is True
    assert out["drv_is_real"] == 1 and out["driver_mappings"] == 1
    assert [n for n, present in out["exports"].items() if not present] == NEW
    assert out["alloc_before"] == [0, 0]
    assert out["alloc"] == 0 and out["alloc_ptr"] == 0
    assert out["alloc_after"] == [1, 1]
    assert out["launch"] == 0 and out["launch_calls"] == [1, 1]
    assert out["errstr"] == [0, "named symbol not found"]
    assert out["version"] == [0, 13000]
    assert out["gpa_own"] is True
    assert out["gpa_encoder"] == [0, True]
    assert out["encode"] == [0, expected_descriptor(7, 1, 0x1000, 4096, 1).hex()]
    assert out["gpa_v2"] is True
    assert out["gpa_unknown"] == [0, None]
    # Three names went on to the driver; the layer's own name did not.
    assert out["gpa_calls"] == [4, 3]
    assert out["driver_mappings_after"] == 1


def test_vcuda_layer_noforward(pods: dict[str, podkit.Pod]) -> None:
    pod = pods["vcuda-noforward"]
    out = layer_probe(
        pod,
        """
        out["gpa_encoder"] = gpa(lib, "cuTensorMapEncodeTiled")
        out["gpa_unknown"] = gpa(lib, "cuNoSuchThing")
        out["gpa_own"] = gpa(lib, "cuMemAlloc_v2") == [0, addr(lib.cuMemAlloc_v2)]
        # The consumer's fallback: the real driver file the layer opened, by RTLD_NOLOAD.
        out["fallback"] = tiled(addr(drv.cuTensorMapEncodeTiled))
        out["driver_gpa_calls"] = counter(drv, "standin_driver_calls", "cuGetProcAddress")
        """,
    )
    assert out["variant"] == "noforward"
    assert out["real_driver"] == str(pod.real_driver)
    assert out["has_config"] is True
    assert [n for n, present in out["exports"].items() if not present] == NEW
    assert out["gpa_encoder"] == [500, None]
    assert out["gpa_unknown"] == [500, None]
    assert out["gpa_own"] is True
    assert out["fallback"] == [0, expected_descriptor(7, 1, 0x1000, 4096, 1).hex()]
    assert out["driver_gpa_calls"] == 0


def test_vcuda_layer_fork(pods: dict[str, podkit.Pod]) -> None:
    pod = pods["vcuda-fork"]
    out = layer_probe(
        pod,
        """
        out["encode"] = tiled(addr(lib.cuTensorMapEncodeTiled))
        out["encode_calls"] = [counter(lib, "standin_layer_calls", "cuTensorMapEncodeTiled"),
                               counter(drv, "standin_driver_calls", "cuTensorMapEncodeTiled")]
        desc = ctypes.create_string_buffer(128)
        dims = (c_ulonglong * 4)(64, 1, 1, 1)
        # 16 arguments: must reach the driver intact.
        out["wide"] = IM2COL_WIDE(addr(lib.cuTensorMapEncodeIm2colWide))(
            desc, 3, 3, 0x3000, dims, None, -1, 1, 8, 16, None, 0, 1, 0, 0, 0)
        out["wide_desc"] = desc.raw.hex()
        out["replace"] = REPLACE(addr(lib.cuTensorMapReplaceAddress))(desc, 0x4000)
        out["replaced_desc"] = desc.raw.hex()
        out["v2_own"] = gpa2(lib, "cuTensorMapEncodeTiled") == [0, addr(lib.cuTensorMapEncodeTiled), 0]
        out["v1_own"] = gpa(lib, "cuLaunchKernelEx") == [0, addr(lib.cuLaunchKernelEx)]
        out["v2_unknown"] = gpa2(lib, "cuNoSuchThing")
        out["v2_calls"] = [counter(lib, "standin_layer_calls", "cuGetProcAddress_v2"),
                           counter(drv, "standin_driver_calls", "cuGetProcAddress_v2")]
        out["launch_ex"] = [lib.cuLaunchKernelEx(None, None, None, None),
                            counter(lib, "standin_layer_calls", "cuLaunchKernelEx"),
                            counter(drv, "standin_driver_calls", "cuLaunchKernelEx")]
        """,
    )
    assert out["variant"] == "fork"
    assert out["has_config"] is True
    assert all(out["exports"].values())
    assert out["encode"] == [0, expected_descriptor(7, 1, 0x1000, 4096, 1).hex()]
    assert out["encode_calls"] == [1, 1]
    assert out["wide"] == 0
    assert out["wide_desc"] == expected_descriptor(3, 3, 0x3000, 64, 2).hex()
    assert out["replace"] == 0
    assert out["replaced_desc"] == expected_descriptor(3, 3, 0x4000, 64, 2).hex()
    assert out["v2_own"] is True and out["v1_own"] is True
    assert out["v2_unknown"] == [0, None, 1]
    assert out["v2_calls"] == [2, 1]
    assert out["launch_ex"] == [0, 1, 1]


def test_lupine_layer(pods: dict[str, podkit.Pod]) -> None:
    pod = pods["lupine"]
    out = layer_probe(
        pod,
        """
        out["gpa_encoder"] = gpa(lib, "cuTensorMapEncodeTiled")
        out["gpa_own"] = gpa(lib, "cuMemAlloc_v2") == [0, addr(lib.cuMemAlloc_v2)]
        ptr = c_ulonglong(0xDEADBEEF)
        out["alloc"] = [lib.cuMemAlloc_v2(byref(ptr), c_ulonglong(1 << 20)), ptr.value,
                        counter(lib, "standin_layer_calls", "cuMemAlloc_v2")]
        msg = c_char_p()
        out["errstr"] = [lib.cuGetErrorString(1, byref(msg)), bool(msg.value)]
        out["libcuda_files"] = sorted(
            os.path.basename(line.split()[-1]) for line in open("/proc/self/maps")
            if "libcuda" in line)
        """,
    )
    assert out["variant"] == "standalone"
    assert out["real_driver"] is None
    assert out["has_config"] is False
    assert [n for n, present in out["exports"].items() if not present] == NEW
    assert out["gpa_encoder"] == [0, None]
    assert out["gpa_own"] is True
    assert out["alloc"] == [0, 0, 1]
    assert out["errstr"] == [0, True]
    assert set(out["libcuda_files"]) == {"libcuda.so.1"}


def test_hami_preload(pods: dict[str, podkit.Pod]) -> None:
    out = run_child(
        pods["hami"],
        """
        drv = ctypes.CDLL("libcuda.so.1")
        glob = ctypes.CDLL(None)
        out["preloaded"] = maps_count("libvgpu.so")
        # Global-scope look-up finds the preload; a handle-scoped one finds the driver itself.
        out["global_is_vgpu"] = addr(glob.cuMemAlloc_v2) != addr(drv.cuMemAlloc_v2)
        ptr = c_ulonglong(0xDEADBEEF)
        out["alloc"] = [glob.cuMemAlloc_v2(byref(ptr), c_ulonglong(1 << 20)), ptr.value]
        out["launch"] = glob.cuLaunchKernel(*([None] + [1] * 6 + [0, None, None, None]))
        out["vgpu_calls"] = [counter(glob, "standin_vgpu_calls", "cuMemAlloc_v2"),
                             counter(glob, "standin_vgpu_calls", "cuLaunchKernel"),
                             counter(glob, "standin_vgpu_calls", "cuNoSuchThing")]
        out["driver_calls"] = [counter(drv, "standin_driver_calls", "cuMemAlloc_v2"),
                               counter(drv, "standin_driver_calls", "cuLaunchKernel")]
        drv.cuMemAlloc_v2(byref(ptr), c_ulonglong(1))
        out["direct"] = [counter(glob, "standin_vgpu_calls", "cuMemAlloc_v2"),
                         counter(drv, "standin_driver_calls", "cuMemAlloc_v2")]
        out["has_encoder"] = has(drv, "cuTensorMapEncodeTiled")
        """,
    )
    assert out["preloaded"] == 1
    assert out["global_is_vgpu"] is True
    assert out["alloc"] == [0, 0] and out["launch"] == 0
    assert out["vgpu_calls"] == [1, 1, -1]
    assert out["driver_calls"] == [1, 1]
    assert out["direct"] == [1, 2]
    assert out["has_encoder"] is True


def test_nogpu_pod_has_no_libcuda(pods: dict[str, podkit.Pod]) -> None:
    if ctypes.util.find_library("cuda"):
        pytest.fail("this host has its own libcuda.so.1: the no-GPU pod needs a host without one")
    out = run_child(
        pods["nogpu"],
        """
        try:
            ctypes.CDLL("libcuda.so.1")
            out["error"] = None
        except OSError as e:
            out["error"] = str(e)
        """,
    )
    assert "libcuda.so.1: cannot open shared object file" in out["error"]


# ---------------------------------------------------------------------------------------------
# NVML stand-in
# ---------------------------------------------------------------------------------------------

NVML_PROBE = """
class Memory(ctypes.Structure):
    _fields_ = [("total", c_ulonglong), ("free", c_ulonglong), ("used", c_ulonglong)]

class MemoryV2(ctypes.Structure):
    _fields_ = [("version", c_uint), ("total", c_ulonglong), ("reserved", c_ulonglong),
                ("free", c_ulonglong), ("used", c_ulonglong)]

class Pci(ctypes.Structure):
    _fields_ = [("busIdLegacy", ctypes.c_char * 16), ("domain", c_uint), ("bus", c_uint),
                ("device", c_uint), ("pciDeviceId", c_uint), ("pciSubSystemId", c_uint),
                ("busId", ctypes.c_char * 32)]

nv = ctypes.CDLL("libnvidia-ml.so.1")
nv.nvmlErrorString.restype = c_char_p
out["before_init"] = nv.nvmlDeviceGetCount_v2(byref(c_uint()))
out["init"] = [nv.nvmlInit_v2(), nv.nvmlInit(), nv.nvmlInitWithFlags(0)]
n = c_uint(99)
out["count"] = [nv.nvmlDeviceGetCount_v2(byref(n)), n.value]
out["count_v1"] = [nv.nvmlDeviceGetCount(byref(n)), n.value]
buf = ctypes.create_string_buffer(96)
out["driver"] = [nv.nvmlSystemGetDriverVersion(buf, 80), buf.value.decode()]
cv = c_int()
out["cuda"] = [nv.nvmlSystemGetCudaDriverVersion(byref(cv)), cv.value]
out["cuda_v2"] = [nv.nvmlSystemGetCudaDriverVersion_v2(byref(cv)), cv.value]
dev = c_void_p()
out["bad_index"] = nv.nvmlDeviceGetHandleByIndex_v2(n.value, byref(dev))
out["error_string"] = nv.nvmlErrorString(3).decode()
devices = []
for i in range(n.value):
    d, d1 = c_void_p(), c_void_p()
    info = {"handle": [nv.nvmlDeviceGetHandleByIndex_v2(i, byref(d)),
                       nv.nvmlDeviceGetHandleByIndex(i, byref(d1)), d.value == d1.value]}
    info["name"] = [nv.nvmlDeviceGetName(d, buf, 96), buf.value.decode()]
    info["name_small"] = nv.nvmlDeviceGetName(d, buf, 4)
    ma, mi = c_int(), c_int()
    info["cc"] = [nv.nvmlDeviceGetCudaComputeCapability(d, byref(ma), byref(mi)), ma.value, mi.value]
    m = Memory()
    info["mem"] = [nv.nvmlDeviceGetMemoryInfo(d, byref(m)), m.total, m.free, m.used]
    m2 = MemoryV2(version=0x02000028)
    info["mem_v2"] = [nv.nvmlDeviceGetMemoryInfo_v2(d, byref(m2)), m2.total, m2.free, m2.used]
    info["mem_v2_badver"] = nv.nvmlDeviceGetMemoryInfo_v2(d, byref(MemoryV2(version=1)))
    uuid = ctypes.create_string_buffer(96)
    info["uuid"] = [nv.nvmlDeviceGetUUID(d, uuid, 96), uuid.value.decode()]
    back = c_void_p()
    info["by_uuid"] = [nv.nvmlDeviceGetHandleByUUID(uuid.value, byref(back)), back.value == d.value]
    cur, pend = c_uint(9), c_uint(9)
    info["mig"] = [nv.nvmlDeviceGetMigMode(d, byref(cur), byref(pend)), cur.value, pend.value]
    virt = c_ulonglong(0)
    info["virt"] = [nv.nvmlDeviceGetVirtualizationMode(d, byref(virt)), virt.value]
    idx = c_uint(99)
    info["index"] = [nv.nvmlDeviceGetIndex(d, byref(idx)), idx.value]
    info["minor"] = [nv.nvmlDeviceGetMinorNumber(d, byref(idx)), idx.value]
    pci = Pci()
    info["pci"] = [nv.nvmlDeviceGetPciInfo_v3(d, byref(pci)), pci.busId.decode(),
                   pci.busIdLegacy.decode(), pci.bus, pci.domain]
    arch, brand, pers, level, status = c_uint(), c_int(), c_int(), c_int(), c_int()
    info["arch"] = [nv.nvmlDeviceGetArchitecture(d, byref(arch)), arch.value]
    info["brand"] = [nv.nvmlDeviceGetBrand(d, byref(brand)), brand.value]
    info["persistence"] = nv.nvmlDeviceGetPersistenceMode(d, byref(pers))
    info["topology_self"] = [nv.nvmlDeviceGetTopologyCommonAncestor(d, d, byref(level)), level.value]
    info["p2p_nvlink"] = [nv.nvmlDeviceGetP2PStatus(d, d, 2, byref(status)), status.value]
    info["nvlink"] = nv.nvmlDeviceGetNvLinkState(d, 0, byref(status))
    info["numa"] = nv.nvmlDeviceGetNumaNodeId(d, byref(status))
    devices.append(info)
out["devices"] = devices
out["shutdown"] = [nv.nvmlShutdown(), nv.nvmlShutdown(), nv.nvmlShutdown(), nv.nvmlShutdown()]
"""


def test_nvml_defaults(pods: dict[str, podkit.Pod]) -> None:
    out = run_child(
        pods["bare"], NVML_PROBE, drop=[k for k in pods["bare"].env if k.startswith("STANDIN_NVML_")]
    )
    assert out["before_init"] == 1  # NVML_ERROR_UNINITIALIZED
    assert out["init"] == [0, 0, 0]
    assert out["count"] == [0, 1] and out["count_v1"] == [0, 1]
    assert out["driver"] == [0, "550.142"]
    assert out["cuda"] == [0, 12040] and out["cuda_v2"] == [0, 12040]
    assert out["bad_index"] == 2
    assert out["error_string"] == "Not Supported"
    (dev,) = out["devices"]
    assert dev["handle"] == [0, 0, True]
    assert dev["name"] == [0, "NVIDIA GeForce RTX 4090"]
    assert dev["name_small"] == 7  # NVML_ERROR_INSUFFICIENT_SIZE
    assert dev["cc"] == [0, 8, 9]
    assert dev["mem"] == [0, 24 * GIB, 24 * GIB, 0]
    assert dev["mem_v2"] == [0, 24 * GIB, 24 * GIB, 0]
    assert dev["mem_v2_badver"] == 25
    assert dev["uuid"][0] == 0 and dev["uuid"][1].startswith("GPU-")
    assert dev["by_uuid"] == [0, True]
    assert dev["mig"] == [0, 0, 0]
    assert dev["virt"] == [0, 0]
    assert dev["index"] == [0, 0] and dev["minor"] == [0, 0]
    assert dev["pci"] == [0, "00000000:01:00.0", "0000:01:00.0", 1, 0]
    assert dev["arch"] == [0, 8]  # NVML_DEVICE_ARCH_ADA
    assert dev["brand"] == [0, 5]  # NVML_BRAND_GEFORCE
    assert dev["persistence"] == 0
    assert dev["topology_self"] == [0, 0]
    assert dev["p2p_nvlink"] == [0, 5]  # NVML_P2P_STATUS_NOT_SUPPORTED
    assert dev["nvlink"] == 3 and dev["numa"] == 3
    assert out["shutdown"] == [0, 0, 0, 1]


def test_nvml_environment(pods: dict[str, podkit.Pod]) -> None:
    env = {
        "STANDIN_NVML_COUNT": "2",
        "STANDIN_NVML_NAME": "NVIDIA H100 80GB HBM3",
        "STANDIN_NVML_CC": "9.0",
        "STANDIN_NVML_DRIVER": "580.95.05",
        "STANDIN_NVML_CUDA_VERSION": "13000",
        "STANDIN_NVML_MIG": "1",
        "STANDIN_NVML_VIRT": "2",
        "STANDIN_NVML_MEM_MIB": "81559",
        "STANDIN_NVML_NVLINK": "1",
    }
    out = run_child(pods["bare"], NVML_PROBE, extra=env)
    assert out["count"] == [0, 2]
    assert out["driver"] == [0, "580.95.05"]
    assert out["cuda"] == [0, 13000] and out["cuda_v2"] == [0, 13000]
    assert out["bad_index"] == 2
    first, second = out["devices"]
    for i, dev in enumerate(out["devices"]):
        assert dev["name"] == [0, "NVIDIA H100 80GB HBM3"]
        assert dev["cc"] == [0, 9, 0]
        assert dev["arch"] == [0, 9]  # NVML_DEVICE_ARCH_HOPPER
        assert dev["brand"] == [0, 14]
        assert dev["mig"] == [0, 1, 1]
        assert dev["virt"] == [0, 2]
        assert dev["mem"][1] == 81559 << 20
        assert dev["index"] == [0, i]
        assert dev["by_uuid"] == [0, True]
        assert dev["p2p_nvlink"] == [0, 0]
        assert dev["nvlink"] == 0
    assert first["uuid"] != second["uuid"]
    assert second["pci"][1] == "00000000:02:00.0"


def test_nvml_no_gpu_and_unsupported_mig(pods: dict[str, podkit.Pod]) -> None:
    out = run_child(pods["nogpu"], NVML_PROBE)
    assert out["init"] == [0, 0, 0]
    assert out["count"] == [0, 0]
    assert out["bad_index"] == 2
    assert out["devices"] == []
    out = run_child(
        pods["bare"], NVML_PROBE, extra={"STANDIN_NVML_MIG": "unsupported", "STANDIN_NVML_CC": "12.0"}
    )
    (dev,) = out["devices"]
    assert dev["mig"][0] == 3
    assert dev["arch"] == [0, 10]  # NVML_DEVICE_ARCH_BLACKWELL


def test_nvml_fail(pods: dict[str, podkit.Pod]) -> None:
    out = run_child(
        pods["bare"],
        """
        nv = ctypes.CDLL("libnvidia-ml.so.1")
        out["init"] = [nv.nvmlInit(), nv.nvmlInit_v2(), nv.nvmlInitWithFlags(0)]
        out["count"] = nv.nvmlDeviceGetCount_v2(byref(c_uint()))
        out["shutdown"] = nv.nvmlShutdown()
        """,
        extra={"STANDIN_NVML_FAIL": "9"},
    )
    assert out == {"init": [9, 9, 9], "count": 1, "shutdown": 1}


def test_nvml_hang(pods: dict[str, podkit.Pod]) -> None:
    code = PRELUDE + textwrap.dedent(
        """
        nv = ctypes.CDLL("libnvidia-ml.so.1")
        nv.nvmlInit_v2()
        print("returned")
        """
    )
    env = child_env(pods["bare"], {"STANDIN_NVML_HANG": "1"})
    with pytest.raises(subprocess.TimeoutExpired) as excinfo:
        subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=3)
    assert "returned" not in str(excinfo.value.stdout or "")


def test_nvml_through_pynvml(pods: dict[str, podkit.Pod]) -> None:
    out = run_child(
        pods["bare"],
        """
        import pynvml as nv
        nv.nvmlInit()
        out["count"] = nv.nvmlDeviceGetCount()
        h = nv.nvmlDeviceGetHandleByIndex(0)
        out["name"] = nv.nvmlDeviceGetName(h)
        out["cc"] = list(nv.nvmlDeviceGetCudaComputeCapability(h))
        out["driver"] = nv.nvmlSystemGetDriverVersion()
        out["cuda"] = [nv.nvmlSystemGetCudaDriverVersion(), nv.nvmlSystemGetCudaDriverVersion_v2()]
        out["mem"] = nv.nvmlDeviceGetMemoryInfo(h).total
        out["mem_v2"] = nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2).total
        out["uuid"] = nv.nvmlDeviceGetUUID(h)
        out["index"] = nv.nvmlDeviceGetIndex(nv.nvmlDeviceGetHandleByUUID(out["uuid"]))
        out["mig"] = nv.nvmlDeviceGetMigMode(h)
        out["virt"] = nv.nvmlDeviceGetVirtualizationMode(h)
        bus = nv.nvmlDeviceGetPciInfo(h).busId
        out["bus"] = bus.decode() if isinstance(bus, bytes) else bus
        out["arch"] = nv.nvmlDeviceGetArchitecture(h)
        out["p2p"] = nv.nvmlDeviceGetP2PStatus(h, h, nv.NVML_P2P_CAPS_INDEX_NVLINK)
        try:
            nv.nvmlDeviceGetNvLinkState(h, 0)
        except nv.NVMLError as e:
            out["nvlink_error"] = e.value
        nv.nvmlShutdown()
        """,
        extra={
            "STANDIN_NVML_CC": "9.0",
            "STANDIN_NVML_NAME": "NVIDIA H200",
            "STANDIN_NVML_VIRT": "1",
            "STANDIN_NVML_MIG": "1",
            "STANDIN_NVML_CUDA_VERSION": "12080",
        },
    )
    assert out["count"] == 1
    assert out["name"] == "NVIDIA H200"
    assert out["cc"] == [9, 0]
    assert out["driver"] == "550.142"
    assert out["cuda"] == [12080, 12080]
    assert out["mem"] == out["mem_v2"] == 24 * GIB
    assert out["index"] == 0
    assert out["mig"] == [1, 1]
    assert out["virt"] == 1
    assert out["bus"] == "00000000:01:00.0"
    assert out["arch"] == 9
    assert out["p2p"] == 5
    assert out["nvlink_error"] == 3


@pytest.mark.parametrize(
    ("kind", "cc", "platform"), [("bare", "9.0", "CudaPlatform"), ("nogpu", "8.9", None)]
)
def test_vllm_platform_detection_uses_the_nvml_standin(
    pods: dict[str, podkit.Pod], kind: str, cc: str, platform: str | None
) -> None:
    out = run_child(
        pods[kind],
        """
        from vllm.platforms import cuda_platform_plugin
        found = cuda_platform_plugin()
        out["platform"] = found.rsplit(".", 1)[-1] if found else None
        if found:
            from vllm.platforms.cuda import NvmlCudaPlatform as P
            out["cc"] = list(P.get_device_capability(0))
            out["name"] = P.get_device_name(0)
            out["memory"] = P.get_device_total_memory(0)
            out["connected"] = P.is_fully_connected([0])
        """,
        extra={"STANDIN_NVML_CC": cc},
    )
    assert out["platform"] == platform
    if platform:
        assert out["cc"] == [9, 0]
        assert out["name"] == "NVIDIA GeForce RTX 4090"
        assert out["memory"] == 24 * GIB
        assert out["connected"] is True


# ---------------------------------------------------------------------------------------------
# vLLM extensions in the pods: the emulated 0.6 `_C`, and the installed 0.32 binaries
# ---------------------------------------------------------------------------------------------

OLD_IMPORT = """
try:
    import vllm
    out["version"] = vllm.__version__
    from importlib.metadata import version
    out["dist_version"] = version("vllm")
    out["probe"] = [vllm._C.encode_probe()[0].hex(), vllm._C.encode_probe()[1]]
    lib = ctypes.CDLL("libcuda.so.1")
    if has(lib, "standin_layer_calls"):
        out["layer_encoder_calls"] = counter(lib, "standin_layer_calls", "cuTensorMapEncodeTiled")
except ImportError as e:
    out["error"] = str(e)
"""


@pytest.mark.parametrize(
    "kind", ["bare", "hami", "vcuda-fork", "vcuda", "vcuda-noforward", "lupine", "nogpu"]
)
def test_old_vllm_extension(pods: dict[str, podkit.Pod], old_vllm: Path, kind: str) -> None:
    if kind == "nogpu" and ctypes.util.find_library("cuda"):
        pytest.fail("this host has its own libcuda.so.1: the no-GPU pod needs a host without one")
    out = run_child(pods[kind], OLD_IMPORT, extra={"PYTHONPATH": str(old_vllm)})
    if kind in ("bare", "hami", "vcuda-fork"):
        assert "error" not in out, out
        assert out["version"] == out["dist_version"] == "0.6.6.post1"
        # The first probe's descriptor (call number 1) and the second probe's result.
        assert out["probe"] == [expected_descriptor(7, 1, 0x1000, 4096, 1).hex(), 0]
        if kind == "vcuda-fork":
            assert out["layer_encoder_calls"] == 2
    elif kind == "nogpu":
        assert "libcuda.so.1: cannot open shared object file" in out["error"]
    else:
        assert "undefined symbol: cuTensorMapEncodeTiled" in out["error"]
        assert "_C.abi3.so" in out["error"]


def _vllm_extensions() -> list[Path]:
    root = SITE / "vllm"
    return sorted(root.rglob("*.so")) if root.is_dir() else []


def test_list_l_covers_what_vllm_and_torch_import(libs: dict[str, Path]) -> None:
    needed: set[str] = set()
    for so in [*_vllm_extensions(), *sorted((SITE / "torch/lib").glob("*.so*"))]:
        needed |= {s for s in dynsym(so, undefined=True) if s.startswith("cu") and s[2:3].isupper()}
    needed = {s for s in needed if not s.startswith("cuFile")}  # libcufile's, not the driver's
    assert "cuTensorMapEncodeTiled" in needed
    assert needed <= dynsym(libs["driver"])
    assert needed - dynsym(libs["layer"]) == {"cuTensorMapEncodeTiled", "cuGetProcAddress_v2"}


@pytest.mark.parametrize("kind", ["bare", "hami", "vcuda-fork", "vcuda", "lupine"])
def test_real_vllm_extension_in_pod(pods: dict[str, podkit.Pod], kind: str) -> None:
    exts = ["_C_stable_libtorch.abi3.so", "cumem_allocator.abi3.so", "vllm_flash_attn/_vllm_fa3_C.abi3.so"]
    out = run_child(
        pods[kind],
        f"""
        import torch  # noqa: F401 - the extensions need torch's libraries loaded
        site = {str(SITE / "vllm")!r}
        for ext in {exts!r}:
            try:
                ctypes.CDLL(os.path.join(site, ext), mode=os.RTLD_NOW)
                out[ext] = "ok"
            except OSError as e:
                out[ext] = str(e)
        """,
    )
    if kind in ("bare", "hami", "vcuda-fork"):
        assert set(out.values()) == {"ok"}, out
    else:
        assert "undefined symbol: cuTensorMapEncodeTiled" in out["_C_stable_libtorch.abi3.so"]
        assert "undefined symbol: cuTensorMapEncodeTiled" in out["vllm_flash_attn/_vllm_fa3_C.abi3.so"]
        assert out["cumem_allocator.abi3.so"] == "ok"
