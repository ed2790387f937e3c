"""Layer labels from passive evidence, as a table (layers.py): a layer is named only on evidence from the
library answering libcuda.so.1 or from what the loader preloads; files and variables alone name nothing."""

from __future__ import annotations

import pytest
from facts_kit import REAL_DRIVER, VCUDA

from vllm_tmaguard.elf import EM_X86_64, ElfInfo
from vllm_tmaguard.layers import LABELS, PodEvidence, detect_layers

VCUDA_FILES = frozenset({"/etc/vcuda", "/usr/local/nvidia/bin/gpu-client"})
FORK = VCUDA | {"cuGetProcAddress_v2", "cuTensorMapEncodeTiled", "cuTensorMapEncodeIm2col",
                "cuTensorMapEncodeIm2colWide", "cuTensorMapReplaceAddress"}  # fmt: skip


def libcuda(defined: frozenset[str], soname: str | None = "libcuda.so.1") -> ElfInfo:
    return ElfInfo("/usr/local/nvidia/lib64/libcuda.so.1", EM_X86_64, soname, (), defined, frozenset())


def evidence(lib: ElfInfo | None, paths=frozenset(), preload=(), environ=None) -> PodEvidence:
    return PodEvidence(frozenset(paths), tuple(preload), environ or {}, lib)


CASES = {
    "bare driver": (evidence(libcuda(REAL_DRIVER)), None, []),
    "bare driver in an image that once had vCUDA files": (
        evidence(libcuda(REAL_DRIVER), VCUDA_FILES), None, [],
    ),
    "vCUDA master": (
        evidence(libcuda(VCUDA, "libcuda-control.so"), VCUDA_FILES), 12080, ["vcuda"],
    ),
    "vCUDA fork exporting the CUDA 12 entry points": (
        evidence(libcuda(FORK, "libcuda-control.so")), None, ["vcuda-fork"],
    ),
    "HAMi-core preloaded": (
        evidence(libcuda(REAL_DRIVER), {"/usr/local/vgpu"}, ["/usr/local/vgpu/libvgpu.so"],
                 {"CUDA_DEVICE_MEMORY_LIMIT_0": "20g"}),
        None, ["hami"],
    ),
    "HAMi's limits without its preload": (
        evidence(libcuda(REAL_DRIVER), {"/usr/local/vgpu"}, [], {"CUDA_DEVICE_MEMORY_LIMIT_0": "20g"}),
        None, [],
    ),
    "a layer nobody knows": (evidence(libcuda(VCUDA - {"g_vcuda_config"})), 13000, ["unrecognized"]),
    "an old driver under an old kernel module": (evidence(libcuda(VCUDA - {"g_vcuda_config"})), 11080, []),
    "network layer": (evidence(libcuda(VCUDA - {"g_vcuda_config"}), environ={"LUPINE_SERVER": "x:1"}), None,
                      ["lupine"]),
}  # fmt: skip


@pytest.mark.parametrize("name", CASES)
def test_layers(name: str) -> None:
    pod, cuda, expected = CASES[name]
    layers = detect_layers(pod, cuda)
    assert [layer.name for layer in layers] == expected
    assert all(layer.evidence and layer.label == LABELS[layer.name] for layer in layers)


def test_every_label_says_what_the_layer_is() -> None:
    assert LABELS["vcuda-fork"].startswith("a vCUDA fork") and "unrecognized" in LABELS["unrecognized"]
