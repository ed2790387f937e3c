"""Build outputs and pod layout: the stand-ins' names and exports, and each pod kind's files."""

from __future__ import annotations

import os
from pathlib import Path

import podkit
import pytest
from standin_child import (
    BASIC,
    CUDA12,
    LEGACY,
    NEW,
    NVML_REQUIRED,
    L,
    dynsym,
    readelf_dynamic,
    run_child,
    soname,
)

from vllm_tmaguard.stages.memory import vcuda_limit


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
        "layer_v105": "libcuda-control.so",
        "layer_standalone": "libcuda.so.1",
        "nvml": "libnvidia-ml.so.1",
    }
    for name, want in expected_soname.items():
        assert soname(libs[name]) == want, name

    driver = dynsym(libs["driver"])
    assert set(L + BASIC + NEW) <= driver
    assert {"standin_driver_calls", "standin_is_real_driver"} <= driver

    master = dynsym(libs["layer"])
    assert set(L + BASIC + LEGACY) | {"standin_layer_calls", "standin_is_layer"} <= master
    assert not set(NEW + CUDA12) & master
    assert dynsym(libs["layer_v105"]) == master  # the same exports; its v1 look-up differs
    # The fork (ec4dee1) adds the CUDA 12 names of its headers (12.2: no cuTensorMapEncodeIm2colWide), its
    # config block and its own helpers.
    fork_only = {"cuLaunchKernelEx_ptsz", "g_vcuda_config", "search_on_pids_table"}
    assert dynsym(libs["layer_fork"]) == (master | set(NEW) | fork_only) - {"cuTensorMapEncodeIm2colWide"}
    # NVML is the same file in a vCUDA pod: the layer exports what vLLM and torch ask NVML for.
    assert {"nvmlInit_v2", "nvmlDeviceGetCudaComputeCapability", "nvmlDeviceGetName"} <= master
    assert set(L + BASIC) <= dynsym(libs["layer_standalone"])
    # Only entry points and test helpers are exported (the guard reads .dynsym).
    assert {s for s in master if not s.startswith(("cu", "nvml", "standin_"))} == set()

    assert set(NVML_REQUIRED) <= dynsym(libs["nvml"])
    assert dynsym(libs["vgpu"]) == {
        "cuMemAlloc_v2",
        "cuMemGetInfo_v2",
        "cuLaunchKernel",
        "dlsym",
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
    proc = pod.root / "proc/driver/nvidia"
    assert f"Kernel Module  {podkit.DEFAULT_DRIVER} " in (proc / "version").read_text()
    assert "Model: \t\t NVIDIA GeForce RTX 4090" in (proc / "gpus/0000:01:00.0/information").read_text()
    assert (pod.root / "dev/nvidia0").exists()
    assert pod.env["STANDIN_NVML_CC"] == "8.9"
    assert pod.env["STANDIN_NVML_DRIVER"] == podkit.DEFAULT_DRIVER
    assert pod.env["STANDIN_NVML_COUNT"] == "1"

    if kind == "lupine":
        assert pod.real_driver is None
        assert pod.env["LUPINE_SERVER"] == "127.0.0.1:9999"
        assert soname(cuda1) == "libcuda.so.1"
        assert not list(pod.lib_dir.glob("libcuda.so.*.*"))
        return

    assert pod.real_driver == pod.lib_dir / f"libcuda.so.{podkit.DEFAULT_DRIVER}"
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
        control = (pod.lib_dir / "libcuda-control.so").stat().st_ino
        for name in ("libcuda.so.1", "libcuda.so", "libnvidia-ml.so.1", "libnvidia-ml.so"):
            assert (pod.lib_dir / name).stat().st_ino == control, name
        assert soname(pod.lib_dir / f"libnvidia-ml.so.{podkit.DEFAULT_DRIVER}") == "libnvidia-ml.so.1"
        config = (pod.root / "etc/vcuda/vcuda.config").read_bytes()  # vCUDA's resource_data_t
        assert vcuda_limit(config) == podkit.VCUDA_QUOTA
        assert all(p.is_file() for p in vcuda_files)
        assert os.access(vcuda_files[1], os.X_OK)
        assert pod.env["STANDIN_VCUDA_ROOT"] == str(pod.root)
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
        "out['init'] = lib.cuInit(0)\n"
        "out['real'] = lib.standin_layer_real_driver().decode()",
    )
    assert out == {"init": 0, "real": str(a.real_driver)}  # the layer opens libcuda.so.<driver> at init
    with pytest.raises(ValueError):
        podkit.build_pod(tmp_path, "no-such-kind")
