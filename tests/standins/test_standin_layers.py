"""The vCUDA-like layers (upstream, fork, no-forward), lupine, HAMi's preload and the no-GPU pod."""

from __future__ import annotations

import ctypes.util
import textwrap

import podkit
import pytest
from podkit import expected_descriptor
from standin_child import (
    BASIC,
    NEW,
    L,
    run_child,
)

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
