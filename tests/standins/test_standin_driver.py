"""The real-driver stand-in: its entry points, the descriptor its encoders write, its cuGetProcAddress."""

from __future__ import annotations

import podkit
from podkit import expected_descriptor
from standin_child import (
    BASIC,
    NEW,
    L,
    run_child,
)


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
