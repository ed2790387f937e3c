"""The NVML stand-in: defaults, the environment it reads, failures and hangs, pynvml, vLLM's detection."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import podkit
import pytest
from standin_child import GIB, PRELUDE, child_env, run_child

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
    assert out["driver"] == podkit.DEFAULT_DRIVER
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
