"""Whether the NVIDIA driver can run the CUDA runtime torch and vLLM were built for (runtime_cuda.too_old, a
pure function), at the boundaries of NVIDIA's driver table, and the versions read from the real files of the
test environment (torch/version.py as text, vLLM's extensions' NEEDED libcudart.so.<major>)."""

from __future__ import annotations

import os

import pytest

from vllm_tmaguard import codes
from vllm_tmaguard.process import find_package_dir
from vllm_tmaguard.stages.runtime_cuda import (
    CudaBuild,
    cudart_major,
    forward_compatible,
    parse_torch_cuda,
    read_build,
    too_old,
)
from vllm_tmaguard.stages.vllm_probe import probe_vllm

CUDA_13 = CudaBuild((13, 0), "torch/version.py", 13, "vllm/_C_stable_libtorch.abi3.so")
CUDA_12 = CudaBuild((12, 9), "torch/version.py", 12, "vllm/_C.abi3.so")
H100, RTX_4090 = ("NVIDIA H100 80GB HBM3",), ("NVIDIA GeForce RTX 4090",)


@pytest.mark.parametrize(
    ("driver", "build", "needed"),
    [
        ("580.65.06", CUDA_13, None),  # CUDA 13.0's first driver
        ("580.65.05", CUDA_13, "580.65.06"),
        ("580.159.04", CUDA_13, None),
        ("590.44.01", CUDA_13, None),
        ("575.57.08", CUDA_13, "580.65.06"),
        ("535.54.03", CUDA_13, "580.65.06"),
        ("470.57.02", CUDA_13, "580.65.06"),
        ("525.60.13", CUDA_12, None),  # minor version compatibility: any 12.x runtime from R525 on
        ("525.60.12", CUDA_12, "525.60.13"),
        ("535.54.03", CUDA_12, None),
        ("470.57.02", CUDA_12, "525.60.13"),
        ("470.57.02", CudaBuild((11, 8)), None),  # CUDA 11.x runs from 450.80.02
        ("450.80.01", CudaBuild((11, 8)), "450.80.02"),
        ("535.54.03", CudaBuild((12, 4), vllm=13), "580.65.06"),  # the newer runtime decides
        ("535.54.03", CudaBuild(vllm=13), "580.65.06"),  # torch unknown (a CPU build, unreadable)
        ("535.54.03", CudaBuild(), None),  # nothing known: no verdict
        ("bogus", CUDA_13, None),
    ],
)
def test_the_driver_each_cuda_runtime_needs(driver: str, build: CudaBuild, needed: str | None) -> None:
    problem = too_old(driver, None, build, H100, "0.32.0")
    if needed is None:
        assert problem is None
        return
    assert problem is not None and problem.code == codes.DRIVER_TOO_OLD
    assert problem.cause.startswith(f"NVIDIA driver {driver} ") and f" {needed} or newer" in problem.cause
    assert problem.fix.startswith(f"upgrade the node's NVIDIA driver to {needed} or newer")
    assert "CUDA initialisation" in problem.consequence and problem.subject == "/proc/driver/nvidia/version"


def test_the_cause_names_both_builds_and_what_the_driver_runs() -> None:
    problem = too_old("470.57.02", None, CUDA_13, H100)
    assert problem is not None
    assert problem.cause == (
        "NVIDIA driver 470.57.02 (up to CUDA 11.4); torch (CUDA 13.0) and vLLM (libcudart.so.13) need "
        "580.65.06 or newer"
    )
    assert problem.code in codes.CUDA_BROKEN and problem.code in codes.LOGGED_AS_ERROR


@pytest.mark.parametrize(
    ("driver", "cu129"),
    [
        ("535.54.03", True),
        ("525.60.13", True),
        ("575.57.08", True),
        ("525.60.12", False),
        ("470.57.02", False),
    ],
)
def test_vllms_cuda_12_9_build_is_offered_on_r525_to_r575(driver: str, cu129: bool) -> None:
    problem = too_old(driver, None, CUDA_13, H100, "0.32.0")
    assert problem is not None
    assert ("vLLM 0.32.0's CUDA 12.9 build" in problem.fix) == cu129


@pytest.mark.parametrize(
    ("gpus", "offered", "refused"),
    [
        (H100, "the cuda-compat-13-0 package's libcuda.so.1", None),
        (("NVIDIA A100-SXM4-80GB", "Tesla T4"), "cuda-compat-13-0", None),
        (RTX_4090, None, "does not run on NVIDIA GeForce RTX 4090: CUDA fails with error 804"),
        ((*H100, *RTX_4090), None, "does not run on NVIDIA GeForce RTX 4090"),
        ((), "(the cuda-compat package), on data-center GPUs only", None),
    ],
)
def test_forward_compatibility_only_on_data_center_gpus(gpus, offered, refused) -> None:
    problem = too_old("535.54.03", None, CUDA_13, gpus)
    assert problem is not None
    if offered:
        assert offered in problem.fix and "804" not in problem.fix
    else:
        assert refused in problem.fix and "cuda-compat-13" not in problem.fix


@pytest.mark.parametrize(
    ("name", "compatible"),
    [
        ("NVIDIA H100 80GB HBM3", True),
        ("NVIDIA L40S", True),
        ("Tesla T4", True),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", True),
        ("NVIDIA GeForce RTX 4090", False),
        ("NVIDIA RTX A6000", False),
        ("NVIDIA TITAN V", False),
        ("Quadro RTX 8000", False),
    ],
)
def test_which_gpus_run_forward_compatibility(name: str, compatible: bool) -> None:
    assert forward_compatible(name) is compatible


def test_a_forward_compatibility_driver_counts_where_the_gpu_runs_it() -> None:
    """The runtime asks libcuda.so.1, not the kernel module: cuda-compat's 580 library over an R535 module
    runs CUDA 13 on a data-center GPU, and fails with 804 on a GeForce card."""
    assert too_old("535.54.03", "580.65.06", CUDA_13, H100) is None
    problem = too_old("535.54.03", "580.65.06", CUDA_13, RTX_4090, "0.32.0")
    assert problem is not None and "804" in problem.consequence
    assert (
        "forward-compatibility driver 580.65.06" in problem.cause and "RTX 4090 cannot run" in problem.cause
    )
    assert problem.fix.startswith("upgrade the node's NVIDIA driver to 580.65.06") and "cuda-compat" not in (
        problem.fix
    )
    on_new_driver = too_old("580.95.05", "590.44.01", CUDA_13, RTX_4090)
    assert on_new_driver is not None
    assert (
        on_new_driver.fix
        == "take the cuda-compat libcuda.so.1 out of the image: driver 580.95.05 runs CUDA 13"
    )
    too_old_compat = too_old("470.57.02", "575.57.08", CUDA_13, H100)
    assert (
        too_old_compat is not None and "forward-compatibility libcuda.so.1 575.57.08" in too_old_compat.cause
    )


@pytest.mark.parametrize(
    ("text", "cuda"),
    [
        ("__version__ = '2.13.0+cu130'\ndebug = False\ncuda: Optional[str] = '13.0'\n", (13, 0)),
        ("__version__ = '2.5.1+cu124'\ncuda = '12.4'\n", (12, 4)),
        ("__version__ = '2.5.1+cpu'\ncuda: Optional[str] = None\n", None),
        ("git_version = 'cuda = 12.1'\n", None),
    ],
)
def test_torch_cuda_from_version_py(text: str, cuda: tuple[int, int] | None) -> None:
    assert parse_torch_cuda(text) == cuda


def test_cudart_major_from_needed() -> None:
    assert cudart_major(("libcudart.so.13", "libcuda.so.1")) == 13
    assert cudart_major(("libcudart.so.11.0",)) == 11
    assert cudart_major(("libcuda.so.1", "libtorch_cuda.so")) is None


def test_the_test_environments_builds_are_read_from_their_files() -> None:
    """torch 2.13.0+cu130 and vLLM 0.32.0 (libcudart.so.13): read without importing either."""
    vllm = probe_vllm()
    build = read_build(vllm.package_dir, tuple(e.path for e in vllm.extensions))
    assert build.torch == (13, 0) and build.torch_file == os.path.join(
        find_package_dir("torch"), "version.py"
    )
    assert build.vllm == 13 and build.vllm_file is not None and build.vllm_file.endswith(".abi3.so")
