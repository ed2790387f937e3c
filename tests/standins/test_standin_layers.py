"""The stand-in layers behave as the real ones measured on a GPU (docs/real-layers.md): tkestack vCUDA master
and v1.0.5 (exports through a table only their init fills, init through cuInit/cuDriverGetVersion/NVML,
registration, exit without a config, the quota; master's look-up hooks by requested name, v1.0.5's forwards
unhooked), a vCUDA fork, lupine, HAMi's preload with its process-wide dlsym, and the no-GPU pod."""

from __future__ import annotations

import ctypes.util
import subprocess
import sys
import textwrap

import podkit
import pytest
from podkit import expected_descriptor
from standin_child import BASIC, CUDA12, GIB, LEGACY, NEW, L, child_env, run_child

LAYER_PROBE = """
lib = ctypes.CDLL("libcuda.so.1")
real_path = os.environ.get("POD_REAL_DRIVER")
lib.standin_layer_variant.restype = c_char_p
lib.standin_layer_real_driver.restype = c_char_p
out["is_layer"] = lib.standin_is_layer()
out["variant"] = lib.standin_layer_variant().decode()
out["exports"] = {n: has(lib, n) for n in ENTRY_NAMES}
# Every later dlopen("libcuda.so.1") gets the layer (matched by the name it was loaded as).
out["again_is_layer"] = has(ctypes.CDLL("libcuda.so.1"), "standin_is_layer")
"""


def layer_probe(pod: podkit.Pod, code: str) -> dict:
    names = L + BASIC + LEGACY + NEW + CUDA12
    extra = {"POD_REAL_DRIVER": str(pod.real_driver)} if pod.real_driver else {}
    return run_child(pod, f"ENTRY_NAMES = {names!r}\n" + LAYER_PROBE + textwrap.dedent(code), extra=extra)


def _crash(pod: podkit.Pod, code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", "import ctypes\ncuda = ctypes.CDLL('libcuda.so.1')\n" + code],
        env=child_env(pod),
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("kind", ["vcuda", "vcuda-v105"])
def test_vcuda_exports_jump_through_a_table_only_its_init_fills(pods, kind: str) -> None:
    pod = pods[kind]
    before = _crash(pod, "cuda.cuMemAlloc_v2(None, 1)")
    assert before.returncode == -6 and "cuMemAlloc_v2 called through the empty table" in before.stderr
    out = layer_probe(
        pod,
        """
        out["real_before"] = lib.standin_layer_real_driver()
        v = c_int()
        out["version"] = [lib.cuDriverGetVersion(byref(v)), v.value]  # runs the layer's init
        out["real_after"] = lib.standin_layer_real_driver().decode()
        drv = ctypes.CDLL(real_path, mode=os.RTLD_NOLOAD)
        ptr = c_ulonglong(0xDEADBEEF)
        out["alloc"] = [lib.cuMemAlloc_v2(byref(ptr), c_ulonglong(1 << 20)),
                        lib.cuMemAlloc_v2(byref(ptr), c_ulonglong(30 << 30))]
        out["alloc_calls"] = [counter(lib, "standin_layer_calls", "cuMemAlloc_v2"),
                              counter(drv, "standin_driver_calls", "cuMemAlloc_v2")]
        free, total = c_ulonglong(), c_ulonglong()
        out["mem_info"] = [lib.cuMemGetInfo_v2(byref(free), byref(total)), free.value, total.value]
        out["launch"] = [lib.cuLaunchKernel(*([None] + [1] * 6 + [0, None, None, None])),
                         counter(lib, "standin_layer_calls", "cuLaunchKernel")]
        out["registrations"] = open(os.environ["STANDIN_VCUDA_ROOT"] + "/etc/vcuda/registrations").read()
        """,
    )
    assert out["is_layer"] == 1 and out["again_is_layer"] is True
    assert out["variant"] == ("vcuda-master" if kind == "vcuda" else "vcuda-v1.0.5")
    assert [n for n, present in out["exports"].items() if not present] == NEW + CUDA12
    assert out["real_before"] is None and out["real_after"] == str(pod.real_driver)
    assert out["version"] == [0, 13000]
    assert out["alloc"] == [0, 2]  # the second is past the 20 GiB quota: CUDA_ERROR_OUT_OF_MEMORY
    assert out["alloc_calls"] == [2, 1]
    assert out["mem_info"] == [0, 20 * GIB - (1 << 20), 20 * GIB]
    assert out["launch"] == [0, 1]
    assert out["registrations"].startswith("pid ")


def test_vcuda_master_look_up_hooks_by_requested_name(pods) -> None:
    """Its v1 cuGetProcAddress runs the init, asks the real driver, then swaps in its hook by the requested
    name: ("cuMemAlloc", 13000) gets the legacy hook, which calls the driver's pre-3.2 ABI."""
    out = layer_probe(
        pods["vcuda"],
        """
        r, fn = gpa(lib, "cuMemAlloc", 13000)
        out["legacy"] = [r, fn == addr(lib.cuMemAlloc)]
        ptr = c_ulonglong()
        out["call"] = ctypes.CFUNCTYPE(c_int, POINTER(c_ulonglong), c_ulonglong)(fn)(byref(ptr), 4096)
        r, fn = gpa(lib, "cuLibraryLoadData", 13000)
        drv = ctypes.CDLL(os.environ["POD_REAL_DRIVER"], mode=os.RTLD_NOLOAD)
        out["unknown_to_it"] = [r, fn == addr(drv.cuLibraryLoadData)]
        """,
    )
    assert out["legacy"] == [0, True]
    assert out["call"] == 201  # CUDA_ERROR_INVALID_CONTEXT, as measured under the real layer
    assert out["unknown_to_it"] == [0, True]


def test_vcuda_v105_look_up_forwards_unhooked_and_needs_the_init(pods) -> None:
    pod = pods["vcuda-v105"]
    before = _crash(
        pod, "import ctypes as c\np = c.c_void_p()\ncuda.cuGetProcAddress(b'cuInit', c.byref(p), 13000, 0)"
    )
    assert before.returncode == -6 and "cuGetProcAddress called through the empty table" in before.stderr
    out = layer_probe(
        pod,
        """
        lib.cuInit(0)
        r, fn = gpa(lib, "cuMemAlloc_v2", 13000)
        drv = ctypes.CDLL(os.environ["POD_REAL_DRIVER"], mode=os.RTLD_NOLOAD)
        out["unhooked"] = [r, fn == addr(drv.cuMemAlloc_v2)]  # the quota never sees these calls
        """,
    )
    assert out["unhooked"] == [0, True]


def test_vcuda_init_exits_without_its_config(pods, tmp_path) -> None:
    pod = podkit.build_pod(tmp_path, "vcuda", vcuda_config=False)
    done = _crash(pod, "cuda.cuInit(0)")
    assert done.returncode == 255 and "can't get config file path" in done.stderr
    assert not (pod.root / "etc/vcuda/registrations").exists()


def test_vcuda_nvml_is_the_layer(pods) -> None:
    """libnvidia-ml.so.1 is the same file: its nvmlInit_v2 runs the layer's init (the registration), then
    answers through the real NVML it opened."""
    pod = pods["vcuda"]
    out = run_child(
        pod,
        """
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
        out["init"] = nvml.nvmlInit_v2()
        count = c_uint()
        out["count"] = [nvml.nvmlDeviceGetCount_v2(byref(count)), count.value]
        out["registered"] = os.path.exists(os.environ["STANDIN_VCUDA_ROOT"] + "/etc/vcuda/registrations")
        out["is_layer"] = has(nvml, "standin_is_layer")
        """,
    )
    assert out == {"init": 0, "count": [0, 1], "registered": True, "is_layer": True}


def test_vcuda_fork_exports_the_cuda12_entry_points(pods) -> None:
    """The CUDA 12 fork (coldzerofear/vcuda-controller ec4dee1) exports what its CUDA 12.2 headers have: not
    cuTensorMapEncodeIm2colWide. Its look-up hands out the driver's pointer for a name it does not hook
    (test_standin_field_layers.py: what it does to the names it hooks)."""
    out = layer_probe(
        pods["vcuda-fork"],
        """
        lib.cuInit(0)
        drv = ctypes.CDLL(os.environ["POD_REAL_DRIVER"], mode=os.RTLD_NOLOAD)
        out["encode"] = tiled(addr(lib.cuTensorMapEncodeTiled))
        out["encode_calls"] = [counter(lib, "standin_layer_calls", "cuTensorMapEncodeTiled"),
                               counter(drv, "standin_driver_calls", "cuTensorMapEncodeTiled")]
        out["v2_unhooked"] = gpa2(lib, "cuTensorMapEncodeTiled") == [0, addr(drv.cuTensorMapEncodeTiled), 0]
        out["launch_ex"] = [lib.cuLaunchKernelEx(None, None, None, None),
                            counter(lib, "standin_layer_calls", "cuLaunchKernelEx")]
        """,
    )
    assert out["variant"] == "fork"
    missing = [n for n, present in out["exports"].items() if not present]
    assert missing == ["cuTensorMapEncodeIm2colWide", *CUDA12]
    assert out["encode"] == [0, expected_descriptor(7, 1, 0x1000, 4096, 1).hex()]
    assert out["encode_calls"] == [1, 1] and out["v2_unhooked"] is True and out["launch_ex"] == [0, 1]


def test_lupine_layer(pods) -> None:
    out = layer_probe(
        pods["lupine"],
        """
        out["gpa_encoder"] = gpa(lib, "cuTensorMapEncodeTiled")
        ptr = c_ulonglong(0xDEADBEEF)
        out["alloc"] = [lib.cuMemAlloc_v2(byref(ptr), c_ulonglong(1 << 20)), ptr.value,
                        counter(lib, "standin_layer_calls", "cuMemAlloc_v2")]
        out["libcuda_files"] = sorted(
            os.path.basename(line.split()[-1]) for line in open("/proc/self/maps") if "libcuda" in line)
        """,
    )
    assert out["variant"] == "standalone"
    assert [n for n, present in out["exports"].items() if not present] == LEGACY + NEW + CUDA12
    assert out["gpa_encoder"] == [0, None]
    assert out["alloc"] == [0, 0, 1]
    assert set(out["libcuda_files"]) == {"libcuda.so.1"}


def test_hami_preload_and_its_process_wide_dlsym(pods) -> None:
    pod = pods["hami"]
    state = pod.root / "tmp/vgpu-state"
    out = run_child(
        pod,
        """
        out["state_before"] = os.path.exists(os.environ["STANDIN_VGPU_STATE"])
        drv = ctypes.CDLL("libcuda.so.1")
        glob = ctypes.CDLL(None)
        out["preloaded"] = maps_count("libvgpu.so")
        # Its dlsym answers a look-up of a name it hooks, on any handle, with its hook.
        out["handle_lookup_is_vgpu"] = addr(drv.cuMemAlloc_v2) == addr(glob.cuMemAlloc_v2)
        out["state_after"] = os.path.exists(os.environ["STANDIN_VGPU_STATE"])
        ptr = c_ulonglong(0xDEADBEEF)
        out["alloc"] = [glob.cuMemAlloc_v2(byref(ptr), c_ulonglong(1 << 20)),
                        glob.cuMemAlloc_v2(byref(ptr), c_ulonglong(30 << 30))]
        free, total = c_ulonglong(), c_ulonglong()
        out["mem_info"] = [glob.cuMemGetInfo_v2(byref(free), byref(total)), total.value]
        out["calls"] = [counter(glob, "standin_vgpu_calls", "cuMemAlloc_v2"),
                        counter(drv, "standin_driver_calls", "cuMemAlloc_v2")]
        out["has_encoder"] = has(drv, "cuTensorMapEncodeTiled")
        """,
    )
    assert out["state_before"] is False and out["state_after"] is True and state.exists()
    assert out["preloaded"] == 1 and out["handle_lookup_is_vgpu"] is True
    assert out["alloc"] == [0, 2] and out["mem_info"] == [0, 20 * GIB]
    assert out["calls"] == [2, 1] and out["has_encoder"] is True


def test_nogpu_pod_has_no_libcuda(pods) -> None:
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
