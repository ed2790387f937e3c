"""The stand-ins of the other sharing layers found in the field (issue 26) behave as their sources at the
researched commits do where it matters to the guard: the CUDA 12 vCUDA fork's versioned look-up (a swap by
base name: the legacy ABI, CUDA_ERROR_INVALID_CONTEXT, a 5-argument caller's status never written),
vgpu-manager's preload entry and its exact-symbol look-up, nvshare's preload with and without its
scheduler's socket, KubeShare's hook on this glibc (loaded only in a subprocess of its own), and lupine's
client libcuda.so.1. Each pod is laid out under its own root: this machine's /etc/ld.so.preload is never
touched."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import podkit
import pytest
from podkit import expected_descriptor
from standin_child import GIB, child_env, dynsym, run_child, soname

INVALID_CONTEXT, NOT_SUPPORTED, OUT_OF_MEMORY = 201, 801, 2


@pytest.fixture(scope="module")
def field_pods(libs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, podkit.Pod]:
    base = tmp_path_factory.mktemp("field")
    pods = {kind: podkit.build_pod(base, kind) for kind in podkit.FIELD_KINDS}
    pods["nvshare-no-scheduler"] = podkit.build_pod(base, "nvshare", scheduler_socket=False)
    return pods


def test_the_machines_own_preload_is_never_touched(field_pods: dict[str, podkit.Pod]) -> None:
    machine = Path("/etc/ld.so.preload")
    text = machine.read_text() if machine.exists() else ""
    for name in ("libvgpu-control.so", "libnvshare.so", "libgemhook.so.1", "libvgpu.so"):
        assert name not in text
    pod = field_pods["vgpu-manager"]
    assert (pod.root / "etc/ld.so.preload").read_text() == podkit.VGPU_MANAGER_PRELOAD + "\n"


def test_field_layouts(libs: dict[str, Path], field_pods: dict[str, podkit.Pod]) -> None:
    for kind in podkit.FIELD_KINDS:
        pod = field_pods[kind]
        assert pod.env["TMAGUARD_ROOT"] == str(pod.root) and (pod.lib_dir / "libcuda.so.1").is_file()
    assert soname(field_pods["lupine-client"].lib_dir / "libcuda.so.1") == "libcuda.so.1"
    for kind in ("vgpu-manager", "nvshare", "kubeshare"):  # NVIDIA's libcuda.so.1 stays
        pod = field_pods[kind]
        assert (pod.lib_dir / "libcuda.so.1").read_bytes() == pod.real_driver.read_bytes()
    control = field_pods["vgpu-manager"].root / podkit.VGPU_MANAGER_PRELOAD.lstrip("/")
    assert soname(control) == "libvgpu-control.so" and "dlsym" in dynsym(control)
    assert field_pods["vgpu-manager"].env["LD_PRELOAD"] == str(control.resolve())
    assert field_pods["vgpu-manager"].env["CUDA_MEM_LIMIT_0"] == "8192m"
    nvshare = field_pods["nvshare"]
    assert (nvshare.root / podkit.NVSHARE_SOCKET).is_socket()
    assert not (field_pods["nvshare-no-scheduler"].root / podkit.NVSHARE_SOCKET).exists()
    assert soname(nvshare.root / podkit.NVSHARE_PRELOAD.lstrip("/")) == "libnvshare.so"
    # KubeShare as a debug copy sees it: the hook mounted, its variables, the preload taken out.
    kubeshare = field_pods["kubeshare"]
    hook = kubeshare.root / podkit.KUBESHARE_HOOK.lstrip("/")
    assert "LD_PRELOAD" not in kubeshare.env and kubeshare.env["POD_MANAGER_PORT"] == "50051"
    assert soname(hook) is None and {"__libc_dlopen_mode", "__libc_dlsym"} <= dynsym(hook, undefined=True)
    client = dynsym(libs["layer_lupine_client"])
    assert {"cuTensorMapEncodeTiled", "cuGetProcAddress_v2", "cuLaunchKernelEx", "dlsym"} <= client
    assert {"lupine_checkpoint_drain_cuda_calls", "lupine_checkpoint_resume_cuda_calls"} <= client
    others = {"cuTensorMapEncodeIm2col", "cuTensorMapEncodeIm2colWide", "cuTensorMapReplaceAddress"}
    assert not others & client


def test_vcuda_fork_swaps_its_hook_in_by_base_name(libs: dict[str, Path], tmp_path: Path) -> None:
    """ec4dee1's cuGetProcAddress_v2 asks the driver (which writes the pointer and the status), then swaps in
    the hook of the requested base name: ("cuMemAlloc", 13000) gets its legacy cuMemAlloc, which calls the
    driver's pre-3.2 ABI (CUDA_ERROR_INVALID_CONTEXT under a current context); ("cuGetProcAddress", 12000)
    gets its 4-argument v1 hook, which never writes a 5-argument caller's status."""
    pod = podkit.build_pod(tmp_path, "vcuda-fork", cc="9.0")
    out = run_child(
        pod,
        """
        lib = ctypes.CDLL("libcuda.so.1")
        lib.standin_layer_real_driver.restype = c_char_p
        out["before_init"] = lib.standin_layer_real_driver() is None
        r, fn, status = gpa2(lib, "cuMemAlloc", 13000)  # runs the layer's init, as the real one does
        drv = ctypes.CDLL(os.environ["REAL"], mode=os.RTLD_NOLOAD)  # opened by that init
        out["legacy"] = [r, status, fn == addr(lib.cuMemAlloc)]
        ptr = c_ulonglong()
        out["alloc"] = ctypes.CFUNCTYPE(c_int, POINTER(c_ulonglong), c_ulonglong)(fn)(byref(ptr), 4096)
        out["calls"] = [counter(lib, "standin_layer_calls", "cuMemAlloc"),
                        counter(lib, "standin_layer_calls", "cuMemAlloc_v2"),
                        counter(drv, "standin_driver_calls", "cuMemAlloc")]
        r, fn, status = gpa2(lib, "cuGetProcAddress", 12000)
        out["v1_for_v2"] = fn == addr(lib.cuGetProcAddress)
        p, status = c_void_p(), c_int(-7)
        out["v1_status"] = [GPA2(fn)(b"cuInit", byref(p), 12000, 0, byref(status)), status.value]
        out["own_helpers"] = [has(lib, "g_vcuda_config"), has(lib, "search_on_pids_table")]
        """,
        extra={"REAL": str(pod.real_driver)},
    )
    assert out["before_init"] is True
    assert out["legacy"] == [0, 0, True]  # CUDA_SUCCESS and CU_GET_PROC_ADDRESS_SUCCESS: the driver's
    assert out["alloc"] == INVALID_CONTEXT and out["calls"] == [1, 0, 1]
    assert out["v1_for_v2"] is True and out["v1_status"] == [0, -7]
    assert out["own_helpers"] == [True, True]


def test_vgpu_manager_hands_out_its_export_of_the_exact_symbol(field_pods: dict[str, podkit.Pod]) -> None:
    """Its dlsym answers every cu* name it exports on any handle; its cuGetProcAddress_v2 finds which exact
    symbol the driver chose and hands out its own export of it; memory is metered against CUDA_MEM_LIMIT_0,
    cuMemCreate included."""
    out = run_child(
        field_pods["vgpu-manager"],
        """
        GIB = 1 << 30
        drv = ctypes.CDLL("libcuda.so.1")
        glob = ctypes.CDLL(None)
        out["preloaded"] = maps_count("libvgpu-control.so")
        out["handle_is_its"] = addr(drv.cuMemAlloc_v2) == addr(glob.cuMemAlloc_v2)
        r, fn, status = gpa2(drv, "cuMemAlloc", 13000)
        out["exact"] = [r, status, fn == addr(glob.cuMemAlloc_v2)]
        alloc = ctypes.CFUNCTYPE(c_int, POINTER(c_ulonglong), c_ulonglong)(fn)
        ptr = c_ulonglong()
        out["alloc"] = [alloc(byref(ptr), 4 * GIB), alloc(byref(ptr), 5 * GIB)]
        handle = c_ulonglong()
        out["create"] = glob.cuMemCreate(byref(handle), c_ulonglong(5 * GIB), None, 0)
        free, total = c_ulonglong(), c_ulonglong()
        out["info"] = [glob.cuMemGetInfo_v2(byref(free), byref(total)), free.value, total.value]
        out["calls"] = {n: counter(glob, "standin_vgpu_manager_calls", n)
                        for n in ("cuMemAlloc_v2", "cuMemCreate", "cuGetProcAddress_v2")}
        """,
    )
    assert out["preloaded"] == 1 and out["handle_is_its"] is True
    assert out["exact"] == [0, 0, True]
    assert out["alloc"] == [0, OUT_OF_MEMORY] and out["create"] == OUT_OF_MEMORY  # 8 GiB: 4 used, 5 refused
    assert out["info"] == [0, 4 * GIB, 8 * GIB]
    assert out["calls"] == {"cuMemAlloc_v2": 2, "cuMemCreate": 1, "cuGetProcAddress_v2": 1}


def test_nvshare_without_its_scheduler_dies_at_the_first_cuda_call(field_pods: dict[str, podkit.Pod]) -> None:
    """No constructor: loading it is harmless. The first cuInit starts the client thread, which cannot
    connect, prints nvshare's two lines and exits the process from that thread."""
    pod = field_pods["nvshare-no-scheduler"]
    loaded = run_child(pod, 'out["preloaded"] = maps_count("libnvshare.so")')
    assert loaded == {"preloaded": 1}
    done = _python(pod, "import ctypes\nctypes.CDLL('libcuda.so.1').cuInit(0)\nprint('after cuInit')")
    socket = pod.root / podkit.NVSHARE_SOCKET
    assert done.returncode == 1 and "after cuInit" not in done.stdout
    assert f"[NVSHARE][INFO]: Failed to connect to UNIX socket at {socket}" in done.stderr
    assert "[NVSHARE][FATAL]: Condition failed: nvshare_connect(&rsock, nvscheduler_socket_path) == 0" in (
        done.stderr
    )


def test_nvshare_with_its_scheduler(field_pods: dict[str, podkit.Pod]) -> None:
    """Its scheduler up: cuMemAlloc becomes managed memory, cuMemGetInfo says the total less 1.5 GiB is
    free, the hooked cuLaunchKernel synchronises the context every 1, 2, 4... launches, and what skips its
    lock (cuLaunchKernelEx) is never counted."""
    pod = field_pods["nvshare"]
    path = pod.root / podkit.NVSHARE_SOCKET
    path.unlink()
    with podkit.bind_socket(path):
        out = run_child(
            pod,
            """
            drv = ctypes.CDLL("libcuda.so.1")
            glob = ctypes.CDLL(None)
            out["init"] = glob.cuInit(0)
            r, fn, status = gpa2(glob, "cuLaunchKernel", 13000)
            out["hook"] = fn == addr(glob.cuLaunchKernel)
            launch = ctypes.CFUNCTYPE(c_int, *[c_void_p] + [c_uint] * 7 + [c_void_p] * 3)(fn)
            out["launches"] = [launch(None, 1, 1, 1, 1, 1, 1, 0, None, None, None) for _ in range(7)]
            out["ex"] = drv.cuLaunchKernelEx(None, None, None, None)
            ptr, free, total = c_ulonglong(), c_ulonglong(), c_ulonglong()
            out["alloc"] = glob.cuMemAlloc_v2(byref(ptr), c_ulonglong(1 << 20))
            out["info"] = [glob.cuMemGetInfo_v2(byref(free), byref(total)), total.value - free.value]
            out["counts"] = {n: counter(glob, "standin_nvshare_calls", n)
                             for n in ("cuLaunchKernel", "syncs", "managed")}
            """,
        )
    assert out["init"] == 0 and out["hook"] is True and out["launches"] == [0] * 7 and out["ex"] == 0
    assert out["alloc"] == 0 and out["info"] == [0, 1536 << 20]
    assert out["counts"] == {"cuLaunchKernel": 7, "syncs": 3, "managed": 1}  # after launches 1, 3 and 7


def test_kubeshare_hook_kills_every_process_on_this_glibc(field_pods: dict[str, podkit.Pod]) -> None:
    """Preloaded (in this test's own subprocess only), the hook needs __libc_dlopen_mode, which glibc 2.34+
    no longer exports: the process stops at start-up, status 127, before any of its code runs."""
    hook = field_pods["kubeshare"].root / podkit.KUBESHARE_HOOK.lstrip("/")
    env = {"LD_PRELOAD": str(hook), "PATH": os.environ["PATH"]}
    done = subprocess.run(["/bin/true"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 127
    assert f"/bin/true: symbol lookup error: {hook}: undefined symbol: __libc_dlopen_mode" in done.stderr


def test_lupine_client_forwards_the_tiled_encoder_only(field_pods: dict[str, podkit.Pod]) -> None:
    """lupine 7fbd364's client: the tiled encoder is a round trip to its server; a name it does not know
    gets a stub answering CUDA_ERROR_NOT_SUPPORTED, reported as found; a launch with `extra` is refused."""
    out = run_child(
        field_pods["lupine-client"],
        """
        lib = ctypes.CDLL("libcuda.so.1")
        lib.standin_lupine_round_trips.restype = c_longlong
        out["encode"] = tiled(addr(lib.cuTensorMapEncodeTiled))
        r, fn, status = gpa2(lib, "cuTensorMapEncodeIm2col", 13000)
        out["im2col"] = [r, status, ctypes.CFUNCTYPE(c_int)(fn)()]
        r, fn, status = gpa2(lib, "cuTensorMapEncodeTiled", 13000)
        out["tiled_is_its"] = fn == addr(lib.cuTensorMapEncodeTiled)
        extra = (c_void_p * 1)()
        out["extra"] = lib.cuLaunchKernel(*([None] + [1] * 6 + [0, None, None, extra]))
        out["plain"] = lib.cuLaunchKernel(*([None] + [1] * 6 + [0, None, None, None]))
        out["round_trips"] = lib.standin_lupine_round_trips()
        """,
    )
    assert out["encode"] == [0, expected_descriptor(7, 1, 0x1000, 4096, 1).hex()]
    assert out["im2col"] == [0, 0, NOT_SUPPORTED] and out["tiled_is_its"] is True
    assert out["extra"] == NOT_SUPPORTED and out["plain"] == 0 and out["round_trips"] == 1


def _python(pod: podkit.Pod, code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], env=child_env(pod), capture_output=True, text=True, timeout=30
    )
