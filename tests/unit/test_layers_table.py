"""Layer labels from passive evidence, as a table (layers.py): a layer is named only on evidence from the
library answering libcuda.so.1 or from what the loader preloads; files and variables alone name nothing."""

from __future__ import annotations

import pytest
from facts_kit import REAL_DRIVER, VCUDA

from vllm_tmaguard.stages import metering
from vllm_tmaguard.stages.elf import EM_X86_64, ElfInfo
from vllm_tmaguard.stages.layers import LABELS, Layer, PodEvidence, detect_layers, gather_evidence

VCUDA_FILES = frozenset({"/etc/vcuda", "/usr/local/nvidia/bin/gpu-client"})
HAMI = "/usr/local/vgpu/libvgpu.so"
# The variables each system sets, as their sources set them (docs/research/sharing_layers_2026.md).
KAI_FRACTION = {"GPU_PORTION": "0.5", "RUNAI_NUM_OF_GPUS": "0.5", "NVIDIA_VISIBLE_DEVICES": "GPU-1"}
TOOLKIT_LIMIT = {"NVIDIA_GPU_MEMORY_REQUEST": "4096", "NVIDIA_GPU_MEMORY_LIMIT": "8192"}
TF_LIMITER = "/tensor-fusion-limiter/libcuda_limiter.so"
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
    "TensorFusion's soft limiter preloaded": (
        evidence(libcuda(REAL_DRIVER), preload=[TF_LIMITER], environ={"TF_ISOLATION_MODE": "soft"}),
        None, ["tensor-fusion"],
    ),
    "TensorFusion's variable without its limiter": (
        evidence(libcuda(REAL_DRIVER), environ={"TF_ISOLATION_MODE": "soft"}), None, [],
    ),
    "a KAI fraction, memory not enforced": (evidence(libcuda(REAL_DRIVER), environ=KAI_FRACTION), None,
                                            ["kai-fraction"]),
    "a KAI fraction under its HAMi-core isolator": (
        evidence(libcuda(REAL_DRIVER), {"/usr/local/vgpu"}, [HAMI], {
            **KAI_FRACTION, "CUDA_DEVICE_MEMORY_LIMIT": "7680m", "CONTAINER_VGPU_MOUNT": "/usr/local/vgpu"}),
        None, ["hami"],
    ),
    "GPU_PORTION without KAI's other variable": (
        evidence(libcuda(REAL_DRIVER), environ={"GPU_PORTION": "0.5"}), None, [],
    ),
    "the NVIDIA toolkit's memory limit": (evidence(libcuda(REAL_DRIVER), environ=TOOLKIT_LIMIT), None,
                                          ["nvidia-memory-limit"]),
    "KAI NvFractions (MPS and the toolkit's limit, plural names)": (
        evidence(libcuda(REAL_DRIVER), environ={
            **KAI_FRACTION, "NVIDIA_GPU_MEMORY_REQUESTS": "4096", "NVIDIA_GPU_MEMORY_LIMITS": "8192",
            "CUDA_MPS_PIPE_DIRECTORY": "/run/nvidia-mps"}),
        None, ["mps", "nvidia-memory-limit"],
    ),
    "a toolkit limit without a request (its hook applies nothing)": (
        evidence(libcuda(REAL_DRIVER), environ={"NVIDIA_GPU_MEMORY_LIMIT": "8192"}), None, [],
    ),
    "an LD_AUDIT library": (
        evidence(libcuda(REAL_DRIVER), environ={"LD_AUDIT": "/opt/hook/libaudit.so:"}), None, ["ld-audit"],
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", CASES)
def test_layers(name: str) -> None:
    pod, cuda, expected = CASES[name]
    layers = detect_layers(pod, cuda)
    assert [layer.name for layer in layers] == expected
    assert all(layer.evidence and layer.label == LABELS[layer.name] for layer in layers)


def test_every_label_says_what_the_layer_is() -> None:
    assert LABELS["vcuda-fork"].startswith("a vCUDA fork") and "unrecognized" in LABELS["unrecognized"]


# HAMi-core named by its preload; who injected it, from the variables each injector sets.
INJECTED = {
    "HAMi's device plugin": (
        {"CUDA_DEVICE_MEMORY_LIMIT_0": "20480m", "CUDA_DEVICE_SM_LIMIT": "50",
         "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/usr/local/vgpu/4c5e.cache"},
        "injected by HAMi's device plugin",
    ),
    "HAMi's DRA driver": (
        {"CUDA_DEVICE_MEMORY_LIMIT_0": "20480m", "CUDA_DEVICE_SM_LIMIT_0": "60",
         "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/usr/local/vgpu/claims/9d1f/4c5e.cache"},
        "injected by HAMi's DRA driver (CDI)",
    ),
    "KAI's resource isolator": (
        {"CUDA_DEVICE_MEMORY_LIMIT": "7680m", "CONTAINER_VGPU_MOUNT": "/usr/local/vgpu", "POD_UID": "u"},
        "injected by KAI Scheduler's resource isolator (its webhook)",
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", INJECTED)
def test_hami_says_who_injected_it(name: str) -> None:
    environ, said = INJECTED[name]
    (hami,) = detect_layers(evidence(libcuda(REAL_DRIVER), {"/usr/local/vgpu"}, [HAMI], environ))
    assert hami.name == "hami" and hami.evidence[0] == f"preloads {HAMI}" and hami.evidence[-1] == said


def test_hami_without_an_injectors_variables_says_none() -> None:
    (hami,) = detect_layers(evidence(libcuda(REAL_DRIVER), (), [HAMI], {"CUDA_DEVICE_MEMORY_LIMIT": "1g"}))
    assert not any(e.startswith("injected by") for e in hami.evidence)


def test_nothing_limits_memory_only_where_no_layer_does() -> None:
    memory_unlimited, kai = metering.memory_unlimited, Layer("kai-fraction", ("env GPU_PORTION",))
    assert memory_unlimited((kai,)) == (kai,)
    assert memory_unlimited((kai, Layer("hami", ("preloads x",)))) == ()
    assert memory_unlimited((kai, Layer("nvidia-memory-limit", ("env x",)))) == ()
    # MPS without a pinned limit enforces none (issue 32); a pinned one is read as the limit (memory.py).
    mps = Layer("mps", ("env x",))
    assert memory_unlimited((mps,)) == (mps,) and memory_unlimited(()) == ()


def test_a_kai_fraction_says_it_has_no_quota() -> None:
    (kai,) = metering.metering_json((Layer("kai-fraction", ("env GPU_PORTION",)),))
    assert [c["code"] for c in kai["caveats"]] == ["no-memory-quota"] and kai["rows"] == {}


def test_the_pipeline_keeps_the_variables_the_new_layers_need(tmp_path) -> None:
    environ = {
        **KAI_FRACTION, "TF_ISOLATION_MODE": "soft", "LD_AUDIT": "/a.so", "CONTAINER_VGPU_MOUNT": "/v",
        "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/c", "LD_PRELOAD": TF_LIMITER, "UNRELATED": "1",
    }  # fmt: skip
    gathered = gather_evidence(str(tmp_path), environ, libcuda(REAL_DRIVER))
    assert set(gathered.environ) == set(environ) - {"LD_PRELOAD", "UNRELATED", "NVIDIA_VISIBLE_DEVICES"}
    assert [layer.name for layer in detect_layers(gathered)] == ["tensor-fusion", "kai-fraction", "ld-audit"]
    limited = gather_evidence(str(tmp_path), {**environ, **TOOLKIT_LIMIT}, libcuda(REAL_DRIVER))
    assert [layer.name for layer in detect_layers(limited)] == [
        "tensor-fusion", "nvidia-memory-limit", "ld-audit",
    ]  # fmt: skip
