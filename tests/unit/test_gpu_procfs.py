"""The GPUs from the NVIDIA kernel module's files (gpu.py), never NVML: text as the 580 driver writes it."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_tmaguard.stages.gpu import capability_of, cuda_version_of_driver, parse_driver_version, probe_gpus

VERSION = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (dvs-builder@U16)\n"
    "GCC version:  gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04)\n"
)
INFORMATION = (
    "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 0\nGPU UUID: \t GPU-7d0c\nVideo BIOS: \t 96.00.99.00.01\n"
    "Bus Type: \t PCIe\nDMA Size: \t 52 bits\nBus Location: \t 0000:{bus}:00.0\nDevice Minor: \t {minor}\n"
)


def _node(root: Path, gpus: dict[str, int], given: set[int]) -> None:
    """A node's module files for `gpus` (bus -> minor); the pod's /dev holds only the `given` minors."""
    proc = root / "proc/driver/nvidia"
    proc.mkdir(parents=True)
    (proc / "version").write_text(VERSION)
    for bus, minor in gpus.items():
        (proc / f"gpus/0000:{bus}:00.0").mkdir(parents=True)
        (proc / f"gpus/0000:{bus}:00.0/information").write_text(INFORMATION.format(bus=bus, minor=minor))
    (root / "dev").mkdir()
    for minor in given:
        (root / f"dev/nvidia{minor}").touch()


def test_only_the_gpus_the_pod_was_given(tmp_path: Path) -> None:
    _node(tmp_path, {"18": 0, "2a": 1, "3a": 2}, given={1})
    facts = probe_gpus(str(tmp_path))
    assert [(g.name, g.compute_capability, g.bus_id) for g in facts.gpus] == [
        ("NVIDIA H100 80GB HBM3", (9, 0), "0000:2a:00.0")
    ]
    assert (facts.driver_version, facts.cuda_driver_version) == ("580.159.04", 13000)


def test_no_kernel_module_is_no_gpu_with_a_reason(tmp_path: Path) -> None:
    facts = probe_gpus(str(tmp_path))
    assert not facts.present and "/proc/driver/nvidia/version" in facts.error


@pytest.mark.parametrize(
    ("name", "capability"),
    [
        ("NVIDIA H100 80GB HBM3", (9, 0)),
        ("NVIDIA H200", (9, 0)),
        ("NVIDIA H20", (9, 0)),
        ("NVIDIA GH200 480GB", (9, 0)),
        ("NVIDIA GeForce RTX 4090", (8, 9)),
        ("NVIDIA RTX 6000 Ada Generation", (8, 9)),
        ("NVIDIA L40S", (8, 9)),
        ("NVIDIA A100-SXM4-80GB", (8, 0)),
        ("NVIDIA A10G", (8, 6)),
        ("NVIDIA B200", (10, 0)),
        ("NVIDIA GeForce RTX 5090", (12, 0)),
        ("Tesla T4", (7, 5)),
        ("Tesla V100-SXM2-32GB", (7, 0)),
        ("NVIDIA Graphics Device", None),
    ],
)
def test_capability_of_the_model_name(name: str, capability: tuple[int, int] | None) -> None:
    assert capability_of(name) == capability


@pytest.mark.parametrize(
    ("driver", "cuda"),
    [
        ("580.159.04", 13000), ("580.65.06", 13000), ("580.65.05", 12090), ("550.142", 12040),
        ("535.54.03", 12020), ("525.60.13", 12000), ("525.60.12", 11080), ("470.57.02", 11040),
        ("470.42.01", 11040), ("470.42.00", 11030), ("450.51.05", 11000), ("bogus", None), ("1.2.3.4", None),
    ],
)  # fmt: skip
def test_cuda_version_of_the_driver(driver: str, cuda: int | None) -> None:
    assert cuda_version_of_driver(driver) == cuda


def test_driver_version_from_the_nvrm_line() -> None:
    assert parse_driver_version(VERSION) == "580.159.04"
    assert parse_driver_version("GCC version: 13.3.0\n") is None
